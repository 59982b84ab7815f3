"""The first SIGINT or SIGTERM at any moment of the agent's start-up leads to
its clean exit (probes detached), never to an exception swallowed by a libbpf
callback, a run that goes on, or a kill in the middle of a load.

Each case waits for a moment visible from outside, then a little longer, so
the signal lands in a different phase: `before-load` as soon as the agent has
taken both signals (SIGTERM enters SigCgt in /proc/PID/status: the preflight
checks), `load+D` D seconds after the process holds its first BPF object
(loading, attaching, starting the exporter, serving)."""
import signal
import subprocess
import time

import pytest

from tests.conftest import tracehound_cmd
from tracehound.bpf.held import held_ids

MOMENTS = ("before-load", "load+0", "load+0.05", "load+0.15", "load+0.3", "load+0.6")


def takes_sigterm(pid: int) -> bool:
    with open(f"/proc/{pid}/status") as f:
        caught = next(int(line.split()[1], 16) for line in f if line.startswith("SigCgt:"))
    return bool(caught & (1 << (signal.SIGTERM - 1)))


def holds_bpf(pid: int) -> bool:
    """A BPF map, program or link (not a file with bpf in its path: the
    interpreter opens tracehound/bpf/*.py while importing)."""
    return any(held_ids(pid).values())


def wait_for(proc, moment: str) -> None:
    ready = takes_sigterm if moment == "before-load" else holds_bpf
    deadline = time.monotonic() + 30
    while not ready(proc.pid):
        assert proc.poll() is None, "the agent ended on its own"
        assert time.monotonic() < deadline, f"never reached {moment}"
        time.sleep(0.002)
    if moment != "before-load":
        time.sleep(float(moment.split("+")[1]))


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
@pytest.mark.parametrize("moment", MOMENTS)
def test_first_signal_during_start_up_exits_cleanly(hook_mode, signum, moment):
    proc = subprocess.Popen([*tracehound_cmd(), "run", "--listen", "127.0.0.1:0",
                             "--hook-mode", hook_mode],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        wait_for(proc, moment)
        proc.send_signal(signum)
        out, _ = proc.communicate(timeout=20)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, _ = proc.communicate()
        pytest.fail(f"still running 20 s after {signum.name}:\n{out}")
    except BaseException:
        proc.kill()
        proc.communicate()
        raise
    assert proc.returncode == 0, out
    for bad in ("Traceback", "Exception ignored", "KeyboardInterrupt"):
        assert bad not in out, out
    assert out.strip().splitlines()[-1] in ("tracehound: probes detached, exiting",
                                            "tracehound: stopped before anything was loaded"), out
