"""The README's five minutes on one node, run as written: its shell block
is taken from the README itself and run by bash, stopping at the first
command that fails, with this environment's tracehound first on PATH."""
import os
import re
import shutil
import signal
import subprocess
import time

import pytest

from tests.conftest import ROOT, tracehound_cmd

MARKER = "<!-- run as written by tests/kernel/test_readme.py -->"
REPORT = os.path.join(ROOT, "first-report")
AGENT_LOG = "/tmp/tracehound.log"


def walkthrough() -> str:
    with open(os.path.join(ROOT, "README.md")) as f:
        text = f.read()
    assert MARKER in text, "the README's walkthrough lost its marker"
    block = re.search(r"```sh\n(.*?)```", text[text.index(MARKER):], re.S)
    return block.group(1)


def stop_session(proc: subprocess.Popen) -> None:
    """SIGTERM to everything the block left running (the agent detaches its
    probes on it), then wait until none is left: the next test may start an
    agent of the same default instance."""
    try:
        os.killpg(proc.pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    proc.wait(timeout=30)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            os.killpg(proc.pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.1)
    os.killpg(proc.pid, signal.SIGKILL)
    pytest.fail("the walkthrough's agent or job was still running 60 s after SIGTERM")


@pytest.fixture
def leftovers():
    yield
    shutil.rmtree(REPORT, ignore_errors=True)
    for path in (AGENT_LOG, "/var/tmp/tracehound-first-job"):
        if os.path.exists(path):
            os.unlink(path)


def test_the_readmes_first_five_minutes_work_as_written(leftovers):
    bin_dir = os.path.dirname(tracehound_cmd()[0])
    env = dict(os.environ, PATH=f"{bin_dir}:{os.environ['PATH']}")
    env.pop("TRACEHOUND_METRICS_URL", None)
    # a session of its own: the agent and the job it started in the
    # background go with it, whatever the block did
    proc = subprocess.Popen(["bash", "-euo", "pipefail", "-c", walkthrough()], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=300)
    finally:
        stop_session(proc)
    log = open(AGENT_LOG).read() if os.path.exists(AGENT_LOG) else "(no agent log)"
    assert proc.returncode == 0, f"{out}\n--- agent log ---\n{log}"
    # step 1: the agent said where it serves, and doctor which hook each probe uses
    assert "serving metrics on http://127.0.0.1:9560/metrics" in log
    assert re.search(r"io\.write\s+-> (fentry|kprobe|tracepoint)", out), out
    # step 3: the writes with fsync on /var/tmp's file system, and the stream's bytes
    mount = subprocess.run(["findmnt", "-no", "TARGET", "--target", "/var/tmp"],
                           capture_output=True, text=True, check=True).stdout.strip()
    table = [ln for ln in out.splitlines() if f" {mount} " in f" {ln} "]
    assert table, out
    assert re.search(r'^tracehound_net_tcp_socket_bytes\{.*direction="sent".*\} [1-9]', out, re.M), out
    # step 4: the fault was detected and rolled back, and the report is there
    assert "detected" in out and "rolled back" in out, out
    assert {os.path.splitext(f)[1] for f in os.listdir(REPORT)} >= {".md", ".json"}
