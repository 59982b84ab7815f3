"""A user fills the kernel's I/O table: as uid 65534, in a user and mount
namespace of their own (no privilege), 300 bind mounts, a write through
each, against an agent whose table holds 256 entries. The agent makes room
on its own schedule, taking out none of a job's entries and the user's
mounts first; a Slurm job's task that writes afterwards is counted to the
byte."""
import os
import subprocess
import time
import uuid

from .conftest import remove_cgroup, require_tools, run_in_cgroup, series, start_agent, stop_agent

JOB = str(500000 + int(uuid.uuid4().hex[:4], 16))
MOUNTS = 300
# as the user: a tmpfs of their own, MOUNTS bind mounts of one directory of
# it, and a write through each
FILL = ('mount -t tmpfs fill /mnt && mkdir /mnt/src && i=0 && '
        f'while [ $i -lt {MOUNTS} ]; do mkdir /mnt/b$i && mount --bind /mnt/src /mnt/b$i && '
        'echo x > /mnt/b$i/f$i; i=$((i + 1)); done')


def test_a_table_a_user_filled_through_bind_mounts_still_counts_a_jobs_write(
        hook_mode, cgroup_root, cgroup, tmpfs):
    require_tools("setpriv", "unshare", "mount")
    user, task = f"{cgroup}/user", f"{cgroup}/slurm/uid_0/job_{JOB}/step_0/task_0"
    for path in (user, task):
        os.makedirs(cgroup_root + path)
    agent = start_agent(hook_mode, "--max-entries", "256")
    try:
        filled = subprocess.run(
            ["sh", "-c", 'echo $$ > "$0" && exec "$@"', cgroup_root + user + "/cgroup.procs",
             "setpriv", "--reuid=65534", "--regid=65534", "--clear-groups",
             "unshare", "-Urm", "sh", "-c", FILL], capture_output=True, text=True, timeout=120)
        assert filled.returncode == 0, filled.stderr[-2000:]
        deadline, evicted = time.monotonic() + 60, 0
        while not evicted and time.monotonic() < deadline:
            evicted = series(agent.scrape(), "tracehound_map_evictions_total", map="io_stats")
            time.sleep(0.5)
        assert evicted > 0
        run_in_cgroup(cgroup_root, task, [["write", os.path.join(tmpfs, f"room-{JOB}"),
                                           100_000, 65536]])
        assert series(agent.scrape(), "tracehound_io_write_bytes_total", cgroup=task,
                      mountpoint=tmpfs, job_id=JOB) == 100_000
    finally:
        stop_agent(agent)
        for path in (user, task, *(task.rsplit("/", k)[0] for k in range(1, 5))):
            remove_cgroup(cgroup_root + path)
