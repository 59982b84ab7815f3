"""A user fills the kernel's I/O table, as uid 65534 and without privilege,
against an agent whose table holds 256 entries: through bind mounts in a
user and mount namespace of their own, or from cgroups of their own in a
subtree delegated to them. The kernel keeps the last quarter of the table
for cgroups root made on mounts no user owns, so a Slurm job's task that
writes while the user goes on minting entries is counted to the byte, with
nothing evicted: the room was never taken, rather than made on the agent's
next turn. When root's own cgroups fill the table, the agent makes room on
its schedule, and a job's write afterwards is counted to the byte."""
import os
import signal
import subprocess
import time
import uuid

from .conftest import remove_cgroup, require_tools, run_in_cgroup, series, start_agent, stop_agent

JOB = str(500000 + int(uuid.uuid4().hex[:4], 16))
ENTRIES = 256
MINTED = 300
NOBODY = "65534"
# as the user: a tmpfs of their own, MINTED bind mounts of one directory of
# it, then a write through each, again and again
BIND_MOUNTS = ('mount -t tmpfs fill /mnt && mkdir /mnt/src && i=0 && '
               f'while [ $i -lt {MINTED} ]; do mkdir /mnt/b$i && '
               'mount --bind /mnt/src /mnt/b$i; i=$((i + 1)); done && '
               f'while :; do i=0; while [ $i -lt {MINTED} ]; do echo x > /mnt/b$i/f$i; '
               'i=$((i + 1)); done; done')
# as the user, in the subtree delegated to them ($0): MINTED cgroups, moving
# into each and writing one line to $1, again and again
OWN_CGROUPS = (f'while :; do i=0; while [ $i -lt {MINTED} ]; do mkdir -p "$0/c$i" && '
               'echo $$ > "$0/c$i/cgroup.procs" && echo x >> "$1"; i=$((i + 1)); done; done')
# as root, once: MINTED cgroups of its own ($0), a write to $1 from each
ROOTS_CGROUPS = (f'i=0; while [ $i -lt {MINTED} ]; do mkdir "$0/c$i" && '
                 'echo $$ > "$0/c$i/cgroup.procs" && echo x >> "$1"; i=$((i + 1)); done && '
                 'echo $$ > "$0/cgroup.procs"')


def as_nobody(argv: list[str]) -> list[str]:
    return ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", *argv]


def start_in(procs: str, argv: list[str]) -> subprocess.Popen:
    """ARGV started inside the cgroup whose cgroup.procs is PROCS, in a
    process group of its own."""
    return subprocess.Popen(["sh", "-c", 'echo $$ > "$0" && exec "$@"', procs, *argv],
                            start_new_session=True, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)


def stop(minter: subprocess.Popen) -> None:
    try:
        os.killpg(minter.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    minter.wait(timeout=30)


def wait_for(agent, minter: subprocess.Popen, name: str, **labels) -> None:
    """Until the agent's counter NAME moved, while the minter runs (its
    300 mounts take minutes in the VM tier's emulated guest)."""
    deadline = time.monotonic() + 360
    while series(agent.scrape(), name, **labels) == 0:
        assert minter.poll() is None, minter.stderr.read()[-2000:]
        assert time.monotonic() < deadline, f"{name} {labels} never moved"
        time.sleep(0.5)


def job_write_is_counted(agent, cgroup_root: str, task: str, tmpfs: str) -> None:
    run_in_cgroup(cgroup_root, task, [["write", os.path.join(tmpfs, f"room-{JOB}"),
                                       100_000, 65536]])
    assert series(agent.scrape(), "tracehound_io_write_bytes_total", cgroup=task,
                  mountpoint=tmpfs, job_id=JOB) == 100_000


def remove_tree(top: str) -> None:
    for dirpath, _dirs, _files in sorted(os.walk(top), key=lambda w: -len(w[0])):
        remove_cgroup(dirpath)


def minted_against_the_reserve(hook_mode, cgroup_root, cgroup, tmpfs, minter_argv, delegated):
    """The user mints entries without pause in USER (handed to them when
    DELEGATED) while a job writes."""
    require_tools("setpriv", "unshare", "mount")
    user, task = f"{cgroup}/user", f"{cgroup}/slurm/uid_0/job_{JOB}/step_0/task_0"
    for path in (user, task):
        os.makedirs(cgroup_root + path)
    if delegated:
        for name in ("", "cgroup.procs", "cgroup.threads", "cgroup.subtree_control"):
            os.chown(os.path.join(cgroup_root + user, name), int(NOBODY), int(NOBODY))
    agent = start_agent(hook_mode, "--max-entries", str(ENTRIES))
    minter = start_in(cgroup_root + user + "/cgroup.procs", minter_argv(cgroup_root + user))
    try:
        # the user has reached the room kept for the node's own
        wait_for(agent, minter, "tracehound_map_full_drops_total", map="io_stats_reserve")
        job_write_is_counted(agent, cgroup_root, task, tmpfs)
        assert minter.poll() is None                     # still minting
        assert series(agent.scrape(), "tracehound_map_evictions_total", map="io_stats") == 0
    finally:
        stop(minter)
        stop_agent(agent)
        remove_tree(cgroup_root + user)
        for path in (task, *(task.rsplit("/", k)[0] for k in range(1, 5))):
            remove_cgroup(cgroup_root + path)


def test_bind_mounts_a_user_mints_without_pause_leave_a_jobs_write_counted(
        hook_mode, cgroup_root, cgroup, tmpfs):
    minted_against_the_reserve(
        hook_mode, cgroup_root, cgroup, tmpfs,
        lambda _user: as_nobody(["unshare", "-Urm", "sh", "-c", BIND_MOUNTS]), delegated=False)


def test_cgroups_a_user_mints_without_pause_leave_a_jobs_write_counted(
        hook_mode, cgroup_root, cgroup, tmpfs):
    target = os.path.join(tmpfs, f"own-cgroups-{JOB}")
    open(target, "w").close()
    os.chown(target, int(NOBODY), int(NOBODY))
    minted_against_the_reserve(
        hook_mode, cgroup_root, cgroup, tmpfs,
        lambda user: as_nobody(["sh", "-c", OWN_CGROUPS, user, target]), delegated=True)


def test_a_table_roots_own_cgroups_filled_is_made_room_in_for_a_jobs_write(
        hook_mode, cgroup_root, cgroup, tmpfs):
    services, task = f"{cgroup}/services", f"{cgroup}/slurm/uid_0/job_{JOB}/step_0/task_0"
    for path in (services, task):
        os.makedirs(cgroup_root + path)
    agent = start_agent(hook_mode, "--max-entries", str(ENTRIES))
    try:
        filled = subprocess.run(["sh", "-c", ROOTS_CGROUPS, cgroup_root + services,
                                 os.path.join(tmpfs, f"services-{JOB}")],
                                capture_output=True, text=True, timeout=120)
        assert filled.returncode == 0, filled.stderr[-2000:]
        deadline, evicted = time.monotonic() + 60, 0
        while not evicted and time.monotonic() < deadline:
            evicted = series(agent.scrape(), "tracehound_map_evictions_total", map="io_stats")
            time.sleep(0.5)
        assert evicted > 0
        job_write_is_counted(agent, cgroup_root, task, tmpfs)
    finally:
        stop_agent(agent)
        remove_tree(cgroup_root + services)
        for path in (task, *(task.rsplit("/", k)[0] for k in range(1, 5))):
            remove_cgroup(cgroup_root + path)
