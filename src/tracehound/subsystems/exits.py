"""Exits: abnormal process exits and OOM kills per cgroup, with their detector.

Optional: a kernel that refuses the exit tracepoint in both its forms gets
a reason and the agent runs on."""
from __future__ import annotations

from .. import defaults
from ..collectors.exits import ExitsCollector
from ..detect.exits import ExitsDetector
from ..detect.schedule import Job
from ..probes.exits import ExitsProbe, ExitsProbeConfig, doctor_line
from .base import DoctorReport, Subsystem, mode_lines


class ExitsSubsystem(Subsystem):
    name = "exits"

    def __init__(self, ctx):
        super().__init__(ctx)
        # the hook mode flag chooses among function hooks (fentry, kprobe);
        # this probe's one hook is a tracepoint in every mode
        self.probe = ExitsProbe(ExitsProbeConfig(
            cgroup_key=ctx.layout.key if ctx.layout is not None else "v2"))
        self.detector: ExitsDetector | None = None
        self._collector: ExitsCollector | None = None

    def start(self) -> None:
        self.probe.start()
        if not self.probe.available:
            self.reason = self.probe.reason
            return
        self.detector = ExitsDetector(self.probe, cgroup_path=self.ctx.owners.detector_path,
                                      workload=self.ctx.owners.workload_fields)
        self._collector = ExitsCollector(self.probe, self.ctx.owners, self.detector)

    def close(self) -> None:
        self.probe.close()

    def collectors(self) -> list:
        return [self._collector, self.detector] if self._collector is not None else []

    def detectors(self) -> list:
        if self._collector is None:
            return []
        # the retirement after the detector, in one turn of the schedule: the
        # detector has looked at a cgroup's last exits before they go
        return [self.detector, Job("exits_retirement", defaults.HOUSEKEEPING_S,
                                   self._collector.retire_expired)]

    def modes(self) -> dict[str, str]:
        return self.probe.modes()

    def status_lines(self) -> list[str]:
        if not self.probe.available:
            return [f"exits: not available ({self.probe.reason})"]
        return mode_lines(self.modes())

    @classmethod
    def doctor(cls, hook_mode: str) -> DoctorReport:
        # optional: never counted as a problem
        return DoctorReport(["  " + doctor_line()])
