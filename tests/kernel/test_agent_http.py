"""The real agent's HTTP side under hostile clients: held-open idle
connections and slowloris request lines never stop a scrape, and SIGTERM
still takes the clean exit path while they are held."""
import signal
import socket
import subprocess
import urllib.error
import urllib.parse
import urllib.request

import pytest

from tests.kernel.conftest import start_agent

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
