"""RDMA: the resource-tracker mirror and verb outcomes, with their detector.

Optional: a host without RDMA, or a kernel that refuses every RDMA hook,
gets a reason and the agent runs on."""
from __future__ import annotations

import os

from .. import defaults
from ..collectors.rdma import RdmaCollector
from ..collectors.rdma_ports import RdmaPortCollector
from ..detect.rdma_ports import PortWatcher
from ..host.rdma_ports import SYSFS_ROOT as PORTS_ROOT, PortReader
from ..detect.rdma import RdmaDetector, RdmaDetectorConfig, RdmaWatcher
from ..detect.schedule import Job
from ..host.rdma import summary
from ..probes.rdma import RdmaProbe, RdmaProbeConfig, doctor_line
from .base import DoctorReport, Subsystem, mode_lines


class RdmaSubsystem(Subsystem):
    name = "rdma"

    def __init__(self, ctx):
        super().__init__(ctx)
        cfg = ctx.config
        self.probe = RdmaProbe(RdmaProbeConfig(cfg.hook_mode, cgroup_root=ctx.owners.root,
                                               cgroup_key=ctx.layout.key if ctx.layout else "v2",
                                               max_objects=cfg.rdma_max_objects,
                                               app_view=cfg.rdma_app_view,
                                               instance=cfg.instance))
        self.detector = RdmaDetector(RdmaDetectorConfig(grace_s=cfg.rdma_grace_s),
                                     cgroup_path=ctx.owners.detector_path,
                                     workload=ctx.owners.workload_fields)
        self._collector: RdmaCollector | None = None
        self._watcher: RdmaWatcher | None = None
        self._ports: list = []            # the port counters' collector and flap watcher

    def start(self) -> None:
        # port counters need only sysfs: a host whose kernel refuses the
        # probe still exports them
        if os.path.isdir(PORTS_ROOT):
            reader = PortReader(PORTS_ROOT)
            self._ports = [RdmaPortCollector(reader),
                           PortWatcher(reader, lambda kind, **detail: self.detector.fire(kind, **detail))]
        self.probe.start()
        if not self.probe.available:
            self.reason = self.probe.reason
            return
        self._collector = RdmaCollector(self.probe, self.ctx.owners)
        self._watcher = RdmaWatcher(self.probe, self.detector, kernel_view=summary)
        self.ctx.progress.add_blind(self.name, lambda: self._watcher.holders)

    def close(self) -> None:
        self.ctx.progress.remove(self.name)
        self.probe.close()

    def collectors(self) -> list:
        probe = [self._collector] if self._collector is not None else []
        ports = self._ports[:1]
        return probe + ports + ([self.detector] if probe or ports else [])

    def detectors(self) -> list:
        # housekeeping on the agent's schedule: removed cgroups' verb counters go
        retire = [Job("rdma_retirement", defaults.HOUSEKEEPING_S, self._collector.retire_removed)
                  ] if self._collector is not None else []
        return ([self._watcher] if self._watcher is not None else []) + self._ports[1:] + retire

    def health_families(self) -> list:
        # the ports' state and link_downed: a few sysfs files per port
        wanted = ("tracehound_rdma_port_state_id", "tracehound_rdma_port_counter")
        return [f for c in self._ports[:1] for f in c.collect() if f.name in wanted]

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
