"""cgroup path -> Workload, trying each workload manager in turn.

Order: SLURM, Kubernetes, libvirt, then the systemd unit. The first three own
a recognisable subtree; systemd is what is left, and a Slurm or Kubernetes
cgroup also sits in some slice, so it must come last.

On a host where jobs are separated in v1 hierarchies only (hybrid or v1),
the probes count by the job's v1 cgroup (cgroup_layout.py) and the paths
resolved here are that hierarchy's: a cgroup is never labelled from the
processes it holds, which on a shared v2 cgroup named one job for all.

A workload is decoded only from directories root made: with a cgroup root,
the path's directories are looked at, and a job, pod or VM named below the
first directory root does not own is not taken (ownership.py).

Results are cached per cgroup path. An answer read from the path alone never
changes and is kept until ``forget``; an answer that depended on processes
(an opaque Slurm job id) or on a pod source is kept until it is final (e.g.
the pod's name was found) or re-checked after ``recheck_seconds``: a job's
processes may not have started, a pod's logs may not exist yet.
"""
from __future__ import annotations

import os
import time
from collections.abc import Iterable
from typing import Callable

from . import kubelet, kubernetes, libvirt, ownership, slurm, systemd
from .kubelet import PodSource
from ..host.procs import read_pids, read_text
from .slurm_jobs import JobIdSource, default_job_id_source
from .workload import UNATTRIBUTED, Workload

_DEFAULT = object()


class WorkloadResolver:
    """Resolves and caches cgroup paths (relative to `cgroup_root`, the
    hierarchy counted by, as CgroupResolver.path() returns them).

    Without a `cgroup_root` only the path is used: opaque Slurm job ids stay
    empty. `job_id_source` and `pod_source` default to the sources described
    in slurm_jobs.py and kubelet.py; pass None to disable one.
    """

    def __init__(self, cgroup_root: str | None = None, *, proc_root: str = "/proc",
                 job_id_source=_DEFAULT, pod_source=_DEFAULT,
                 recheck_seconds: float = 30.0, max_pids: int = 256,
                 clock: Callable[[], float] = time.monotonic):
        self.cgroup_root = cgroup_root
        self.proc_root = proc_root
        self.job_id_source: JobIdSource | None = (
            default_job_id_source(proc_root) if job_id_source is _DEFAULT else job_id_source)
        self.pod_source: PodSource | None = (
            kubelet.pod_source() if pod_source is _DEFAULT else pod_source)
        self.recheck_seconds = recheck_seconds
        self.max_pids = max_pids
        self._clock = clock
        # path -> (workload, time after which to resolve again, or None: never)
        self._cache: dict[str, tuple[Workload, float | None]] = {}

    def resolve(self, cgroup_path: str) -> Workload:
        entry = self._cache.get(cgroup_path)
        now = self._clock()
        if entry is not None and (entry[1] is None or now < entry[1]):
            return entry[0]
        workload, final = self._resolve(cgroup_path)
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
        if self.cgroup_root is not None:
            whole = len(components)
            components = ownership.root_made_part(self.cgroup_root, components)
            if len(components) < whole:
                cgroup_path = "/" + "/".join(components)
        parsed = slurm.parse(components)
        if parsed is not None:
            return self._slurm(parsed, cgroup_path)
        kube = kubernetes.parse(components)
        if kube is not None:
            return kubernetes.resolve(kube, self.pod_source, lambda: self._runs_pause(cgroup_path))
        vm = libvirt.match(components)
        if vm is not None:
            return vm, True
        return systemd.match(components) or UNATTRIBUTED, True

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

    def _cgroup_dir(self, cgroup_path: str) -> str:
        return os.path.join(self.cgroup_root or "/", cgroup_path.lstrip("/"))

    def _runs_pause(self, cgroup_path: str) -> bool:
        """Whether every process of the cgroup is the pod sandbox's pause."""
        if self.cgroup_root is None:
            return False
        pids = read_pids(self._cgroup_dir(cgroup_path))[:8]
        comms = {(read_text(os.path.join(self.proc_root, str(pid), "comm")) or "").strip() for pid in pids}
        return comms == {"pause"}

