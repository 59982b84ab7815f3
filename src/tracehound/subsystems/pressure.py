"""Pressure: PSI stall time and process states per cgroup, read from the
cgroup tree at scrape time. No BPF.

Optional: a kernel without pressure stall information gets a reason and the
agent runs on."""
from __future__ import annotations

from ..collectors.pressure import PressureCollector
from ..host.cgroup_state import psi_absent
from ..host.mounts import MountTable, MountTableError
from .base import DoctorReport, Subsystem, check_line


class PressureSubsystem(Subsystem):
    name = "pressure"
    needs_bpf = False

    def __init__(self, ctx):
        super().__init__(ctx)
        self._collector: PressureCollector | None = None

    def start(self) -> None:
        # pressure stall information lives in the v2 tree only
        owners = self.ctx.v2_owners or self.ctx.owners
        root = owners.root
        self.reason = psi_absent(root)
        if self.reason is None:
            # Slurm's cgroup/v1 jobs on a hybrid host: their states from the key hierarchy
            jobs_v1 = self.ctx.owners if owners is not self.ctx.owners else None
            self._collector = PressureCollector(root, owners,
                                                self.ctx.config.pressure_max_cgroups,
                                                jobs_v1=jobs_v1)

    def collectors(self) -> list:
        return [self._collector] if self._collector is not None else []

    def status_lines(self) -> list[str]:
        if self._collector is None:
            return super().status_lines()
        line = (f"pressure: PSI and process states of up to {self._collector.max_cgroups} "
                f"cgroups under {self._collector.root}")
        if self._collector.jobs_v1 is not None:
            line += f", and the states of jobs' cgroups under {self._collector.jobs_v1.root}"
        return [line]

    @classmethod
    def doctor(cls, hook_mode: str) -> DoctorReport:
        # optional: its absence is reported, never a problem
        try:
            root = MountTable().cgroup2_root()
        except MountTableError as exc:
            return DoctorReport(["pressure:", check_line(False, "psi", str(exc), mark="--")])
        if root is None:
            return DoctorReport(["pressure:", check_line(False, "psi", "no cgroup v2 hierarchy",
                                                         mark="--")])
        why = psi_absent(root)
        return DoctorReport(["pressure:", check_line(why is None, "psi",
                                                     why or f"{root}/cpu.pressure",
                                                     mark=None if why is None else "--")])
