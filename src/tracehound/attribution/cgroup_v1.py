"""cgroup v1 paths of the processes in a cgroup v2 directory (hybrid hosts).

On a hybrid host (v1 controllers next to the unified v2 tree, typically
mounted at /sys/fs/cgroup/unified) Slurm's cgroup/v1 plugin builds its job hierarchy in
the v1 controllers only. The v2 tree, where the I/O counters are keyed, then
shows the job's processes wherever systemd put slurmd (for example
``/system.slice/slurmd.service``), so the job can only be recognised from the
processes' v1 paths.

Slurm's v1 plugins use freezer (proctrack/cgroup), cpuset (task/cgroup
ConstrainCores) and memory (ConstrainRAMSpace); they are tried in that order
because freezer is the one every Slurm job has when cgroups track processes.
"""
from __future__ import annotations

from collections.abc import Sequence

from .procs import proc_cgroups, read_pids

SLURM_V1_CONTROLLERS = ("freezer", "cpuset", "memory")


def v1_path_of_pid(pid: int, controllers: Sequence[str] = SLURM_V1_CONTROLLERS,
                   proc_root: str = "/proc") -> str | None:
    """The pid's path in the first of `controllers` mounted as a v1 hierarchy."""
    paths = proc_cgroups(pid, proc_root)
    for ctl in controllers:
        if ctl in paths:
            return paths[ctl]
    return None


def v1_path_of_cgroup(cgroup_dir: str, controllers: Sequence[str] = SLURM_V1_CONTROLLERS,
                      proc_root: str = "/proc") -> str | None:
    """The v1 path of the first process in the v2 cgroup `cgroup_dir`
    (only that cgroup, not its descendants); None if it has no processes
    or the host has none of `controllers` as v1."""
    for pid in read_pids(cgroup_dir):
        path = v1_path_of_pid(pid, controllers, proc_root)
        if path is not None:
            return path
    return None


def v1_paths_in_cgroup(cgroup_dir: str, controllers: Sequence[str] = SLURM_V1_CONTROLLERS,
                       proc_root: str = "/proc", limit: int = 256) -> list[str]:
    """The v1 paths of up to `limit` processes of the v2 cgroup (itself
    only), one entry per process that has one."""
    out = []
    for pid in read_pids(cgroup_dir)[:limit]:
        path = v1_path_of_pid(pid, controllers, proc_root)
        if path is not None:
            out.append(path)
    return out


def host_has_v1_hierarchies(proc_root: str = "/proc") -> bool:
    """True when this process sits in at least one v1 hierarchy, i.e. the host
    is hybrid or legacy; a pure v2 host shows only the ``0::`` line."""
    # every key but the v2 line's "" names a v1 controller
    return any(proc_cgroups("self", proc_root))
