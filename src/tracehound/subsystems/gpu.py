"""GPU health: NVML samples and events, with their detector.

Optional: no driver, no GPU or no nvidia-ml-py is reported, not fatal."""
from __future__ import annotations

import os

from ..attribution.procs import cgroup_v2_path
from ..collectors.gpu import GpuCollector, gpu_inventory, open_gpu_collector
from ..detect.gpu import GpuDetector, GpuWatcher
from .base import DoctorReport, Subsystem, check_line


class GpuSubsystem(Subsystem):
    name = "gpu"
    needs_bpf = False

    def __init__(self, ctx):
        super().__init__(ctx)
        self.detector = GpuDetector()
        self.collector: GpuCollector | None = None
        self._watcher: GpuWatcher | None = None
        self.summary = ""

    def start(self) -> None:
        self.collector, self.summary = open_gpu_collector(
            workload_labels=self.ctx.owners.of_pid, detector=self.detector)
        if self.collector is not None:
            self._watcher = GpuWatcher(self.collector.observations, self.detector)
            self.ctx.progress.add_blind(self.name, self._gpu_cgroups)

    def _gpu_cgroups(self) -> set[int]:
        """cgroups of the processes holding a GPU context at the detector's
        last look: their work runs on the GPU, which no progress source counts
        yet (per-process GPU utilization would)."""
        out = set()
        for pid in getattr(self.collector, "gpu_pids", ()):
            path = cgroup_v2_path(pid)
            if path is None:
                continue
            try:
                out.add(os.stat(os.path.join(self.ctx.owners.root, path.lstrip("/"))).st_ino)
            except OSError:
                continue
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
