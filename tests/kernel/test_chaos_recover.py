"""A run killed with SIGKILL while six faults are applied, then
`tracehound chaos recover`: the kernel's state must be exactly what it was
before the run."""
import glob
import json
import os
import subprocess
import sys
import tempfile
import time
import uuid

from tests.conftest import tracehound_cmd
from tests.kernel.test_chaos_examples import blkio_path, blkio_tree, in_netns, read, state_of
from tracehound.chaos import scaffold
from tracehound.chaos.faults.targets import cgroup2_root, cgroup_procs


def snapshot(s: dict) -> dict:
    """Everything the six faults touch, as the kernel reports it."""
    st = os.statvfs(s["scratch"])
    flags = in_netns(s["ns_b"], "ip", "-j", "link", "show", "dev", s["if_b"])
    return {
        "blkio": blkio_tree(),
        "writer blkio cgroup": blkio_path(s["writer"]),
        # stopped or not: a process just started may be running, not yet asleep
        "sleeper stopped": state_of(s["sleeper"]) == "T",
        "sleeper memlock": next(ln for ln in read(f"/proc/{s['sleeper']}/limits").splitlines()
                                if ln.startswith("Max locked memory")),
        "qdiscs": in_netns(s["ns_a"], "tc", "qdisc", "show", "dev", s["if_a"]),
        "egress filters": in_netns(s["ns_a"], "tc", "filter", "show", "dev", s["if_a"],
                                   "egress"),
        "peer link up": "UP" in json.loads(flags)[0]["flags"],
        "scratch files": sorted(os.listdir(s["scratch"])),
        "scratch free": st.f_bavail * st.f_frsize,
    }


EXPERIMENT = """
title: killed while six faults are applied
description: SIGKILL arrives during the last pause; recover must undo everything
method:
  - type: action
    name: throttle
    provider: {{type: tracehound, fault: io.throttle, arguments: {{cgroup: "{cgroup}",
               device: /var/tmp, wbps: 1048576}}}}
  - type: action
    name: stop
    provider: {{type: tracehound, fault: proc.stop, arguments: {{pid: {sleeper}}}}}
  - type: action
    name: memlock
    provider: {{type: tracehound, fault: rdma.memlock, arguments: {{pid: {sleeper},
               bytes: 4096}}}}
  - type: action
    name: loss
    provider: {{type: tracehound, fault: net.loss, arguments: {{netns: {ns_a},
               interface: {if_a}, percent: 30}}}}
  - type: action
    name: link-down
    provider: {{type: tracehound, fault: rdma.link_down, arguments: {{netns: {ns_b},
               interface: {if_b}}}}}
  - type: action
    name: fill
    provider: {{type: tracehound, fault: io.fill, arguments: {{path: {scratch},
               free_bytes: 0, max_bytes: 134217728}}}}
    pauses: {{after: 120}}
"""


def applied_count(journal_dir: str) -> int:
    n = 0
    for path in glob.glob(f"{journal_dir}/*.jsonl"):
        with open(path) as f:
            n += sum(1 for line in f if '"event": "applied"' in line)
    return n


