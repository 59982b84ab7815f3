"""docs/deployment.md's TLS recipe, run as written (with this checkout for
/opt/tracehound): the certificate, the password and its bcrypt hash it makes
serve a real exporter, which the node's own clients then read at
127.0.0.1, and at an address the certificate does not name with
TRACEHOUND_SERVER_NAME."""
import re
import subprocess
import sys
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from tracehound.exporter.server import Exporter
from tracehound.exporter.webconfig import load
from tracehound.top.source import MetricsSource, SourceError

REPO = Path(__file__).resolve().parents[2]


def recipe() -> str:
    text = (REPO / "docs" / "deployment.md").read_text()
    blocks = re.findall(r"```sh\n(.*?)```", text, re.S)
    (block,) = [b for b in blocks if "# a CA, and the agents' certificate" in b]
    return block


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    here = tmp_path_factory.mktemp("recipe")
    script = (recipe().replace("/opt/tracehound/.venv/bin/python", sys.executable)
              .replace("deploy/web-config/", f"{REPO}/deploy/web-config/"))
    out = subprocess.run(["bash", "-euo", "pipefail", "-c", script], cwd=here,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return here


@pytest.fixture
def exporter(made):
    e = Exporter(CollectorRegistry(), "127.0.0.1:0", web_config=load(str(made / "web-config.yml")))
    e.start()
    e.set_ready(True)
    yield e
    e.stop()


@pytest.fixture
def client_env(made, monkeypatch):
    for name in ("CERT_FILE", "KEY_FILE", "SERVER_NAME"):
        monkeypatch.delenv(f"TRACEHOUND_{name}", raising=False)
    monkeypatch.setenv("TRACEHOUND_CA_FILE", str(made / "ca.crt"))
    monkeypatch.setenv("TRACEHOUND_USERNAME", "prometheus")
    monkeypatch.setenv("TRACEHOUND_PASSWORD_FILE", str(made / "password"))
    return monkeypatch


def test_the_recipes_certificate_and_hash_serve_the_nodes_own_clients(exporter, client_env):
    assert exporter.url.startswith("https://127.0.0.1:")
    assert MetricsSource(exporter.url).scrape()
    assert MetricsSource(exporter.url.replace("127.0.0.1", "localhost")).scrape()


def test_the_server_name_is_the_name_checked_whatever_host_the_url_names(exporter,
                                                                         client_env):
    # a certificate named `tracehound` alone is read at 127.0.0.1 this way;
    # a name it does not carry is refused, so the override is what is checked
    client_env.setenv("TRACEHOUND_SERVER_NAME", "not-the-agent")
    with pytest.raises(SourceError, match="certificate|hostname|match"):
        MetricsSource(exporter.url).scrape()
    client_env.setenv("TRACEHOUND_SERVER_NAME", "tracehound")
    assert MetricsSource(exporter.url).scrape()
