"""I/O: the VFS/syscall probe and its per-(cgroup, mount) counters."""
from __future__ import annotations

import os

from ..bpf import features
from .. import defaults
from ..collectors.io import IoCollector
from ..detect.schedule import Job
from ..host import clocksource
from ..probes import object_path
from ..probes.io import GROUPS, IoProbe, IoProbeConfig
from .base import DoctorReport, Subsystem, check_line, mode_lines


def _key(ctx) -> str:
    return ctx.layout.key if ctx.layout is not None else "v2"


class IoSubsystem(Subsystem):
    name = "io"
    required = True

    def __init__(self, ctx):
        super().__init__(ctx)
        c = ctx.config
        # no histogram exported: nothing to time either
        timed = frozenset() if c.latency_histograms == "off" else \
            frozenset(p.removeprefix("io.") for p in c.latency)
        if not c.latency_sampled:
            gap, why = 0, ""
        elif c.latency_sample_gap_ns is not None:
            gap, why = c.latency_sample_gap_ns, "--latency-sample-gap"
        else:
            gap, why = clocksource.sample_gap_ns(clocksource.current())
        self.sampling = (f"about one call per {gap / 1000:g} us per CPU and kind while calls "
                         f"come faster ({why})" if gap else "every call timed")
        self.probe = IoProbe(IoProbeConfig(c.hook_mode, c.skip_fstypes, c.max_entries, timed,
                                           cgroup_key=_key(ctx), sample_gap_ns=gap,
                                           audit=c.latency_audit and bool(gap)), ctx.mounts)
        self.collector: IoCollector | None = None

    def start(self) -> None:
        self.probe.start()
        self.ctx.progress.add(self.name, self.probe.progress)
        c = self.ctx.config
        self.collector = IoCollector(self.probe, self.ctx.mounts, self.ctx.owners,
                                     c.max_series, c.latency_histograms,
                                     self.probe.config.latency)

    def close(self) -> None:
        self.ctx.progress.remove(self.name)
        self.probe.close()

    def collectors(self) -> list:
        return [self.collector] if self.collector is not None else []

    def detectors(self) -> list:
        # housekeeping on the agent's schedule: removed cgroups leave the map,
        # and a nearly full one makes room for jobs
        if self.collector is None:
            return []
        return [Job("io_retirement", defaults.HOUSEKEEPING_S, self.collector.housekeeping)]

    def modes(self) -> dict[str, str]:
        return self.probe.modes()

    def status_lines(self) -> list[str]:
        timing = [f"latency    {self.sampling}"] if self.probe.config.latency else []
        return mode_lines(self.modes()) + [
            f"probe {name:<10} not hooked on this kernel: {why}"
            for name, why in self.probe.missing().items()] + timing

    @classmethod
    def doctor(cls, hook_mode: str) -> DoctorReport:
        obj = object_path("io")
        found = os.path.exists(obj)
        lines = [check_line(found, "io probe", obj)]
        problems = int(not found)
        for gp in features.plan(GROUPS, hook_mode):
            problems += gp.mode is None
            lines.append(f"  io.{gp.group.name:<8} -> {gp.mode or 'NONE'}")
            for mode, check in gp.checks.items():
                lines.append(f"      {mode:<10} {'ok' if check.ok else 'no':<3} {check.reason}")
        return DoctorReport(lines, problems)
