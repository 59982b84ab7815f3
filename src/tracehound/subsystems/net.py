"""Net: TCP health per cgroup. Retransmits, failed connects and resets come
from the net probe's kernel counters; established sockets, RTT and bytes
from a sock_diag scan at scrape time.

Optional: a kernel that refuses the probe leaves a reason and the socket
state is still exported (it needs no BPF)."""
from __future__ import annotations

import os

from .. import defaults
from ..collectors.net import NetCollector
from ..detect.schedule import Job
from ..host import sockdiag
from ..probes import object_path
from ..probes.net import NetProbe, NetProbeConfig, doctor_lines
from .base import DoctorReport, Subsystem, check_line, mode_lines


class NetSubsystem(Subsystem):
    name = "net"

    def __init__(self, ctx):
        super().__init__(ctx)
        cfg = ctx.config
        self.probe = NetProbe(NetProbeConfig(max_cgroups=cfg.net_max_cgroups))
        self.sockets = sockdiag.SockDiag(cfg.net_max_sockets, all_netns=cfg.net_all_netns)
        self._collector: NetCollector | None = None

    def start(self) -> None:
        self.probe.start()
        if not self.probe.available:
            self.reason = self.probe.reason
        self._collector = NetCollector(self.probe if self.probe.available else None,
                                       self.sockets, self.ctx.v2_owners or self.ctx.owners)
        # bytes acknowledged and received move while a job talks to its peers;
        # sockets carry v2 cgroup ids, which name the stall detector's cgroups
        # only when the probes count by v2 too
        if self.ctx.layout is None or not self.ctx.layout.is_v1:
            self.ctx.progress.add(self.name, self.sockets.progress)

    def close(self) -> None:
        self.ctx.progress.remove(self.name)
        self.probe.close()

    def collectors(self) -> list:
        return [self._collector] if self._collector is not None else []

    def detectors(self) -> list:
        # housekeeping on the agent's schedule: removed cgroups leave the table
        if self._collector is None or self._collector.probe is None:
            return []
        return [Job("net_retirement", defaults.HOUSEKEEPING_S, self._collector.retire_removed)]

    def modes(self) -> dict[str, str]:
        return self.probe.modes()

    def status_lines(self) -> list[str]:
        where = ("every network namespace" if self.sockets.all_netns
                 else "the agent's network namespace")
        sockets = f"net: socket state from sock_diag in {where} (up to " \
                  f"{self.sockets.max_sockets} sockets a scan)"
        if not self.probe.available:
            return [f"net: no TCP counters ({self.probe.reason})", sockets]
        return mode_lines(self.modes()) + [
            f"{name}: not available ({why})" for name, why in self.probe.missing().items()
        ] + [sockets]

    @classmethod
    def doctor(cls, hook_mode: str) -> DoctorReport:
        # optional: what is missing is reported, never counted as a problem
        lines = ["net:"]
        found = os.path.exists(object_path("net"))
        lines.append(check_line(found, "net probe", object_path("net"),
                                mark=None if found else "--"))
        lines += ["  " + line for line in doctor_lines()] if found else []
        one = sockdiag.scan(1, all_netns=False)
        ok = not one.errors
        lines.append(check_line(ok, "sock_diag", "TCP socket state readable" if ok else
                                f"{one.errors[0]} (no socket gauges)", mark=None if ok else "--"))
        return DoctorReport(lines)
