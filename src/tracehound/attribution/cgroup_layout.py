"""Which cgroup hierarchy the kernel counts by: the cgroup key.

A host mounts cgroups in one of three layouts:
  v2      only the unified hierarchy (cgroup2): jobs, pods and units each
          have their own v2 cgroup; the probes key by the v2 cgroup.
  hybrid  v1 controllers beside a v2 hierarchy (usually at
          /sys/fs/cgroup/unified). Workload managers (Slurm's cgroup/v1
          plugin, the only one that works there; kubelet and container
          runtimes in cgroupfs mode) build their trees in the v1
          controllers only, and every job's processes share one v2 cgroup.
  v1      no cgroup2 mounted at all.

`auto` keys by the v2 cgroup on a v2 host, and on a hybrid or v1 host by the
cgroup of the first of freezer, cpuset, memory mounted as a v1 hierarchy:
Slurm's proctrack/cgroup puts every job in freezer, task/cgroup adds cpuset
and memory. A hybrid host is keyed by v1 always, whatever the v1 tree holds
when the agent starts: slurmd may create its tree later, and a key chosen
from what exists at one instant would change meaning with start order.
"""
from __future__ import annotations

import os
from dataclasses import dataclass

from ..errors import SetupError
from ..host.procs import proc_cgroups

V1_KEYS = ("freezer", "cpuset", "memory")
KEYS = ("v2", *V1_KEYS)
CHOICES = ("auto", *KEYS)


@dataclass(frozen=True)
class CgroupLayout:
    layout: str             # "v2", "hybrid" or "v1": what the host mounts
    key: str                # "v2" or the v1 controller counted by
    root: str               # mount point of the hierarchy counted by
    v2_root: str | None     # the cgroup2 mount point, if any
    why: str                # why this key, in a few words

    @property
    def is_v1(self) -> bool:
        return self.key != "v2"

    def describe(self) -> str:
        """One line for `doctor` and start-up."""
        what = "v2" if self.key == "v2" else f"v1 {self.key}"
        return f"{what} at {self.root} ({self.why})"

    def path_of_pid(self, pid: int | str, proc_root: str = "/proc") -> str | None:
        """The process's path in the hierarchy counted by; None when it is gone
        or not in that hierarchy."""
        path = proc_cgroups(pid, proc_root).get("" if self.key == "v2" else self.key)
        # not stripped: a name may end in a space or "\r", and is then another cgroup
        return None if path is None else (path or "/")

    def cgroup_id_of_path(self, path: str) -> int | None:
        """The id the kernel counts a cgroup path under: its directory's inode."""
        try:
            return os.stat(os.path.join(self.root, path.lstrip("/"))).st_ino
        except OSError:
            return None


def v1_hierarchies(mounts) -> dict[str, str]:
    """(`mounts`: a host.mounts.MountTable, not imported: host reads
    attribution.) Controller -> mount point of each v1 hierarchy holding one of V1_KEYS
    whose whole tree is mounted (a bind of a subtree would give paths that
    are not the ones /proc/PID/cgroup names)."""
    found: dict[str, str] = {}
    for m in mounts.mounts:
        if m.fstype != "cgroup" or m.root != "/":
            continue
        for opt in m.options.split(","):
            if opt in V1_KEYS:
                found.setdefault(opt, m.mountpoint)
    return found


def choose(mounts, wanted: str = "auto") -> CgroupLayout:
    """The key `wanted` (one of CHOICES) on this host's mounts; SetupError
    when it cannot be had."""
    if wanted not in CHOICES:
        raise SetupError(f"--cgroup-key {wanted!r}: one of {', '.join(CHOICES)}")
    v2 = mounts.cgroup2_root()
    v1 = v1_hierarchies(mounts)
    if v2 is None and not v1:
        raise SetupError("no cgroup hierarchy to count by: mount cgroup2, or a v1 "
                         "hierarchy with freezer, cpuset or memory")
    layout = "v1" if v2 is None else ("hybrid" if v1 else "v2")
    if wanted == "v2" or (wanted == "auto" and layout == "v2"):
        if v2 is None:
            raise SetupError("--cgroup-key v2: no cgroup v2 hierarchy is mounted "
                             f"(v1 hierarchies: {', '.join(sorted(v1)) or 'none'}); "
                             "use --cgroup-key auto")
        why = "v2 host" if layout == "v2" else f"{layout} host, asked for"
        return CgroupLayout(layout, "v2", v2, v2, why)
    if wanted == "auto":
        key = next(k for k in V1_KEYS if k in v1)
        why = (f"hybrid host: v2 at {v2} does not separate jobs" if layout == "hybrid"
               else "v1 host: no cgroup2 mounted")
        return CgroupLayout(layout, key, v1[key], v2, why)
    if wanted not in v1:
        raise SetupError(f"--cgroup-key {wanted}: no v1 {wanted} hierarchy is mounted "
                         f"(v1 hierarchies: {', '.join(sorted(v1)) or 'none'})")
    return CgroupLayout(layout, wanted, v1[wanted], v2, f"{layout} host, asked for")
