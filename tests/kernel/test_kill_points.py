"""SIGKILL at points of the agent's life, then a restart: nothing the killed
agent loaded stays in the kernel (each BPF program and map it held, by id,
is gone), and a new agent starts and counts.

The agent pins nothing, so the kernel frees its objects with its last file
descriptor; this checks that promise against the kernel's own view (bpftool)
rather than trusting it."""
import http.client
import os
import signal
import subprocess
import threading
import time
import urllib.request

import pytest

from tests.conftest import tracehound_cmd
from tests.kernel.conftest import run_in_cgroup, series, start_agent, stop_agent
from tracehound.bpf.held import held_ids

# seconds after the process holds its first BPF object; "scrape": during a /metrics read
POINTS = ("load+0", "load+0.02", "load+0.1", "load+0.3", "serving", "scrape")


def exists(kind: str, ident: int) -> bool:
    res = subprocess.run(["bpftool", kind, "show", "id", str(ident)], capture_output=True,
                         text=True)
    return res.returncode == 0 and not res.stderr.strip()


def holds_bpf(pid: int) -> bool:
    ids = held_ids(pid)
    return bool(ids["prog"] or ids["map"])


@pytest.mark.parametrize("point", POINTS)
def test_sigkill_leaves_nothing_and_a_restart_counts(hook_mode, point, cgroup_root, cgroup, tmpfs):
    if point in ("serving", "scrape"):
        agent = start_agent(hook_mode)
        proc = agent.proc
    else:
        proc = subprocess.Popen([*tracehound_cmd(), "run", "--listen", "127.0.0.1:0",
                                 "--hook-mode", hook_mode],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    held = {"prog": set(), "map": set()}
    try:
        if point.startswith("load+"):
            deadline = time.monotonic() + 30
            while not holds_bpf(proc.pid):
                assert proc.poll() is None and time.monotonic() < deadline
                time.sleep(0.002)
            end = time.monotonic() + float(point.split("+")[1])
            while time.monotonic() < end:       # what it holds up to the kill
                for kind, ids in held_ids(proc.pid).items():
                    held[kind] |= ids
        else:
            held = held_ids(proc.pid)
        if point == "scrape":
            reader = threading.Thread(target=lambda: _scrape_ignoring_errors(agent.url),
                                      daemon=True)
            reader.start()
            time.sleep(0.01)
        for kind, ids in held_ids(proc.pid).items():
            held[kind] |= ids
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert held["prog"] or held["map"], "the kill came before anything was loaded"
    deadline = time.monotonic() + 10            # the kernel frees them asynchronously
    left = held
    while time.monotonic() < deadline:
        left = {k: {i for i in ids if exists(k, i)} for k, ids in held.items()}
        if not any(left.values()):
            break
        time.sleep(0.1)
    assert not any(left.values()), f"still in the kernel after SIGKILL: {left}"

    again = start_agent(hook_mode)
    try:
        run_in_cgroup(cgroup_root, cgroup, [["write", os.path.join(tmpfs, "after-kill"), 8, 8]])
        assert series(again.scrape(), "tracehound_io_write_bytes_total", cgroup=cgroup) == 8
    finally:
        stop_agent(again)


def _scrape_ignoring_errors(url: str) -> None:
    try:
        urllib.request.urlopen(url, timeout=10).read()
    except (OSError, http.client.HTTPException):   # killed mid-answer: a cut-short body
        pass
