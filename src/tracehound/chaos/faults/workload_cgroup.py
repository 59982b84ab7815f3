"""The cgroup of an example's workload, made where any agent counts it.

An agent keys what it counts by one hierarchy (`--cgroup-key`): the v2 tree
on a v2 host, and with `auto` on a hybrid or v1 host the first of freezer,
cpuset, memory mounted as a v1 hierarchy, as Slurm's own jobs are placed. A
workload made in the v2 tree alone is, on a hybrid host, counted under the
v1 cgroup it inherited (`/`), and an example's query for its cgroup misses.
So the scaffolding makes the same path in the v2 tree and in every v1
hierarchy an agent may key by, and its processes join all of them before
they run: the cgroup label is the same whichever key the agent uses.

A v1 hierarchy where the experiment itself already sits below the root is
left alone: there someone placed it (a Slurm step's freezer, cpuset and
memory cgroups, a systemd slice), the agent counts the workload under that
job, and moving it out would take it from the job and its limits.

The v2 directory stays the one faults and rollbacks read (cgroup.procs,
io.max); the v1 ones hold the same processes and are removed with it.
"""
from __future__ import annotations

import errno
import os
import time

from ...attribution.cgroup_layout import v1_hierarchies
from .targets import cgroup2_root, check_cgroup_path

# Joins every cgroup.procs given (their count first), then runs the rest:
# no process of the workload ever runs outside one of them.
_JOIN = ('n=$0; while [ "$n" -gt 0 ]; do echo $$ > "$1" || exit 125; shift; '
         'n=$((n - 1)); done; exec "$@"')


def _relative(cgroup: str) -> str:
    problems = check_cgroup_path(cgroup)
    if problems:
        raise ValueError(problems[0])
    return cgroup.strip("/")


def v1_roots() -> list[str]:
    """Mount points of the v1 hierarchies an agent may key by (none on a v2 host)."""
    return sorted(set(_v1_hierarchies().values()))


def _v1_hierarchies() -> dict[str, str]:
    from ...host.mounts import MountTable
    return v1_hierarchies(MountTable())


def _unplaced_v1_roots(proc_cgroup: str = "/proc/self/cgroup") -> list[str]:
    """The v1 key hierarchies where this process sits at the root: those a
    workload it starts may be given a cgroup in (see the module doc)."""
    placed = set()
    try:
        with open(proc_cgroup) as f:
            for line in f.read(65536).splitlines():
                _, controllers, path = line.split(":", 2)
                if path != "/":
                    placed.update(controllers.split(","))
    except (OSError, ValueError):
        return []           # unknown: leave every v1 hierarchy alone
    return sorted({root for controller, root in _v1_hierarchies().items()
                   if controller not in placed})


def v2_dir(cgroup: str) -> str:
    return os.path.join(cgroup2_root(), _relative(cgroup))


def dirs(cgroup: str) -> list[str]:
    """The cgroup's directory in the v2 tree, then in each v1 key hierarchy."""
    rel = _relative(cgroup)
    return [os.path.join(root, rel) for root in (cgroup2_root(), *v1_roots())]


def make(cgroup: str) -> list[str]:
    """Make the path in the v2 tree (parents too) and in each v1 key
    hierarchy where this process sits at the root and the path's parent is
    there already (the rollback removes the leaf alone, so nothing is made
    in v1 that it would leave behind). Returns the cgroup.procs files to join."""
    rel = _relative(cgroup)
    v2 = os.path.join(cgroup2_root(), rel)
    os.makedirs(v2, exist_ok=True)
    procs = [os.path.join(v2, "cgroup.procs")]
    for directory in (os.path.join(root, rel) for root in _unplaced_v1_roots()):
        if os.path.isdir(os.path.dirname(directory)):
            make_v1_dir(directory)
            procs.append(os.path.join(directory, "cgroup.procs"))
    return procs


def make_v1_dir(directory: str) -> None:
    """mkdir; in a v1 cpuset hierarchy a new cpuset has no CPUs and no
    memory nodes (no task may join it) until given its parent's."""
    parent = os.path.dirname(directory)
    try:
        os.mkdir(directory)
    except FileExistsError:
        return
    for name in ("cpuset.cpus", "cpuset.mems"):
        mine = os.path.join(directory, name)
        if os.path.exists(mine):
            with open(os.path.join(parent, name)) as f:
                value = f.read().strip()
            with open(mine, "w") as f:
                f.write(value)


def existing_procs(cgroup: str) -> list[str]:
    """The cgroup.procs of the path in each hierarchy where it exists (a
    fault joins what the experiment made; it makes nothing of its own)."""
    return [os.path.join(d, "cgroup.procs") for d in dirs(cgroup) if os.path.isdir(d)]


def join_argv(procs: list[str], argv: list[str]) -> list[str]:
    """`argv` run by a shell that first joins every cgroup.procs of `procs`."""
    return ["sh", "-c", _JOIN, str(len(procs)), *procs, *argv]


def removed(directory: str) -> bool:
    """rmdir a cgroup: True once it is gone (or was never there), False
    while the kernel still says EBUSY: cgroup.procs empties a moment before
    its last task is freed."""
    try:
        os.rmdir(directory)
    except FileNotFoundError:
        pass
    except OSError as exc:
        if exc.errno != errno.EBUSY:
            raise
        return False
    return True


def remove(cgroup: str, tries: int = 100) -> None:
    """rmdir the path in each v1 key hierarchy (the v2 one is the caller's,
    emptied first). A v1 cgroup that still holds a process is left, and said."""
    rel = _relative(cgroup)
    for root in v1_roots():
        directory = os.path.join(root, rel)
        for _ in range(tries):
            if removed(directory):
                break
            time.sleep(0.05)
        else:
            raise RuntimeError(f"cgroup {cgroup} in {root} still busy")
