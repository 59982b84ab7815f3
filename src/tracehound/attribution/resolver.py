"""cgroup path -> Workload, trying each workload manager in turn.

Order: SLURM, Kubernetes, libvirt, then the systemd unit. The first three own
a recognisable subtree; systemd is what is left, and a Slurm or Kubernetes
cgroup also sits in some slice, so it must come last.

On a host with cgroup v1 hierarchies, a cgroup that only resolves to a
systemd unit (or to nothing) is looked at once more through the v1 paths of
its processes: if they are in Slurm's v1 job hierarchy, the Slurm job wins
over the unit (see cgroup_v1.py). Processes of different jobs sharing one v2
cgroup give ``workload="slurm"`` with an empty job id, never one of the jobs.

Results are cached per cgroup path. An answer read from the path alone never
changes and is kept until ``forget``; an answer that depended on processes or
on a pod source is kept until it is final (e.g. the pod's name was found) or
re-checked after ``recheck_seconds``: a job's processes may not have
started, a pod's logs may not exist yet, and the processes sharing a v2
cgroup on a hybrid host come and go. A hybrid host's cgroup with no
processes yet is not cached at all: its first process may join a Slurm v1
job a moment later, and a 30 s old "no job" would hide that job's first I/O.
"""
from __future__ import annotations

import os
import time
from collections.abc import Iterable, Sequence
from typing import Callable

from . import kubelet, kubernetes, libvirt, slurm, systemd
from .cgroup_v1 import SLURM_V1_CONTROLLERS, host_has_v1_hierarchies, v1_path_of_pid
from .kubelet import PodSource
from .procs import read_pids, read_text
from .slurm_jobs import JobIdSource, default_job_id_source
from .workload import SLURM, UNATTRIBUTED, Workload

_DEFAULT = object()
_UNCACHED = object()     # an answer that may change at once: resolve it again next time


