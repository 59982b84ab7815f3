"""RDMA: the resource-tracker mirror and verb outcomes, with their detector.

Optional: a host without RDMA, or a kernel that refuses every RDMA hook,
gets a reason and the agent runs on."""
from __future__ import annotations

from ..collectors.rdma import RdmaCollector
from ..detect.rdma import RdmaDetector, RdmaDetectorConfig, RdmaWatcher
from ..host.rdma import summary
from ..probes.rdma import RdmaProbe, RdmaProbeConfig, doctor_line
from .base import DoctorReport, Subsystem, mode_lines


class RdmaSubsystem(Subsystem):
    name = "rdma"

    def __init__(self, ctx):
        super().__init__(ctx)
        self.probe = RdmaProbe(RdmaProbeConfig(ctx.config.hook_mode, cgroup_root=ctx.owners.root))
        self.detector = RdmaDetector(RdmaDetectorConfig(grace_s=ctx.config.rdma_grace_s),
                                     cgroup_path=self._cgroup_path)
        self._collector: RdmaCollector | None = None
        self._watcher: RdmaWatcher | None = None

    def _cgroup_path(self, cgroup_id: int) -> str:
        self.ctx.owners.new_scrape()
        return self.ctx.owners.path(cgroup_id)

    def start(self) -> None:
        self.probe.start()
        if not self.probe.available:
            self.reason = self.probe.reason
            return
        self._collector = RdmaCollector(self.probe, self.ctx.owners)
        self._watcher = RdmaWatcher(self.probe, self.detector, kernel_view=summary)

    def close(self) -> None:
        self.probe.close()

    def collectors(self) -> list:
        return [self._collector, self.detector] if self._collector is not None else []

    def detectors(self) -> list:
        return [self._watcher] if self._watcher is not None else []

    def modes(self) -> dict[str, str]:
        return self.probe.modes()

    def status_lines(self) -> list[str]:
        if not self.probe.available:
            return [f"rdma: not available ({self.probe.reason})"]
        return mode_lines(self.modes()) + [
            f"{name}: not available ({why})" for name, why in self.probe.missing().items()]

    @classmethod
    def doctor(cls, hook_mode: str) -> DoctorReport:
        # RDMA is optional: never counted as a problem
        return DoctorReport(["  " + doctor_line(hook_mode)])
