"""GPU health: NVML samples and events, with their detector.

Optional: no driver, no GPU or no nvidia-ml-py is reported, not fatal."""
from __future__ import annotations

from ..collectors.gpu import GpuCollector, gpu_inventory, open_gpu_collector
from ..detect.gpu import GpuDetector, GpuWatcher
from .base import DoctorReport, Subsystem


class GpuSubsystem(Subsystem):
    name = "gpu"
    needs_bpf = False

    def __init__(self, ctx):
        super().__init__(ctx)
        self.detector = GpuDetector()
        self.collector: GpuCollector | None = None
        self.summary = ""

    def start(self) -> None:
        self.collector, self.summary = open_gpu_collector(
            workload_labels=self.ctx.owners.of_pid, detector=self.detector)

    def close(self) -> None:
        if self.collector is not None:
            self.collector.close()

    def collectors(self) -> list:
        return [self.collector, self.detector] if self.collector is not None else []

    def detectors(self) -> list:
        if self.collector is None:
            return []
        return [GpuWatcher(self.collector.observations, self.detector)]

    def status_lines(self) -> list[str]:
        return [f"gpu: {self.summary}"]

    @classmethod
    def doctor(cls, hook_mode: str, nvml=None) -> DoctorReport:
        """GPU health is optional: its absence is reported, never a problem."""
        found, reason = gpu_inventory(nvml)
        lines = ["gpu:"]
        if not found:
            lines.append(f"  [--] {'nvml':<14} {reason} (GPU health metrics off)")
        for g in found:
            detail = "not answering (GPU lost)" if g["lost"] else f"{g['model']}  {g['uuid']}"
            mark = "!!" if g["lost"] else "ok"
            lines.append(f"  [{mark}] {'gpu ' + str(g['index']):<14} "
                         f"{detail}  driver {g['driver_version']}")
        return DoctorReport(lines)