class WorkloadResolver:
    """Resolves and caches cgroup v2 paths (relative to `cgroup_root`, as
    CgroupResolver.path() returns them).

    Without a `cgroup_root` only the path is used: opaque Slurm job ids stay
    empty and hybrid v1 lookups are off. `job_id_source` and `pod_source`
    default to the sources described in slurm_jobs.py and kubelet.py; pass
    None to disable one. `v1_lookup` None means: on when this process sits
    in a v1 hierarchy (read from `proc_root`).
    """

    def __init__(self, cgroup_root: str | None = None, *, proc_root: str = "/proc",
                 job_id_source=_DEFAULT, pod_source=_DEFAULT,
                 v1_lookup: bool | None = None,
                 v1_controllers: Sequence[str] = SLURM_V1_CONTROLLERS,
                 recheck_seconds: float = 30.0, max_pids: int = 256,
                 clock: Callable[[], float] = time.monotonic):
        self.cgroup_root = cgroup_root
        self.proc_root = proc_root
        self.job_id_source: JobIdSource | None = (
            default_job_id_source(proc_root) if job_id_source is _DEFAULT else job_id_source)
        self.pod_source: PodSource | None = (
            kubelet.pod_source() if pod_source is _DEFAULT else pod_source)
        self.v1_controllers = tuple(v1_controllers)
        self.recheck_seconds = recheck_seconds
        self.max_pids = max_pids
        self._v1_lookup = v1_lookup
        self._clock = clock
        # path -> (workload, time after which to resolve again, or None: never)
        self._cache: dict[str, tuple[Workload, float | None]] = {}

    def resolve(self, cgroup_path: str) -> Workload:
        entry = self._cache.get(cgroup_path)
        now = self._clock()
        if entry is not None and (entry[1] is None or now < entry[1]):
            return entry[0]
        workload, final = self._resolve(cgroup_path)
        if final is not _UNCACHED:
            self._cache[cgroup_path] = (workload, None if final else now + self.recheck_seconds)
        return workload

    def labels(self, cgroup_path: str) -> tuple[str, ...]:
        """Label values in WORKLOAD_LABELS order."""
        return self.resolve(cgroup_path).values()

    def forget(self, cgroup_path: str) -> None:
        """Drop a cached answer (the cgroup was removed, or its path reused)."""
        self._cache.pop(cgroup_path, None)

    def retain(self, live_paths: Iterable[str]) -> None:
        """Drop every cached answer whose path is not in `live_paths`."""
        live = set(live_paths)
        for path in [p for p in self._cache if p not in live]:
            del self._cache[path]

    def cached_paths(self) -> list:
        return list(self._cache)

    def _resolve(self, cgroup_path: str) -> tuple[Workload, object]:
        if not cgroup_path.startswith("/"):
            return UNATTRIBUTED, True       # "unknown:<id>" and the like
        components = systemd.split_path(cgroup_path)
        parsed = slurm.parse(components)
        if parsed is not None:
            return self._slurm(parsed, cgroup_path)
        kube = kubernetes.parse(components)
        if kube is not None:
            return kubernetes.resolve(kube, self.pod_source, lambda: self._runs_pause(cgroup_path))
        vm = libvirt.match(components)
        if vm is not None:
            return vm, True
        unit = systemd.match(components) or UNATTRIBUTED
        if not self._v1_enabled():
            return unit, True
        # A v2 cgroup shared by Slurm v1 jobs changes hands as jobs come and
        # go, so on a host with v1 hierarchies these answers are re-checked.
        pids = read_pids(self._cgroup_dir(cgroup_path))[:self.max_pids]
        if not pids:
            return unit, _UNCACHED
        return self._slurm_from_v1(pids) or unit, False

    def _slurm(self, parsed: slurm.SlurmPath, cgroup_path: str) -> tuple[Workload, bool]:
        if not parsed.opaque:
            return parsed.workload(), True
        if self.cgroup_root is None or self.job_id_source is None:
            return parsed.workload(), True      # nothing could ever tell the job id
        found = slurm.resolve_opaque(parsed, cgroup_path, self.cgroup_root,
                                     self.job_id_source, self.max_pids)
        if found is None:
            return parsed.workload(), False
        return parsed.workload(job_id=found[0], step=found[1]), True

    def _v1_enabled(self) -> bool:
        if self.cgroup_root is None:
            return False
        if self._v1_lookup is None:
            self._v1_lookup = host_has_v1_hierarchies(self.proc_root)
        return self._v1_lookup

    def _cgroup_dir(self, cgroup_path: str) -> str:
        return os.path.join(self.cgroup_root or "/", cgroup_path.lstrip("/"))

    def _runs_pause(self, cgroup_path: str) -> bool:
        """Whether every process of the cgroup is the pod sandbox's pause."""
        if self.cgroup_root is None:
            return False
        pids = read_pids(self._cgroup_dir(cgroup_path))[:8]
        comms = {(read_text(os.path.join(self.proc_root, str(pid), "comm")) or "").strip() for pid in pids}
        return comms == {"pause"}

    def _slurm_from_v1(self, pids: Sequence[int]) -> Workload | None:
        """The Slurm job that `pids`, the processes of one v2 cgroup (itself,
        not its descendants: those are counted under their own cgroups), are
        in according to their v1 paths; None when none of them is Slurm's."""
        jobs = []
        seen_slurm = unknown = False
        for pid in pids:
            v1_path = v1_path_of_pid(pid, self.v1_controllers, self.proc_root)
            parsed = slurm.parse(systemd.split_path(v1_path)) if v1_path else None
            if parsed is None:
                continue
            seen_slurm = True
            if parsed.opaque:
                answer = self._ask_job_id(pid)
                if answer is None:
                    unknown = True
                    continue
                parsed = slurm.SlurmPath(job_id=answer[0], step=parsed.step or answer[1],
                                         task=parsed.task, job_dir=parsed.job_dir)
            if parsed.job_dir:      # Slurm's own processes (slurm/system) are no job
                jobs.append(parsed)
        if not seen_slurm:
            return None
        job_ids = {p.job_id for p in jobs}
        if unknown or len(job_ids) != 1:
            return Workload(kind=SLURM)
        steps = {p.step for p in jobs}
        tasks = {(p.step, p.task) for p in jobs}
        return Workload(kind=SLURM, job_id=next(iter(job_ids)),
                        step=next(iter(steps)) if len(steps) == 1 else "",
                        task=next(iter(tasks))[1] if len(tasks) == 1 else "")

    def _ask_job_id(self, pid: int) -> tuple[str, str] | None:
        if self.job_id_source is None:
            return None
        try:
            return self.job_id_source(pid)
        except Exception:  # noqa: BLE001 - a broken source must not take the scrape down
            return None
