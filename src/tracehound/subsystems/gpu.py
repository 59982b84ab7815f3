"""GPU health: NVML samples and events, with their detector.

Optional: no driver, no GPU or no nvidia-ml-py is reported, not fatal."""
from __future__ import annotations

import os
import time

from ..attribution.procs import cgroup_v2_path
from ..collectors.gpu import GpuCollector, gpu_inventory, open_gpu_collector
from ..detect.gpu import GpuDetector, GpuWatcher
from .base import DoctorReport, Subsystem, check_line


class GpuBusy:
    """GPU busy seconds of each process holding a GPU context, for the stall
    detector: its GPUs' utilization times the time between two of the GPU
    detector's looks. A process on a GPU whose utilization NVML does not give
    is `unmeasured`: the stall rule cannot judge its work."""

    def __init__(self, clock=time.monotonic):
        self.clock = clock
        self.seconds: dict[int, float] = {}
        self.unmeasured: frozenset[int] = frozenset()
        self._at: float | None = None

    def observe(self, observations: list[dict]) -> list[dict]:
        now = self.clock()
        dt = 0.0 if self._at is None else now - self._at
        self._at = now
        seconds: dict[int, float] = {}
        unmeasured = set()
        for o in observations:
            ratio = o.get("utilization")
            for proc in o.get("processes", ()):
                pid = proc["pid"]
                if ratio is None:
                    unmeasured.add(pid)
                else:
                    seconds[pid] = seconds.get(pid, self.seconds.get(pid, 0.0)) + ratio * dt
        self.seconds, self.unmeasured = seconds, frozenset(unmeasured)
        return observations


class GpuSubsystem(Subsystem):
    name = "gpu"
    needs_bpf = False

    def __init__(self, ctx):
        super().__init__(ctx)
        self.detector = GpuDetector()
        self.collector: GpuCollector | None = None
        self._watcher: GpuWatcher | None = None
        self.summary = ""
        self.busy = GpuBusy()

    def start(self) -> None:
        self.collector, self.summary = open_gpu_collector(
            workload_labels=self.ctx.owners.of_pid, detector=self.detector)
        if self.collector is not None:
            self._watcher = GpuWatcher(lambda: self.busy.observe(self.collector.observations()),
                                       self.detector)
            self.ctx.progress.add(self.name, lambda: self._per_cgroup(self.busy.seconds))
            self.ctx.progress.add_blind(self.name, lambda: self._per_cgroup(
                dict.fromkeys(self.busy.unmeasured, 0.0)))

    def _per_cgroup(self, per_pid: dict[int, float]) -> dict[int, float]:
        out: dict[int, float] = {}
        for pid, value in per_pid.items():
            path = cgroup_v2_path(pid)
            if path is None:
                continue
            try:
                cgid = os.stat(os.path.join(self.ctx.owners.root, path.lstrip("/"))).st_ino
            except OSError:
                continue
            out[cgid] = out.get(cgid, 0.0) + value
        return out

    def close(self) -> None:
        self.ctx.progress.remove(self.name)
        if self.collector is not None:
            self.collector.close()

    def collectors(self) -> list:
        return [self.collector, self.detector] if self.collector is not None else []

    def detectors(self) -> list:
        return [self._watcher] if self._watcher is not None else []

    def status_lines(self) -> list[str]:
        return [f"gpu: {self.summary}"]

    @classmethod
    def doctor(cls, hook_mode: str, nvml=None) -> DoctorReport:
        """GPU health is optional: its absence is reported, never a problem."""
        found, reason = gpu_inventory(nvml)
        lines = ["gpu:"]
        if not found:
            lines.append(check_line(False, "nvml", f"{reason} (GPU health metrics off)", mark="--"))
        for g in found:
            detail = "not answering (GPU lost)" if g["lost"] else f"{g['model']}  {g['uuid']}"
            lines.append(check_line(not g["lost"], f"gpu {g['index']}",
                                    f"{detail}  driver {g['driver_version']}"))
        return DoctorReport(lines)
