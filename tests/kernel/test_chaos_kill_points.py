"""A `tracehound chaos run` SIGKILLed at every step of its journal, then
`tracehound chaos recover`: each time the kernel's state must be exactly
what it was before the run, and a second recover must find nothing to do.

Three kinds of kill point, on one experiment (a helper writer started by the
method and stopped by a declared rollback, io.throttle, proc.stop, net.loss):
- at each journal line exactly: strace kills the run as it fsyncs line k
  (the line is written and recover reads it; the step it announces has not
  begun);
- within milliseconds of line k appearing: in the middle of the step it
  announces (applying a fault after its `fault` line, the next rollback
  after a `rolled-back` line, the experiment's own rollback after the last);
- at seeded random moments of the run."""
import glob
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
import uuid

import pytest

from tests.conftest import tracehound_cmd
from tests.kernel.conftest import require_tools
from tests.kernel.test_chaos_examples import BLKIO, blkio_path, in_netns, read, state_of
from tracehound.chaos import scaffold
from tracehound.chaos.faults.targets import cgroup2_root

BLKIO_CHAOS = f"{BLKIO}/tracehound-chaos"
RANDOM_KILLS = 6

EXPERIMENT = """
title: killed at every step
description: SIGKILL after each journal line; recover must undo everything
method:
  - type: action
    name: start-helper
    provider: {{type: python, module: tracehound.chaos.scaffold, func: start_writer,
               arguments: {{cgroup: "{helper_cgroup}", directory: "{data}", block_size: 4096,
                            direct: false, interval: 0.05}}}}
    pauses: {{after: 0.2}}
  - type: action
    name: throttle
    provider: {{type: tracehound, fault: io.throttle, arguments: {{cgroup: "{writer_cgroup}",
               device: /var/tmp, wbps: 1048576}}}}
    pauses: {{after: 0.2}}
  - type: action
    name: stop
    provider: {{type: tracehound, fault: proc.stop, arguments: {{pid: {sleeper}}}}}
    pauses: {{after: 0.2}}
  - type: action
    name: loss
    provider: {{type: tracehound, fault: net.loss, arguments: {{netns: {ns_a},
               interface: {if_a}, percent: 30}}}}
    pauses: {{after: 0.3}}
rollbacks:
  - type: action
    name: stop-helper
    provider: {{type: python, module: tracehound.chaos.scaffold, func: stop_workload,
               arguments: {{cgroup: "{helper_cgroup}", directory: "{data}"}}}}
"""


def helper_pids(name: str) -> list[int]:
    """Processes whose command line names the helper's cgroup: the writer
    (or the shell starting it), wherever it ended up."""
    out = []
    for d in os.listdir("/proc"):
        if not d.isdigit() or int(d) == os.getpid():
            continue
        try:
            with open(f"/proc/{d}/cmdline", "rb") as f:
                if name.encode() in f.read():
                    out.append(int(d))
        except OSError:
            continue
    return sorted(out)


def netfault_programs() -> int:
    """net.loss's classifiers loaded in the kernel (a leaked one stays)."""
    require_tools("bpftool")
    out = subprocess.run(["bpftool", "-j", "prog", "show"], capture_output=True, text=True)
    return sum(1 for p in json.loads(out.stdout or "[]") if p.get("name") == "netfault")


def run_ids(journal: str) -> list[str]:
    return [os.path.basename(p)[:-len(".jsonl")] for p in glob.glob(f"{journal}/*.jsonl")]


