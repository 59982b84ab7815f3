"""The series cap under a real agent: cgroups of no workload fill it first
(as any user's can), then a Slurm job's task writes. The job's I/O is
exported under its own labels to the byte, never in __overflow__; what
folded goes on growing there."""
import os
import uuid

from .conftest import remove_cgroup, run_in_cgroup, series, start_agent, stop_agent

JOB = str(600000 + int(uuid.uuid4().hex[:4], 16))


def test_a_job_met_after_the_cap_filled_keeps_its_series(hook_mode, cgroup_root, cgroup, tmpfs):
    users = [f"{cgroup}/u{i}" for i in range(6)]
    task = f"{cgroup}/slurm/uid_0/job_{JOB}/step_0/task_0"
    for path in (*users, task):
        os.makedirs(cgroup_root + path)
    agent = start_agent(hook_mode, "--max-series", "4")
    try:
        for i, path in enumerate(users):
            run_in_cgroup(cgroup_root, path, [["write", os.path.join(tmpfs, f"cap-u{i}"), 4096,
                                               4096]])
        before = agent.scrape()
        overflow = series(before, "tracehound_io_write_bytes_total", cgroup="__overflow__")
        assert overflow > 0                                     # the cap is full
        run_in_cgroup(cgroup_root, task, [["write", os.path.join(tmpfs, "cap-job"), 100_000,
                                           65536]])
        after = agent.scrape()
        assert series(after, "tracehound_io_write_bytes_total", cgroup=task, mountpoint=tmpfs,
                      job_id=JOB, workload="slurm") == 100_000
        assert series(after, "tracehound_io_write_bytes_total", cgroup="__overflow__") \
            >= overflow
    finally:
        stop_agent(agent)
        for path in (*users, task, *(task.rsplit("/", k)[0] for k in range(1, 5))):
            remove_cgroup(cgroup_root + path)
