"""The agent's local channel for real (exporter/local.py, clients/local_agent.py):
a Unix socket root alone can open, served by the agent's HTTP server, and
the client's checks of who serves it. As root (the agent and health are)."""
import os
import subprocess
import sys
import tempfile
import time

import pytest

from tracehound.clients.local_agent import LocalAgentError, read_local
from tracehound.errors import SetupError
from tracehound.exporter.local import LocalChannel
from tracehound.exporter.messages import Response, text_response

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root: the channel is root's")


def app(request):
    if request.path == "/slow":
        def trickle():
            for _ in range(100):
                yield b"# x\n"
                time.sleep(0.05)
        return Response(200, trickle())
    return text_response(200, f"ok {request.path}?{request.query}\n")


@pytest.fixture
def channel(tmp_path):
    run = tmp_path / "run"
    ch = LocalChannel(str(run / "a.sock"), app).start()
    yield ch
    ch.close()


def test_root_reads_the_channel_and_the_socket_is_roots_alone(channel):
    assert read_local(channel.path, "/health?x=1", 2.0) == b"ok /health?x=1\n"
    st = os.lstat(channel.path)
    assert st.st_uid == 0 and st.st_mode & 0o777 == 0o600
    assert os.listdir(os.path.dirname(channel.path)) == ["a.sock"]    # no temporary name left


def test_another_user_cannot_connect(channel):
    code = ("import socket, sys; s = socket.socket(socket.AF_UNIX)\n"
            "try:\n    s.connect(sys.argv[1]); s.sendall(b'GET /health HTTP/1.0\\r\\n\\r\\n')\n"
            "    print('answer', s.recv(100))\n"
            "except OSError as e:\n    print('refused', e.errno)\n")
    out = subprocess.run([sys.executable, "-c", code, channel.path], capture_output=True,
                         text=True, timeout=30, user=65534, group=65534)
    assert out.stdout.startswith("refused"), out.stdout + out.stderr


def test_a_user_who_reaches_the_socket_anyway_is_closed_unanswered():
    # were the mode ever opened, the server still checks its peer's uid as
    # the kernel recorded it at connect
    run = tempfile.mkdtemp(dir="/tmp")
    os.chmod(run, 0o755)
    channel = LocalChannel(os.path.join(run, "a.sock"), app).start()
    try:
        _connect_as_nobody(channel)
    finally:
        channel.close()
        os.rmdir(run)


def _connect_as_nobody(channel):
    code = ("import os, socket, sys; os.chmod(sys.argv[1], 0o666)\n"
            "os.setgid(65534); os.setuid(65534)\n"
            "s = socket.socket(socket.AF_UNIX); s.connect(sys.argv[1])\n"
            "try:\n    s.sendall(b'GET /health HTTP/1.0\\r\\n\\r\\n'); got = s.recv(100)\n"
            "except (ConnectionResetError, BrokenPipeError):\n    got = b''\n"
            "print(repr(got))\n")
    out = subprocess.run([sys.executable, "-c", code, channel.path], capture_output=True,
                         text=True, timeout=30)
    assert out.stdout.strip() == "b''", out.stdout + out.stderr


def test_the_client_refuses_a_socket_not_roots_or_a_directory_others_write(tmp_path, channel):
    os.chmod(channel.path, 0o666)
    with pytest.raises(LocalAgentError, match="is not the agent's"):
        read_local(channel.path, "/health", 1.0)
    os.chmod(channel.path, 0o600)
    os.chmod(os.path.dirname(channel.path), 0o777)
    with pytest.raises(LocalAgentError, match="writable by others"):
        read_local(channel.path, "/health", 1.0)
    os.chmod(os.path.dirname(channel.path), 0o755)
    with pytest.raises(LocalAgentError, match=r"no agent socket at .*none\.sock \(agent not running\)"):
        read_local(str(tmp_path / "run" / "none.sock"), "/health", 1.0)


def test_an_answer_that_trickles_is_not_waited_for(channel):
    start = time.monotonic()
    with pytest.raises(LocalAgentError, match="no whole answer .* within 0.5 s"):
        read_local(channel.path, "/slow", 0.5)
    assert time.monotonic() - start < 3      # bounded by the timeout, not the 5 s answer


def test_the_agent_refuses_a_directory_others_may_write_and_a_planted_file(tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir(mode=0o777)
    os.chmod(shared, 0o1777)
    with pytest.raises(SetupError, match="writable by others"):
        LocalChannel(str(shared / "a.sock"), app).start()
    own = tmp_path / "own"
    own.mkdir()
    (own / "a.sock").write_text("not a socket")
    with pytest.raises(SetupError, match="something other than a socket"):
        LocalChannel(str(own / "a.sock"), app).start()
    assert (own / "a.sock").read_text() == "not a socket"


def test_a_dead_agents_socket_is_replaced_and_close_removes_only_its_own(tmp_path):
    path = str(tmp_path / "a.sock")
    first = LocalChannel(path, app).start()
    second = LocalChannel(path, app).start()      # the first died without closing
    first.close()
    assert read_local(path, "/x", 2.0) == b"ok /x?\n"
    second.close()
    assert not os.path.exists(path)


def test_clients_read_a_unix_url_and_default_to_the_channel_as_root(channel, monkeypatch):
    import urllib.error
    from tracehound.clients import agent_client
    assert agent_client.split_local(f"unix:{channel.path}/events?kind=xid") == \
        (channel.path, "/events?kind=xid")
    with agent_client.open_agent(f"unix:{channel.path}/metrics", 2.0) as r:
        assert r.read() == b"ok /metrics?\n"
    with pytest.raises(urllib.error.URLError, match="agent not running"):
        agent_client.open_agent(f"unix:{channel.path}.gone.sock/metrics", 1.0)
    with pytest.raises(ValueError, match="names a socket ending in .sock"):
        agent_client.split_local("unix:/run/tracehound/x")
    # no URL given, none in the environment: the channel where it is there
    monkeypatch.setattr(agent_client, "socket_path", lambda instance: channel.path)
    assert agent_client.metrics_url(None, {}) == f"unix:{channel.path}/metrics"
    monkeypatch.setattr(agent_client, "socket_path", lambda instance: channel.path + "x.sock")
    assert agent_client.metrics_url(None, {}) == "http://127.0.0.1:9560/metrics"
    assert agent_client.metrics_url(None, {"TRACEHOUND_METRICS_URL": "http://h:1/metrics"}) \
        == "http://h:1/metrics"
