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
from .attribution.kubelet import pod_source
from .attribution.procs import cgroup_v2_path
from .attribution.resolver import WorkloadResolver
from .collectors.gpu import open_gpu_collector
from .collectors.io import IoCollector
from .collectors.rdma import open_rdma
from .errors import SetupError
from .exporter.events import EventLog
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
    max_series: int = 10000
    pod_logs_dir: str = "/var/log/pods"
    kubelet_url: str | None = None
    mountinfo: str = "/proc/self/mountinfo"
    rdma_grace_s: float = 10.0


class Agent:
    def __init__(self, config: AgentConfig):
        self.config = config
        self.mounts = MountTable(config.mountinfo)
        root = self.mounts.cgroup2_root()
        if root is None:
            raise SetupError("no cgroup v2 hierarchy is mounted: mount one "
                             "(mount -t cgroup2 none /sys/fs/cgroup/unified)")
        self.cgroups = CgroupResolver(root)
        self.workloads = WorkloadResolver(
            root, pod_source=pod_source(config.pod_logs_dir, config.kubelet_url))
        self.io = IoProbe(IoProbeConfig(config.hook_mode, config.skip_fstypes,
                                        config.max_entries), self.mounts)
        self.registry = CollectorRegistry(auto_describe=False)
        self.events = EventLog()
        self.exporter = Exporter(self.registry, config.listen, {"/events": self.events.wsgi})
        self._stop = threading.Event()

    def start(self) -> "Agent":
        # Bind first: a busy port should fail before any BPF is loaded.
        self.exporter.start()
        self.events.attach()
        self.cgroups.watch()
        try:
            self.io.start()
        except BaseException:
            self.exporter.stop()
            self.events.detach()
            self.cgroups.close()
            raise
        # RDMA is optional: a host without it gets a reason, never an error
        self.rdma = open_rdma(self.config.hook_mode, self.cgroups.root, self.config.rdma_grace_s,
                              self.workloads)
        for collector in self.rdma.collectors():
            self.registry.register(collector)
        self.registry.register(ProbeInfoCollector([self.io, self.rdma.probe]))
        self.registry.register(IoCollector(self.io, self.mounts, self.cgroups,
                                           self.config.max_series, self.workloads))
        # GPU health is optional: no driver or no GPU is reported, not fatal
        self.gpu, self.gpu_status = open_gpu_collector(workload_labels=self.workload_of_pid)
        if self.gpu is not None:
            self.registry.register(self.gpu)
        return self

    def workload_of_pid(self, pid: int) -> dict[str, str]:
        """cgroup and workload labels of a process (for per-process series)."""
        path = cgroup_v2_path(pid) or "unknown"
        return {"cgroup": path, **self.workloads.resolve(path).as_dict()}

    def stop(self) -> None:
        self._stop.set()
        self.exporter.stop()
        self.events.detach()
        if getattr(self, "gpu", None) is not None:
            self.gpu.close()
        if getattr(self, "rdma", None) is not None:
            self.rdma.close()
        self.io.close()
        self.cgroups.close()

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
    out(f"tracehound: anomaly events on {agent.exporter.url.removesuffix('/metrics')}/events")
    for probe, mode in agent.io.modes().items():
        out(f"tracehound: probe {probe:<10} mode {mode}")
    for line in agent.rdma.status_lines():
        out(f"tracehound: {line}")
    out(f"tracehound: gpu: {agent.gpu_status}")
    try:
        while not agent._stop.wait(1.0):
            pass
    finally:
        agent.stop()
        out("tracehound: probes detached, exiting")
    return 0
