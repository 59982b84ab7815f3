"""Files an operator names are read as regular files only: a FIFO at
--web.config.file, at a certificate it names or at the password file, or a
device such as /dev/zero, is refused at once with the cause; before, the
agent's start-up hung on the FIFO (and would have read /dev/zero without
end)."""
import os
import subprocess
import sys

import pytest

from tracehound.clients.agent_client import auth_header
from tracehound.exporter.webconfig import WebConfigError, load
from tracehound.regular_file import MAX_CONFIG_BYTES, NotRegularFile, read_regular


@pytest.fixture
def fifo(tmp_path):
    path = tmp_path / "planted"
    os.mkfifo(path)
    return str(path)


def test_the_agent_refuses_a_fifo_as_its_web_config_and_does_not_start(fifo):
    done = subprocess.run([sys.executable, "-m", "tracehound", "run", "--listen",
                           "127.0.0.1:0", "--web.config.file", fifo],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2, done.stderr[-2000:]
    assert f"--web.config.file {fifo}: cannot read it: {fifo} is not a regular file" \
        in done.stderr


def test_a_device_as_the_web_config_is_refused():
    with pytest.raises(WebConfigError, match="/dev/zero is not a regular file"):
        load("/dev/zero")


def test_a_fifo_named_as_the_certificate_is_refused(fifo, tmp_path):
    config = tmp_path / "web.yml"
    config.write_text(f"tls_server_config:\n  cert_file: {fifo}\n  key_file: {fifo}\n")
    with pytest.raises(WebConfigError, match="is not a regular file"):
        load(str(config))


def test_a_fifo_as_the_password_file_is_refused(fifo):
    with pytest.raises(NotRegularFile, match="is not a regular file"):
        auth_header({"TRACEHOUND_USERNAME": "prometheus", "TRACEHOUND_PASSWORD_FILE": fifo})


def test_a_regular_file_is_read_whole_up_to_the_bound(tmp_path):
    path = tmp_path / "config"
    path.write_bytes(b"a: 1\n")
    assert read_regular(str(path)) == b"a: 1\n"
    path.write_bytes(b"x" * (MAX_CONFIG_BYTES + 1))
    with pytest.raises(NotRegularFile, match="more than"):
        read_regular(str(path))