def snapshot(s: dict, journal: str | None = None) -> dict:
    """Everything the run touches, as the kernel reports it."""
    ids = run_ids(journal) if journal else []
    throttles = {}
    if os.path.isdir(BLKIO_CHAOS):
        for d in sorted(os.listdir(BLKIO_CHAOS)):
            if any(d.startswith(i) for i in ids):    # this run's v1 throttle cgroups
                throttles[d] = (read(f"{BLKIO_CHAOS}/{d}/blkio.throttle.write_bps_device"),
                                read(f"{BLKIO_CHAOS}/{d}/cgroup.procs"))
    return {
        "writer blkio cgroup": blkio_path(s["writer"]),
        "writer io.max": read(f"{cgroup2_root()}{s['writer_cgroup']}/io.max"),
        "io controllers enabled": [read(f"{cgroup2_root()}{d}/cgroup.subtree_control")
                                   for d in ("", "/thtest")],
        "run's blkio cgroups": throttles,
        "blkio tracehound-chaos exists": os.path.isdir(BLKIO_CHAOS),
        "sleeper state": state_of(s["sleeper"]),
        "qdiscs": in_netns(s["ns_a"], "tc", "qdisc", "show", "dev", s["if_a"]),
        "egress filters": in_netns(s["ns_a"], "tc", "filter", "show", "dev", s["if_a"],
                                   "egress"),
        "netfault programs": netfault_programs(),
        "helper cgroup exists": os.path.isdir(f"{cgroup2_root()}{s['helper_cgroup']}"),
        "helper files": sorted(os.listdir(s["data"])),
        "helper processes": helper_pids(s["helper_name"]),
    }


def diff(a: dict, b: dict) -> dict:
    return {k: (a[k], b[k]) for k in a if a[k] != b[k]}


def journal_lines(journal: str) -> list[bytes]:
    for path in glob.glob(f"{journal}/*.jsonl"):
        with open(path, "rb") as f:
            return f.read().split(b"\n")[:-1]   # complete lines only
    return []


def describe(records: list[dict], k: int) -> str:
    """'fault (stop)' for line k: the event, and the action it concerns."""
    r = records[k - 1]
    actions = {x["id"]: x["action"] for x in records if x.get("event") == "fault"}
    action = actions.get(r.get("id"))
    return r["event"] + (f" ({action})" if action else "")


def recover(journal: str) -> subprocess.CompletedProcess:
    return subprocess.run(tracehound_cmd() + ["chaos", "recover", "--journal", journal],
                          capture_output=True, text=True, timeout=60)


@pytest.fixture(scope="module")
def rig():
    tag = uuid.uuid4().hex[:5]
    tmp = tempfile.mkdtemp(prefix="thtest-chaos-kp-")
    s = {"writer_cgroup": f"/thtest/kp-{tag}-w", "helper_name": f"kp-{tag}-helper",
         "ns_a": f"thp{tag}a", "ns_b": f"thp{tag}b", "if_a": f"thp{tag}0",
         "if_b": f"thp{tag}1", "data": f"{tmp}/data", "tmp": tmp}
    s["helper_cgroup"] = f"/thtest/{s['helper_name']}"
    os.makedirs(s["data"])
    os.makedirs(f"{tmp}/writer")
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    try:
        s["sleeper"] = sleeper.pid
        # asleep once its interpreter is up: on a loaded machine that takes a
        # while, and a snapshot before it would see it running
        deadline = time.monotonic() + 60
        while state_of(sleeper.pid) != "S":
            assert time.monotonic() < deadline, f"the sleeper never slept: {state_of(sleeper.pid)}"
            time.sleep(0.05)
        s["writer"] = scaffold.start_writer(s["writer_cgroup"], f"{tmp}/writer",
                                            block_size=4096, direct=False,
                                            interval=0.05)["pid"]
        scaffold.make_netns_pair(s["ns_a"], s["ns_b"], s["if_a"], s["if_b"],
                                 "10.206.0.1/24", "10.206.0.2/24")
        path = f"{tmp}/experiment.yaml"
        with open(path, "w") as f:
            f.write(EXPERIMENT.format(**s))
        s["experiment"] = path
        yield s
    finally:
        for journal in glob.glob(f"{tmp}/journal-*"):
            recover(journal)
        sleeper.kill()
        sleeper.wait()
        scaffold.stop_workload(s["helper_cgroup"], s["data"])
        scaffold.stop_workload(s["writer_cgroup"], f"{tmp}/writer")
        scaffold.delete_netns([s["ns_a"], s["ns_b"]])
        subprocess.run(["rm", "-rf", tmp])


def start_run(s: dict, name: str, wrapper: tuple[str, ...] = ()) -> tuple[subprocess.Popen, str]:
    journal = f"{s['tmp']}/journal-{name}"
    log = open(f"{s['tmp']}/run-{name}.log", "w")
    proc = subprocess.Popen([*wrapper, *tracehound_cmd(), "chaos", "run", s["experiment"],
                             "--yes", "--allow-code", "--journal", journal, "--report",
                             f"{s['tmp']}/report-{name}", "--no-plot"],
                            stdout=log, stderr=subprocess.STDOUT)
    log.close()
    return proc, journal


