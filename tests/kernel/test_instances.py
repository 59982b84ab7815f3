"""Several agents on one host: named instances run side by side; a second
agent of a running instance (or of its state directory) is refused before it
loads anything, while the first keeps serving; doctor names the holder;
an agent pins under its own name only where an RDMA device gives it maps to
pin (on this host none: nothing under /sys/fs/bpf/tracehound while they run;
the VM's RDMA scenario has pins), and stopped agents leave no pin
directory."""
import os
import subprocess
import urllib.request
import uuid

from tests.conftest import tracehound_cmd
from tests.kernel.conftest import start_agent, stop_agent

PIN_ROOT = "/sys/fs/bpf/tracehound"
RDMA_DEVICES = "/sys/class/infiniband"
STATE_DIR = "/var/lib/tracehound"


def ready(agent) -> bool:
    url = agent.url.removesuffix("/metrics") + "/readyz"
    with urllib.request.urlopen(url, timeout=10) as r:
        return r.status == 200


def refused(hook_mode, *flags) -> str:
    """The one error line of an agent that must not start."""
    res = subprocess.run([*tracehound_cmd(), "run", "--listen", "127.0.0.1:0",
                          "--hook-mode", hook_mode, *flags],
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 1, res.stdout + res.stderr
    assert "serving metrics" not in res.stdout
    err = [x for x in res.stderr.splitlines() if x.strip()]
    assert len(err) == 1 and "Traceback" not in res.stderr, res.stderr
    return err[0]


def test_two_instances_run_side_by_side_and_a_second_agent_of_one_is_refused(hook_mode):
    pinned_before = os.path.lexists(PIN_ROOT)
    tag = uuid.uuid4().hex[:8]
    a_name, b_name = f"thtest-a-{tag}", f"thtest-b-{tag}"
    a = start_agent(hook_mode, "--instance", a_name)
    try:
        b = start_agent(hook_mode, "--instance", b_name)
        try:
            assert ready(a) and ready(b)
            # each its own state directory, the default instance's untouched
            b_state = os.path.join(STATE_DIR, "instances", b_name)
            assert os.path.isdir(os.path.join(STATE_DIR, "instances", a_name))
            assert os.path.isdir(b_state)
            # same instance, another port: refused on the lock, not on the port
            err = refused(hook_mode, "--instance", a_name)
            assert f"instance '{a_name}' is already running (pid {a.proc.pid};" in err
            assert "--instance NAME" in err
            # another instance, but b's state directory
            err = refused(hook_mode, "--instance", f"thtest-c-{tag}", "--state-dir", b_state)
            assert f"state directory {b_state} is in use by another agent (pid {b.proc.pid};" \
                in err
            # doctor names the holder, and takes nothing from it
            doctor = subprocess.run([*tracehound_cmd(), "doctor", "--instance", a_name],
                                    capture_output=True, text=True, timeout=120)
            assert f"{a_name}: held by the running agent, pid {a.proc.pid}" in doctor.stdout, \
                doctor.stdout + doctor.stderr
            # the first ones never noticed
            assert a.proc.poll() is None and ready(a) and ready(b)
            assert "tracehound_probe_info" in a.scrape_text()
            # each pins only under its own name, and only with an RDMA device
            # to pin for (the RDMA probe's maps): none on this host, the VM's
            # RDMA scenario has one
            pinned = {n: os.path.lexists(os.path.join(PIN_ROOT, n)) for n in (a_name, b_name)}
            if not (os.path.isdir(RDMA_DEVICES) and os.listdir(RDMA_DEVICES)):
                assert not any(pinned.values()), pinned
        finally:
            stop_agent(b)
    finally:
        stop_agent(a)
    assert a.proc.returncode == 0 and b.proc.returncode == 0
    for name in (a_name, b_name):
        assert not os.path.lexists(os.path.join(PIN_ROOT, name))
    if not pinned_before:
        assert not os.path.lexists(PIN_ROOT)
