"""cgroup v1 paths of processes on hybrid hosts (v1 controllers beside cgroup v2).

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

from .procs import proc_cgroups

SLURM_V1_CONTROLLERS = ("freezer", "cpuset", "memory")


def v1_path_of_pid(pid: int, controllers: Sequence[str] = SLURM_V1_CONTROLLERS,
                   proc_root: str = "/proc") -> str | None:
    """The pid's path in the first of `controllers` mounted as a v1 hierarchy."""
    paths = proc_cgroups(pid, proc_root)
    for ctl in controllers:
        if ctl in paths:
            return paths[ctl]
    return None


def host_has_v1_hierarchies(proc_root: str = "/proc") -> bool:
    """True when this process sits in at least one v1 hierarchy, i.e. the host
    is hybrid or legacy; a pure v2 host shows only the ``0::`` line."""
    # every key but the v2 line's "" names a v1 controller
    return any(proc_cgroups("self", proc_root))