def run_log(s: dict, name: str) -> str:
    return read(f"{s['tmp']}/run-{name}.log") or ""


def settle(s: dict, journal: str, before: dict, seconds: float = 30.0) -> tuple[dict, int]:
    """(the snapshot once it equals `before` or after `seconds`, how many
    snapshots differed first): a process SIGKILLed by a rollback is gone
    only once the kernel has reaped it."""
    deadline = time.monotonic() + seconds
    differed = 0
    while True:
        now = snapshot(s, journal)
        if now == before or time.monotonic() > deadline:
            return now, differed
        differed += 1
        time.sleep(0.05)


@pytest.fixture(scope="module")
def clean(rig):
    """The experiment run to its end once, watched: the state before it,
    the journal it wrote, how long it took, the distinct states seen."""
    s = rig
    before = snapshot(s)
    assert before["helper processes"] == [] and not before["helper cgroup exists"]
    assert before["sleeper state"] == "S"
    proc, journal = start_run(s, "clean")
    t0 = time.monotonic()
    seen = [before]
    while proc.poll() is None:
        now = snapshot(s, journal)
        if now != seen[-1]:
            seen.append(now)
        assert time.monotonic() - t0 < 60, "the clean run did not end"
        time.sleep(0.02)
    duration = time.monotonic() - t0
    assert proc.returncode == 0, run_log(s, "clean")
    records = [json.loads(ln) for ln in journal_lines(journal)]
    events = [describe(records, k) for k in range(1, len(records) + 1)]
    gaps = [records[k]["time"] - records[k - 1]["time"] for k in range(1, len(records))]
    print(f"\nclean run: {duration:.2f} s, {len(records)} journal lines: {events}\n"
          "seconds from each line to the next: " + ", ".join(f"{g:.3f}" for g in gaps))
    return {"before": before, "journal": journal, "records": records, "events": events,
            "duration": duration, "seen": seen}


def kill_and_recover(s: dict, before: dict, name: str, when=None,
                     wrapper: tuple[str, ...] = ()) -> tuple[list[dict], dict]:
    """Start a run, SIGKILL it once when(journal, t) is true (or let the
    wrapper kill it), recover; check the kernel's state and that a second
    recover is a no-op. Returns the journal's records as the kill left
    them and what the kill had left changed."""
    proc, journal = start_run(s, name, wrapper)
    t0 = time.monotonic()
    while when is not None and not when(journal, time.monotonic() - t0):
        assert proc.poll() is None, f"{name}: the run ended first\n{run_log(s, name)}"
        assert time.monotonic() - t0 < 60, f"{name}: never reached its kill point"
        time.sleep(0.002)
    if when is not None:
        proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=60)
    assert proc.returncode == -signal.SIGKILL, f"{name}: {proc.returncode}\n{run_log(s, name)}"
    records = [json.loads(ln) for ln in journal_lines(journal)]
    left = diff(before, snapshot(s, journal))
    out = recover(journal)
    what = f"{name}: killed after {len(records)} journal line(s), the last " + (
        describe(records, len(records)) if records else "none")
    assert out.returncode == 0, f"{what}\n{out.stdout}{out.stderr}"
    after, differed = settle(s, journal, before)
    assert after == before, (f"{what}: recover left {diff(before, after)}\n"
                             f"the kill had left {left}\n{out.stdout}{out.stderr}")
    if differed:
        print(f"{what}: the state came back {differed} snapshot(s) after recover")
    again = recover(journal)
    assert again.returncode == 0 and "nothing to recover" in again.stdout, (
        f"{what}: second recover\n{again.stdout}{again.stderr}")
    return records, left


def after_start(seconds: float):
    """A kill condition: `seconds` after the run-start line appeared."""
    seen = []

    def when(journal, t):
        if not seen and journal_lines(journal):
            seen.append(t)
        return bool(seen) and t - seen[0] >= seconds
    return when


