"""workload_cgroup's join: the shell writes its own pid into every
cgroup.procs given before it execs the workload, and runs nothing when one
write fails. Plain files stand in for cgroup.procs (the kernel's own are
joined for real by tests/kernel/test_chaos_examples.py)."""
import subprocess

from tracehound.chaos.faults import workload_cgroup


def test_the_workload_is_the_process_that_joined_every_hierarchy(tmp_path):
    procs = [str(tmp_path / name) for name in ("v2", "freezer", "cpuset")]
    argv = workload_cgroup.join_argv(procs, ["sh", "-c", "echo $$"])
    out = subprocess.run(argv, capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    pid = out.stdout.strip()
    # exec keeps the pid: what each file holds is the workload's own
    assert [open(p).read().strip() for p in procs] == [pid] * 3


def test_a_hierarchy_it_cannot_join_runs_nothing(tmp_path):
    marker = tmp_path / "ran"
    procs = [str(tmp_path / "v2"), str(tmp_path / "missing" / "cgroup.procs")]
    argv = workload_cgroup.join_argv(procs, ["touch", str(marker)])
    out = subprocess.run(argv, capture_output=True, text=True, timeout=30)
    assert out.returncode == 125 and not marker.exists()
