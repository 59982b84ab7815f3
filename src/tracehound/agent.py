"""The node agent: probes + collectors + exporter, until a signal stops it."""
from __future__ import annotations

import functools
import logging
import signal
import threading
from dataclasses import dataclass

from prometheus_client import CollectorRegistry

from . import preflight
from .attribution.cgroups import CgroupResolver
from .collectors.io import IoCollector
from .errors import SetupError
from .exporter.server import DEFAULT_LISTEN, Exporter, ProbeInfoCollector
from .host.mounts import DEFAULT_SKIP_FSTYPES, MountTable
from .probes.io import IoProbe, IoProbeConfig

log = logging.getLogger(__name__)


@dataclass
class AgentConfig:
    listen: str = DEFAULT_LISTEN
    hook_mode: str = "auto"
    skip_fstypes: tuple[str, ...] = DEFAULT_SKIP_FSTYPES
    max_entries: int = 8192


class Agent:
    def __init__(self, config: AgentConfig):
        self.config = config
        self.mounts = MountTable()
        root = self.mounts.cgroup2_root()
        if root is None:
            raise SetupError("no cgroup v2 hierarchy is mounted: mount one "
                             "(mount -t cgroup2 none /sys/fs/cgroup/unified)")
        self.cgroups = CgroupResolver(root)
        self.io = IoProbe(IoProbeConfig(config.hook_mode, config.skip_fstypes,
                                        config.max_entries), self.mounts)
        self.registry = CollectorRegistry(auto_describe=False)
        self.exporter = Exporter(self.registry, config.listen)
        self._stop = threading.Event()

    def start(self) -> "Agent":
        # Bind first: a busy port should fail before any BPF is loaded.
        self.exporter.start()
        try:
            self.io.start()
        except BaseException:
            self.exporter.stop()
            raise
        self.registry.register(ProbeInfoCollector([self.io]))
        self.registry.register(IoCollector(self.io, self.mounts, self.cgroups))
        return self

    def stop(self) -> None:
        self._stop.set()
        self.exporter.stop()
        self.io.close()

    def wait(self) -> None:
        self._stop.wait()


def run(config: AgentConfig, out=functools.partial(print, flush=True)) -> int:
    preflight.run_all()
    agent = Agent(config).start()

    def on_signal(signum, _frame):
        agent._stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    out(f"tracehound: serving metrics on {agent.exporter.url}")
    for probe, mode in agent.io.modes().items():
        out(f"tracehound: probe {probe:<10} mode {mode}")
    try:
        while not agent._stop.wait(1.0):
            pass
    finally:
        agent.stop()
        out("tracehound: probes detached, exiting")
    return 0