def test_sigkill_mid_fault_then_recover_restores_everything():
    tag = uuid.uuid4().hex[:5]
    tmp = tempfile.mkdtemp(prefix="thtest-chaos-kill-")
    s = {"cgroup": f"/thtest/chaos-kill-{tag}", "ns_a": f"thk{tag}a", "ns_b": f"thk{tag}b",
         "if_a": f"thk{tag}0", "if_b": f"thk{tag}1", "scratch": f"{tmp}/scratch"}
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    journal = f"{tmp}/journal"
    try:
        s["writer"] = scaffold.start_writer(s["cgroup"], "/var/tmp")["pid"]
        s["sleeper"] = sleeper.pid
        scaffold.make_netns_pair(s["ns_a"], s["ns_b"], s["if_a"], s["if_b"],
                                 "10.205.0.1/24", "10.205.0.2/24")
        scaffold.mount_tmpfs(s["scratch"], 32)
        before = snapshot(s)
        path = f"{tmp}/experiment.yaml"
        with open(path, "w") as f:
            f.write(EXPERIMENT.format(**s))
        proc = subprocess.Popen(tracehound_cmd() + ["chaos", "run", path, "--yes",
                                                    "--allow-code", "--journal", journal,
                                                    "--report", f"{tmp}/report"],
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        deadline = time.monotonic() + 60
        while applied_count(journal) < 6 and time.monotonic() < deadline:
            assert proc.poll() is None, proc.stdout.read()
            time.sleep(0.05)
        assert applied_count(journal) == 6
        during = snapshot(s)
        proc.kill()
        proc.wait(timeout=10)
        after_kill = snapshot(s)
        for key in ("blkio", "writer blkio cgroup", "sleeper stopped", "sleeper memlock",
                    "qdiscs", "egress filters", "peer link up", "scratch files"):
            assert during[key] != before[key], key            # each fault was real
            assert after_kill[key] == during[key], key        # and outlived the run
        assert during["sleeper stopped"] and not during["peer link up"]

        out = subprocess.run(tracehound_cmd() + ["chaos", "recover", "--journal", journal],
                             capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, out.stdout + out.stderr
        assert out.stdout.count("tracehound: rolled back") == 6, out.stdout
        assert snapshot(s) == before
        again = subprocess.run(tracehound_cmd() + ["chaos", "recover", "--journal", journal],
                               capture_output=True, text=True, timeout=60)
        assert again.returncode == 0 and "nothing to recover" in again.stdout
    finally:
        subprocess.run(tracehound_cmd() + ["chaos", "recover", "--journal", journal],
                       capture_output=True, timeout=60)
        sleeper.kill()
        sleeper.wait()
        scaffold.stop_workload(s["cgroup"], "/var/tmp")
        scaffold.delete_netns([s["ns_a"], s["ns_b"]])
        scaffold.unmount(s["scratch"])
        subprocess.run(["rm", "-rf", tmp])


HELPER_EXPERIMENT = """
title: killed while its helper writes
description: the declared rollback (stop the writer, remove its cgroup and file) must run on recover
method:
  - type: action
    name: start-writer
    provider: {{type: python, module: tracehound.chaos.scaffold, func: start_writer,
               arguments: {{cgroup: "{cgroup}", directory: "{data}", block_size: 4096,
                            direct: false}}}}
    pauses: {{after: 120}}
rollbacks:
  - type: action
    name: stop-writer
    provider: {{type: python, module: tracehound.chaos.scaffold, func: stop_workload,
               arguments: {{cgroup: "{cgroup}", directory: "{data}"}}}}
"""


def chars_written(pid: int) -> int:
    """What the process has written so far (0 once it is gone)."""
    try:
        with open(f"/proc/{pid}/io") as f:
            return next(int(ln.split()[1]) for ln in f if ln.startswith("wchar:"))
    except (OSError, StopIteration):
        return 0


def test_sigkill_then_recover_runs_the_experiments_own_rollbacks():
    tag = uuid.uuid4().hex[:5]
    tmp = tempfile.mkdtemp(prefix="thtest-chaos-helper-")
    cgroup, data = f"/thtest/chaos-helper-{tag}", f"{tmp}/data"
    os.makedirs(data)
    cg_dir = os.path.join(cgroup2_root(), cgroup.strip("/"))
    journal = f"{tmp}/journal"
    path = f"{tmp}/experiment.yaml"
    with open(path, "w") as f:
        f.write(HELPER_EXPERIMENT.format(cgroup=cgroup, data=data))
    try:
        proc = subprocess.Popen(tracehound_cmd() + ["chaos", "run", path, "--yes",
                                                    "--allow-code", "--journal", journal,
                                                    "--report", f"{tmp}/report"],
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        deadline = time.monotonic() + 60
        while not (os.path.isdir(cg_dir) and cgroup_procs(cg_dir) and os.listdir(data)):
            assert proc.poll() is None, proc.stdout.read()
            assert time.monotonic() < deadline, "the writer never started"
            time.sleep(0.05)
        writer = cgroup_procs(cg_dir)[0]
        proc.kill()
        proc.wait(timeout=10)
        # outlived the run: still writing after it was killed
        written = chars_written(writer)
        deadline = time.monotonic() + 30
        while chars_written(writer) <= written:
            assert time.monotonic() < deadline, f"the writer {writer} stopped with the run"
            time.sleep(0.05)
        assert os.listdir(data)

        out = subprocess.run(tracehound_cmd() + ["chaos", "recover", "--journal", journal],
                             capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, out.stdout + out.stderr
        assert "ran the experiment's rollback 'stop-writer'" in out.stdout, out.stdout
        deadline = time.monotonic() + 10
        while os.path.exists(f"/proc/{writer}") and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not os.path.exists(f"/proc/{writer}")
        assert not os.path.isdir(cg_dir) and os.listdir(data) == []
        again = subprocess.run(tracehound_cmd() + ["chaos", "recover", "--journal", journal],
                               capture_output=True, text=True, timeout=60)
        assert again.returncode == 0 and "nothing to recover" in again.stdout
    finally:
        scaffold.stop_workload(cgroup, data)
