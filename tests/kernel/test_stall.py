"""The stall rule end to end on real processes, real I/O and a real agent:
a job that wrote and then only sleeps is stalled (no_progress), and resumes
when it writes again; a job that keeps writing, and one that only computes,
are not. Every watched cgroup is judged by the same agent at once."""
import json
import os
import signal
import subprocess
import time
import urllib.request
import uuid

import pytest

from tests.kernel.conftest import remove_cgroup, start_agent, stop_agent

STALL_AFTER_S = 4
# writes for `busy` seconds, sleeps `idle`, then writes again, until killed
JOB = """
import os, sys, time
busy, idle, path = float(sys.argv[1]), float(sys.argv[2]), sys.argv[3]
def write(seconds):
    end = time.monotonic() + seconds
    with open(path, "wb") as f:
        while time.monotonic() < end:
            f.write(b"x" * 65536); f.flush(); time.sleep(0.05)
write(busy)
time.sleep(idle)
write(3600)
"""
SPIN = "while True: pass"


def events(url: str, since: int = 0) -> dict:
    with urllib.request.urlopen(url.removesuffix("/metrics") + f"/events?since={since}",
                                timeout=10) as r:
        return json.load(r)


def wait_for(url: str, since: int, pred, timeout: float) -> list[dict]:
    deadline = time.monotonic() + timeout
    got: list[dict] = []
    while time.monotonic() < deadline:
        page = events(url, since)
        got += page["events"]
        since = page["next"]
        if any(pred(e) for e in got):
            break
        time.sleep(0.5)
    return got


@pytest.fixture
def jobs(cgroup_root, tmp_path):
    tag = uuid.uuid4().hex[:6]
    made, procs = [], []

    def start(name: str, argv: list[str]) -> str:
        rel = f"/thtest/stall-{tag}-{name}"
        os.makedirs(cgroup_root + rel)
        made.append(cgroup_root + rel)
        procs.append(subprocess.Popen(["sh", "-c", 'echo $$ > "$0" && exec "$@"',
                                       cgroup_root + rel + "/cgroup.procs", *argv],
                                      cwd=tmp_path))
        return rel
    yield start, tag
    for p in procs:
        p.send_signal(signal.SIGKILL)
        p.wait()
    for path in made:
        remove_cgroup(path)


def test_a_job_that_wrote_and_then_only_sleeps_is_stalled_and_the_others_are_not(
        hook_mode, jobs, tmp_path):
    start, tag = jobs
    agent = start_agent(hook_mode, "--stall-after", str(STALL_AFTER_S),
                        "--stall-cgroups", f"/thtest/stall-{tag}-.*")
    try:
        since = events(agent.url)["next"]
        py = "python3"
        # writes 2 s, sleeps 8 s (past --stall-after), then writes again
        waiting = start("waiting", [py, "-c", JOB, "2", "8", str(tmp_path / "w")])
        steady = start("steady", [py, "-c", JOB, "3600", "0", str(tmp_path / "s")])
        spinning = start("spinning", [py, "-c", SPIN])
        got = wait_for(agent.url, since, lambda e: e.get("kind") == "job_resumed", 30)
        mine = [e for e in got if e.get("event") == "job_anomaly"]
        assert [(e["kind"], e["cgroup"], e["reason"]) for e in mine] == [
            ("job_stalled", waiting, "no_progress"), ("job_resumed", waiting, "no_progress")], got
        stalled = mine[0]
        assert stalled["processes"] == 1 and stalled["stalled_for_s"] >= STALL_AFTER_S
        assert "io" in stalled["signals"] and stalled["cpu_seconds"] < 1.0   # it slept
        # the steady writer and the computing job were watched all along
        metrics = agent.scrape()
        watched = sum(v for (n, _), v in metrics.items()
                      if n == "tracehound_stall_watched_workloads")
        assert watched == 3, (steady, spinning)
    finally:
        stop_agent(agent)


def test_a_backtracking_pattern_against_a_users_path_neither_freezes_the_agent_nor_sigterm(
        hook_mode, jobs, cgroup_root):
    """--stall-cgroups `(a|aa)*c` takes Python's engine about 2^200 steps on a
    cgroup named with 200 a's, holding the interpreter: the agent froze,
    scrapes and SIGTERM included. The path is walked (a process lives there)
    before its sibling `w`, which the pattern watches."""
    start, tag = jobs
    start("a" * 200, ["sleep", "600"])
    start("w", ["sleep", "600"])
    agent = start_agent(hook_mode, "--stall-cgroups",
                        f"/thtest/stall-{tag}-((a|aa)*c|w)")
    try:
        deadline, watched = time.monotonic() + 60, 0
        while watched != 1 and time.monotonic() < deadline:
            watched = sum(v for (n, _), v in agent.scrape().items()
                          if n == "tracehound_stall_watched_workloads")
            time.sleep(0.5)
        assert watched == 1
    finally:
        stop_agent(agent)       # fails the test if SIGTERM is ignored for 20 s