# what each fault of the experiment changes (io.throttle: v1 blkio or v2 io.max)
FAULT_KEYS = {"throttle": ("writer blkio cgroup", "writer io.max"),
              "stop": ("sleeper state",), "loss": ("egress filters",)}


def test_a_clean_run_leaves_nothing_to_recover(rig, clean):
    s, before = rig, clean["before"]
    assert clean["records"][-1]["event"] == "run-end"
    assert clean["records"][-1]["status"] == "completed"
    # every fault, and the helper, really happened
    for key in ("writer blkio cgroup", "sleeper state", "qdiscs", "egress filters",
                "netfault programs", "helper cgroup exists", "helper files",
                "helper processes"):
        assert any(x[key] != before[key] for x in clean["seen"]), key
    assert any(x["sleeper state"] == "T" for x in clean["seen"])
    assert settle(s, clean["journal"], before)[0] == before
    out = recover(clean["journal"])
    assert out.returncode == 0 and "nothing to recover" in out.stdout, out.stdout + out.stderr


def test_sigkill_at_each_journal_write_then_recover(rig, clean):
    """Exactly at line k: strace kills the run as it fsyncs line k (written,
    so recover reads it; the step it announces not begun). The run's first
    fsync is the journal directory's, so line k's is fsync k + 1 (checked:
    the journal then holds exactly k lines)."""
    require_tools("strace")         # to kill the run at an exact system call
    s, before, records = rig, clean["before"], clean["records"]
    n = len(records)
    for k in range(0, n + 1):       # 0: the journal file created and locked, still empty
        got, left = kill_and_recover(
            s, before, f"fsync-{k}",
            wrapper=("strace", "-o", "/dev/null", "-e", "trace=fsync", "-e",
                     f"inject=fsync:signal=KILL:when={k + 1}"))
        point = f"line {k} ({clean['events'][k - 1]})" if k else "the journal's creation"
        assert [r["event"] for r in got] == [r["event"] for r in records[:k]], point
        # the journal's promise: a fault's line is written before it is applied,
        # `applied` after, `rolled-back` after its rollback
        events = [(r["event"], r.get("id")) for r in got]
        for r in got:
            if r["event"] != "fault":
                continue
            applied = ("applied", r["id"]) in events and ("rolled-back", r["id"]) not in events
            changed = any(key in left for key in FAULT_KEYS[r["action"]])
            assert changed == applied, (point, r["action"], left)
        helper = (any(e == "fault" for e, _ in events)
                  and not any(e == "rollbacks-run" for e, _ in events))
        assert ("helper processes" in left) == helper, (point, left)
        print(f"killed at {point}: the kill left changed {sorted(left)}")


def test_sigkill_just_after_each_journal_line_then_recover(rig, clean):
    """Within milliseconds of line k appearing: in the middle of the step
    it announces (or of the pause after it)."""
    s, before, records = rig, clean["before"], clean["records"]
    n = len(records)
    left_any = set()
    for k in range(1, n):
        got, left = kill_and_recover(
            s, before, f"line-{k}",
            lambda journal, _t, k=k: len(journal_lines(journal)) >= k)
        assert [r["event"] for r in got[:k]] == [r["event"] for r in records[:k]]
        left_any |= set(left)
        print(f"killed just after line {k} ({clean['events'][k - 1]}), with {len(got)} "
              f"line(s) written: the kill left changed {sorted(left)}")
    # the kills landed mid-run: each fault and the helper were left by some kill
    for keys in (*FAULT_KEYS.values(), ("helper cgroup exists",), ("helper processes",)):
        assert left_any & set(keys), keys


def test_sigkill_at_random_moments_then_recover(rig, clean):
    s, before, records = rig, clean["before"], clean["records"]
    span = records[-1]["time"] - records[0]["time"]
    rng = random.Random(20240611)
    for i in range(RANDOM_KILLS):
        at = rng.uniform(0, 0.9 * span)     # a run not watched may be a little faster
        got, left = kill_and_recover(s, before, f"random-{i}", after_start(at))
        print(f"killed {at:.3f} s after run-start, with {len(got)} line(s) written (the last "
              f"{describe(got, len(got))}): the kill left changed {sorted(left)}")
