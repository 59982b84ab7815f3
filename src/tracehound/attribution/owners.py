"""Who owns a kernel object: cgroup id -> cgroup path -> workload labels,
shared by every subsystem of the agent.

Each subsystem says which cgroup ids it still refers to (`retain`); this is
the one place that decides when a removed cgroup's path and its cached
workload are forgotten: once no subsystem refers to it any more. Before, the
I/O scrape alone decided, so the RDMA side kept a resolver of its own.
"""
from __future__ import annotations

import threading
from collections.abc import Callable, Iterable

from .cgroups import CgroupResolver
from ..host.procs import cgroup_v2_path
from .resolver import WorkloadResolver
from .workload import WORKLOAD_LABELS


class Owners:
    """Thread-safe: scrapes and detectors on their own threads share it."""

    def __init__(self, cgroups: CgroupResolver, workloads: WorkloadResolver,
                 path_of_pid: Callable[[int], str | None] = cgroup_v2_path,
                 scope: str | None = None):
        self.cgroups = cgroups
        self.workloads = workloads
        # the process's path in the hierarchy `cgroups` resolves (the key's)
        self.path_of_pid = path_of_pid
        # exported are only cgroups at or under this path (one node's agent
        # of several on a host); None: all
        self.scope = normal_scope(scope)
        self._refs: dict[str, frozenset[int]] = {}
        self._gone: set[int] = set()      # found removed, still referred to by someone
        self._lock = threading.RLock()

    def in_scope(self, path: str) -> bool:
        """Whether a cgroup path is one this agent exports."""
        s = self.scope
        return s is None or path == s or path.startswith(s + "/")

    @property
    def root(self) -> str:
        return self.cgroups.root

    def new_scrape(self) -> None:
        """Allow one rescan of the cgroup tree for ids first met from now on."""
        with self._lock:
            self.cgroups.new_scrape()

    def alive(self, cgroup_id: int) -> bool:
        with self._lock:
            return self.cgroups.alive(cgroup_id)

    def removed(self, cgroup_id: int) -> bool:
        """Gone for good: its counters may be retired (CgroupResolver.removed)."""
        with self._lock:
            return self.cgroups.removed(cgroup_id)

    def path(self, cgroup_id: int) -> str:
        with self._lock:
            return self.cgroups.path(cgroup_id)

    def workload(self, path: str) -> tuple[str, ...]:
        """Workload label values (WORKLOAD_LABELS order) of a cgroup path."""
        with self._lock:
            return self.workloads.labels(path)

    def workload_fields(self, path: str) -> dict[str, str]:
        """The workload labels of a cgroup path that have a value, for an
        event's fields."""
        return {k: v for k, v in zip(WORKLOAD_LABELS, self.workload(path)) if v}

    def detector_path(self, cgroup_id: int) -> str:
        """The path of an id a detector met between scrapes: a new id may
        rescan the tree once, as at a scrape."""
        self.new_scrape()
        return self.path(cgroup_id)

    def labels(self, cgroup_id: int) -> tuple[str, ...]:
        """(cgroup path, *workload label values)."""
        with self._lock:
            path = self.cgroups.path(cgroup_id)
            return (path, *self.workloads.labels(path))

    def of_pid(self, pid: int) -> dict[str, str]:
        """cgroup and workload labels of a process (for per-process series)."""
        path = self.path_of_pid(pid) or "unknown"
        with self._lock:
            return {"cgroup": path, **self.workloads.resolve(path).as_dict()}

    def retain(self, user: str, cgroup_ids: Iterable[int], gone: Iterable[int] = ()) -> None:
        """`user` (a subsystem) refers to these ids now, and to no others;
        `gone` are ids it found removed (their last values are exported).
        Nothing is forgotten here: prune() does that, on the agent's
        schedule, after the subsystems have retired what they hold."""
        with self._lock:
            self._refs[user] = frozenset(cgroup_ids)
            self._gone.update(gone)

    def prune(self) -> None:
        """Forget the paths and workloads of removed cgroups no subsystem
        refers to. Run on the agent's schedule right after the retirements,
        never at a scrape: the name of a cgroup removed since the last
        retirement is kept for the next, which exports its counters under it."""
        with self._lock:
            in_use = frozenset().union(*self._refs.values())
            for cgid in self._gone - in_use:
                self.workloads.forget(self.cgroups.path(cgid))
                self.cgroups.forget(cgid)
            self._gone &= in_use
            for _ino, path in self.cgroups.retain(in_use):
                self.workloads.forget(path)


def normal_scope(scope: str | None) -> str | None:
    """A scope as paths are compared with it: absolute, no trailing "/";
    "/" (the whole hierarchy) is no scope at all."""
    if scope is None:
        return None
    if not scope.startswith("/"):
        raise ValueError(f"cgroup scope {scope!r}: not an absolute path")
    scope = scope.rstrip("/")
    return scope or None
