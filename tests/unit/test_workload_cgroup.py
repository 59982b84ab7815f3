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


def test_a_hierarchy_where_the_experiment_was_placed_is_left_alone(tmp_path, monkeypatch):
    # inside a Slurm step: freezer and memory are the job's, cpuset is at its root
    proc = tmp_path / "cgroup"
    proc.write_text("6:freezer:/slurm_n1/uid_0/job_7/step_0\n4:memory:/slurm_n1/uid_0/job_7\n"
                    "3:cpuset:/\n0::/\n")
    monkeypatch.setattr(workload_cgroup, "_v1_hierarchies", lambda: {
        "freezer": "/sys/fs/cgroup/freezer", "memory": "/sys/fs/cgroup/memory",
        "cpuset": "/sys/fs/cgroup/cpuset"})
    assert workload_cgroup._unplaced_v1_roots(str(proc)) == ["/sys/fs/cgroup/cpuset"]
    # unreadable: no v1 hierarchy is touched
    assert workload_cgroup._unplaced_v1_roots(str(tmp_path / "missing")) == []
