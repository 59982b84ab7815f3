"""`tracehound health` against a real agent of this host, on its root-only
local channel: a lost GPU stays unfit past the XID window, an unprivileged
user who crowds the TCP port or binds it while the agent restarts decides
nothing, and the agent starts anyway. As root, with real kernel-log lines."""
import os
import socket
import subprocess
import sys
import time
import uuid

import pytest

from testbed.cli import tracehound_cmd
from tests.kernel.conftest import start_agent, stop_agent
from tests.kernel.test_gpu_kmsg import driver_form, write_kmsg

NOBODY = 65534


def unseen_bus_id() -> str:
    return f"{0x1000 + int(uuid.uuid4().hex[:4], 16) % 0xe000:04x}:42:00.0"


def health(instance: str, state: str, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run([*tracehound_cmd(), "health", "--check-only", "--instance", instance,
                           "--state-file", state, *extra],
                          capture_output=True, text=True, timeout=60)


def local(instance: str, path: str = "/health") -> str:
    from tracehound.clients.local_agent import read_local
    return read_local(f"/run/tracehound/{instance}.sock", path, 5.0).decode()


def test_a_gpu_fallen_off_the_bus_stays_unfit_past_the_xid_window(hook_mode, tmp_path):
    bus, instance = unseen_bus_id(), f"thtest-{uuid.uuid4().hex[:12]}"
    agent = start_agent(hook_mode, "--instance", instance, "--subsystems", "gpu",
                        "--gpu-bus-ids", bus, "--gpu-fatal-xid-window", "2")
    try:
        write_kmsg(f"NVRM: Xid ({driver_form(bus)}): 79, pid=4242, name=python, "
                   "GPU has fallen off the bus.")
        write_kmsg(f"NVRM: GPU {bus}: GPU has fallen off the bus.")
        state = str(tmp_path / "h.json")
        deadline = time.monotonic() + 30
        while 'xid="79"' not in local(instance):
            assert time.monotonic() < deadline, local(instance)
            time.sleep(0.1)
        out = health(instance, state)
        assert out.returncode == 1 and f"XID 79 GPU fell off the bus ({bus})" in out.stdout
        # the window passes: the agent no longer names the XID, the GPU is still lost
        while 'xid="79"' in local(instance):
            assert time.monotonic() < deadline + 30, local(instance)
            time.sleep(0.2)
        out = health(instance, state)
        assert out.returncode == 1, out.stdout + out.stderr
        assert out.stdout.strip() == (f"tracehound health: {os.uname().nodename.split('.')[0]}: "
                                      "unfit: GPU lost (fallen off the bus or not answering "
                                      f"NVML) ({bus})")
    finally:
        stop_agent(agent)


CROWD = """
import socket, sys, time
held = []
for _ in range(int(sys.argv[2])):
    s = socket.create_connection(("127.0.0.1", int(sys.argv[1])))
    held.append(s)
print("held", len(held), flush=True)
sys.stdin.read()
"""


def test_idle_connections_a_user_holds_on_the_port_never_make_the_agent_down(hook_mode,
                                                                              tmp_path):
    agent = start_agent(hook_mode, "--subsystems", "gpu")
    instance = agent.proc.args[agent.proc.args.index("--instance") + 1]
    port = int(agent.url.rsplit(":", 1)[1].split("/")[0])
    crowd = subprocess.Popen([sys.executable, "-c", CROWD, str(port), "200"], user=NOBODY,
                             group=NOBODY, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             text=True)
    try:
        assert crowd.stdout.readline().strip() == "held 200"
        state = str(tmp_path / "h.json")
        down = [out.stdout for out in (health(instance, state, "--timeout", "2")
                                       for _ in range(60)) if "agent not answering" in out.stdout]
        assert down == []
    finally:
        crowd.kill()
        crowd.wait()
        stop_agent(agent)


SQUAT = """
import http.server, sys
class Lie(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = ('tracehound_gpu_health{pci_bus_id="0000:e7:00.0",condition="recent_fatal_xid"} 1\\n'
                'tracehound_gpu_recent_fatal_xid_age_seconds{pci_bus_id="0000:e7:00.0",xid="79"} 1\\n'
                ).encode()
        self.send_response(200); self.send_header("Content-Length", str(len(body)))
        self.end_headers(); self.wfile.write(body)
    def log_message(self, *a): pass
server = http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), Lie)
print("serving", flush=True)
server.serve_forever()
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_users_server_on_the_port_during_a_restart_decides_nothing(hook_mode, tmp_path):
    port, instance = free_port(), f"thtest-{uuid.uuid4().hex[:12]}"
    args = ("--instance", instance, "--subsystems", "gpu", "--listen", f"127.0.0.1:{port}")
    state = str(tmp_path / "h.json")
    stop_agent(start_agent(hook_mode, *args))
    squat = subprocess.Popen([sys.executable, "-c", SQUAT, str(port)], user=NOBODY,
                             group=NOBODY, stdout=subprocess.PIPE, text=True)
    agent = None
    try:
        assert squat.stdout.readline().strip() == "serving"
        # the agent is down, a stranger answers on its port: health hears neither
        out = health(instance, state, "--timeout", "1")
        assert out.returncode == 0 and "XID" not in out.stdout
        assert "agent not answering: no agent socket at " in out.stdout
        # the agent starts anyway, says whose socket holds its port, and answers
        agent = start_agent(hook_mode, *args)
        out = health(instance, state)
        assert out.returncode == 0 and out.stdout.endswith(": fit\n"), out.stdout
        squat.kill()
        squat.wait()
        # the port is the agent's as soon as the stranger lets go
        deadline = time.monotonic() + 30
        while True:
            try:
                assert "tracehound_gpu_kmsg_up" in agent.scrape_text()
                break
            except OSError:
                assert time.monotonic() < deadline, "the agent never took its port"
                time.sleep(0.2)
    finally:
        squat.kill()
        squat.wait()
        if agent is not None:
            stop_agent(agent)
