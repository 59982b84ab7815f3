"""Stalled jobs: reads what the other subsystems publish on the progress
board, so it comes last in SUBSYSTEMS. Needs no BPF of its own; with
--stall-after 0 it is off."""
from __future__ import annotations

from ..detect.stall import StallConfig, StallDetector
from .base import Subsystem

# look often enough that a stall is reported within a quarter of its threshold
MIN_INTERVAL_S, MAX_INTERVAL_S = 0.5, 5.0


class StallSubsystem(Subsystem):
    name = "stall"
    needs_bpf = False

    def __init__(self, ctx):
        super().__init__(ctx)
        c = ctx.config
        self.detector: StallDetector | None = None
        if c.stall_after_s > 0:
            interval = min(MAX_INTERVAL_S, max(MIN_INTERVAL_S, c.stall_after_s / 4))
            self.detector = StallDetector(StallConfig(c.stall_after_s, c.stall_cgroups, interval),
                                          ctx.owners.root, ctx.progress, ctx.owners.workload,
                                          in_scope=ctx.owners.in_scope)
        else:
            self.reason = "off (--stall-after 0)"

    def collectors(self) -> list:
        return [self.detector] if self.detector is not None else []

    def detectors(self) -> list:
        return [self.detector] if self.detector is not None else []

    def status_lines(self) -> list[str]:
        if self.detector is None:
            return [f"stall: {self.reason}"]
        scope = "scheduler jobs, pods and VMs"
        if self.ctx.config.stall_cgroups:
            scope += f" and cgroups matching {self.ctx.config.stall_cgroups}"
        return [f"stall: {scope} idle for {self.ctx.config.stall_after_s:g} s "
                f"(progress from {', '.join(self.ctx.progress.names()) or 'nothing'})"]
