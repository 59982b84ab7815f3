"""The real agent's HTTP side under hostile clients: held-open idle
connections and slowloris request lines never stop a scrape, and SIGTERM
still takes the clean exit path while they are held; with a web config it
serves only TLS, and only with the password."""
import base64
import re
import signal
import socket
import ssl
import subprocess
import urllib.error
import urllib.parse
import urllib.request
import uuid

import pytest

from tests import tls_files
from tests.conftest import tracehound_cmd
from tests.kernel.conftest import start_agent
from tests.unit.waiting import wait_until

HELD = 50


def status(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=10) as r:
            return r.status
    except urllib.error.HTTPError as exc:
        return exc.code


def test_scrapes_and_sigterm_while_clients_hold_connections(hook_mode):
    agent = start_agent(hook_mode)
    held = []
    try:
        u = urllib.parse.urlsplit(agent.url)
        for i in range(2 * HELD):
            s = socket.create_connection((u.hostname, u.port), timeout=5)
            if i % 2:
                s.sendall(b"GET /metr")        # a request line that never ends
            held.append(s)
        text = agent.scrape_text()
        assert "tracehound_probe_info" in text and "tracehound_collector_success" in text
        base = agent.url.removesuffix("/metrics")
        assert status(base + "/healthz") == 200
        assert status(base + "/readyz") == 200
        assert status(base + "/no-such-path") == 404

        agent.proc.send_signal(signal.SIGTERM)
        try:
            code = agent.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            agent.proc.kill()
            pytest.fail("agent did not exit within 20 s of SIGTERM while clients held "
                        "connections:\n" + agent.proc.communicate()[0])
        out = agent.proc.stdout.read()
        assert code == 0, out
        assert "probes detached, exiting" in out
    finally:
        for s in held:
            s.close()
        if agent.proc.poll() is None:
            agent.proc.kill()


def test_the_agent_serves_tls_and_a_password_from_its_web_config(hook_mode, tmp_path):
    """The real agent with --web.config.file: its URL is https, every path
    answers 401 without the password, and the probes' metrics with it."""
    tls = tls_files.make(tmp_path)
    config = tls.web_config("web.yml", {
        "tls_server_config": {"cert_file": "server.crt", "key_file": "server.key"},
        "basic_auth_users": {"prometheus": tls_files.HASH}})
    # an instance of its own: the default one is a real agent's on a node
    proc = subprocess.Popen([*tracehound_cmd(), "run", "--listen", "127.0.0.1:0",
                             "--instance", f"thtest-{uuid.uuid4().hex[:12]}",
                             "--hook-mode", hook_mode, "--web.config.file", config],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        lines = []
        for line in proc.stdout:
            lines.append(line)
            found = re.search(r"serving metrics on (\S+?/metrics)", line)
            if found:
                break
        assert found, "".join(lines)
        url = found.group(1)
        assert url.startswith("https://127.0.0.1:")
        base = url.removesuffix("/metrics")
        context = ssl.create_default_context(cafile=tls.ca)
        token = base64.b64encode(f"prometheus:{tls_files.PASSWORD}".encode()).decode()

        def answer(path, auth=True):
            request = urllib.request.Request(
                base + path, headers={"Authorization": f"Basic {token}"} if auth else {})
            try:
                with urllib.request.urlopen(request, timeout=10, context=context) as r:
                    return r.status, r.read()
            except urllib.error.HTTPError as exc:
                return exc.code, exc.read()
        wait_until(lambda: answer("/readyz")[0] == 200, "the agent to be ready")
        for path in ("/metrics", "/events", "/healthz", "/readyz"):
            assert answer(path, auth=False)[0] == 401, path
        status_code, body = answer("/metrics")
        assert status_code == 200 and b"tracehound_probe_info" in body
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=20) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
