"""The one shape every subsystem has, so the agent, `doctor` and the exporter
iterate subsystems instead of knowing each one.

A subsystem is a probe (it alone knows its BPF object or device library),
read-only collectors that turn what the probe decoded into metric families,
and detectors that run on the agent's detector schedule. Adding one means
its own files plus one line in subsystems/__init__.py.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from ..attribution.cgroup_layout import CgroupLayout
from ..attribution.owners import Owners
from ..config import AgentConfig
from ..detect.progress_board import ProgressBoard
from ..host.mounts import MountTable


@dataclass
class Context:
    """What the agent shares with every subsystem."""
    config: AgentConfig
    mounts: MountTable
    owners: Owners                  # of the cgroups the probes count by (layout.key)
    layout: CgroupLayout | None = None
    # of the v2 cgroups, where sockets and pressure live: `owners` itself
    # when the key is v2, None on a host without cgroup2
    v2_owners: Owners | None = None
    # per-cgroup progress each subsystem publishes for the stall detector
    progress: ProgressBoard = field(default_factory=ProgressBoard)


@dataclass
class DoctorReport:
    lines: list[str]
    problems: int = 0       # things that stop the subsystem from working as asked


class Subsystem:
    """Override what applies; the defaults describe a subsystem with nothing
    to run. `required`: the agent does not start without it; otherwise
    start() records why it cannot run in `reason` and the agent goes on."""

    name = ""
    required = False
    needs_bpf = True        # doctor checks it only on a host that can load BPF

    def __init__(self, ctx: Context):
        self.ctx = ctx
        self.reason: str | None = None

    def start(self) -> None:
        """Load and attach; raise TracehoundError only when `required`."""

    def close(self) -> None:
        """Detach and free everything start() took; safe to call twice."""

    def collectors(self) -> list:
        """Objects with `name` and collect() -> metric families; read-only."""
        return []

    def detectors(self) -> list:
        """Objects with `name`, `interval` and run_once(now)."""
        return []

    def health_families(self) -> list:
        """The metric families `tracehound health` decides on, for the
        agent's root-only local channel (exporter/local.py): cheap, from
        state the subsystem keeps or a few files, never a map walk."""
        return []

    def modes(self) -> dict[str, str]:
        """Probe name -> hook mode in use (tracehound_probe_info)."""
        return {}

    def status_lines(self) -> list[str]:
        """What `tracehound run` prints about this subsystem at start-up."""
        return [f"{self.name}: not available ({self.reason})"] if self.reason else []

    @classmethod
    def doctor(cls, hook_mode: str) -> DoctorReport:
        """What this host offers this subsystem, for `tracehound doctor`."""
        return DoctorReport([])


def check_line(ok: bool, what: str, detail: str, mark: str | None = None) -> str:
    """One `doctor` line: [ok], [!!] (a problem) or another mark, the thing, the detail."""
    return f"  [{mark or ('ok' if ok else '!!')}] {what:<14} {detail}"


def mode_lines(modes: dict[str, str]) -> list[str]:
    return [f"probe {name:<10} mode {mode}" for name, mode in modes.items()]
