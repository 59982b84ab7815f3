"""The node agent: its subsystems, the exporter and the detector schedule,
until a signal stops it."""
from __future__ import annotations

import logging
import threading

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from . import defaults, preflight
from .instance import InstanceLock
from .attribution import cgroup_layout
from .attribution.cgroups import CgroupResolver
from .attribution.kubelet import pod_source
from .attribution.owners import Owners
from .host.procs import cgroup_v2_path
from .attribution.resolver import WorkloadResolver
from .config import AgentConfig
from .detect.schedule import DetectorSchedule, Job
from .errors import SetupError
from .exporter.events import EventLog
from .clients.local_agent import socket_path
from .exporter.local import LocalChannel
from .exporter.messages import Request, Response, text_response
from .exporter.registry import register_all
from .exporter.server import Exporter
from .host.memory import release_free_memory
from .host.mounts import MountTable, MountTableError
from .logsink import line_printer
from .probes.cgroup_names import CgroupNamesProbe
from .subsystems import SUBSYSTEMS
from .subsystems.base import Context

log = logging.getLogger(__name__)

__all__ = ["Agent", "AgentConfig", "run"]


class Agent:
    def __init__(self, config: AgentConfig, subsystems=SUBSYSTEMS,
                 stop: threading.Event | None = None):
        self.config = config
        try:
            self.mounts = MountTable(config.mountinfo)
            # the probe needs the table's namespace: a copy fails here, before any load
            self.mounts.mount_namespace_inode()
        except MountTableError as exc:
            raise SetupError(f"--mountinfo {exc}") from None
        # the hierarchy the probes count by (cgroup_layout.py); a v1 key
        # keeps a v2 resolver beside it for sockets and pressure
        self.layout = cgroup_layout.choose(self.mounts, config.cgroup_key)
        pods = pod_source(config.pod_logs_dir, config.kubelet_url)
        self.cgroups = CgroupResolver(self.layout.root)
        self.owners = Owners(self.cgroups, WorkloadResolver(self.layout.root, pod_source=pods),
                             path_of_pid=self.layout.path_of_pid, scope=config.cgroup_scope)
        self.resolvers = [self.cgroups]
        v2_owners: Owners | None = self.owners
        if self.layout.is_v1:
            v2_owners = None
            if self.layout.v2_root is not None:
                v2 = CgroupResolver(self.layout.v2_root)
                self.resolvers.append(v2)
                v2_owners = Owners(v2, WorkloadResolver(self.layout.v2_root, pod_source=pods),
                                   path_of_pid=cgroup_v2_path)
        self.v2_owners = v2_owners if v2_owners is not self.owners else None
        ctx = Context(config, self.mounts, self.owners, layout=self.layout,
                      v2_owners=v2_owners)
        self.subsystems = [cls(ctx) for cls in subsystems
                           if config.subsystems is None or cls.name in config.subsystems]
        self.registry = CollectorRegistry(auto_describe=False)
        # --cgroup-scope: another node's events are not this agent's to serve
        self.events = EventLog(in_scope=self.owners.in_scope if config.cgroup_scope else None)
        self.exporter = Exporter(self.registry, config.listen, {"/events": self.events.wsgi},
                                 web_config=config.web_config)
        local = socket_path(config.instance) if config.local_socket is None else config.local_socket
        self.local = LocalChannel(local, self._local_request) if local else None
        self.schedule: DetectorSchedule | None = None
        self.names: CgroupNamesProbe | None = None
        self._started: list = []
        self._stop = stop if stop is not None else threading.Event()

    def start(self) -> "Agent":
        # Bind first: a busy port should fail before any BPF is loaded.
        self.exporter.start()
        if self.local is not None:
            try:
                self.local.start()
            except BaseException:
                self.exporter.stop()
                raise
        self.events.attach()
        # the kernel's names of new cgroups, before the watcher that races them
        self.names = CgroupNamesProbe(self.layout.key).start()
        if self.names.available:
            self.cgroups.names = self.names.lookup
        else:
            log.warning("cgroup names are learnt from the tree only (%s): a cgroup gone "
                        "before the watcher sees it is exported by id", self.names.reason)
        for resolver in self.resolvers:
            resolver.watch()
        try:
            for s in self.subsystems:
                self._started.append(s)
                s.start()
        except BaseException:
            self.stop()
            raise
        register_all(self.registry, self.subsystems, self.layout)
        # the subsystems' rules and retirements, then forgetting what nobody
        # refers to any more: one turn of the schedule runs them in this order
        self.schedule = DetectorSchedule(
            [d for s in self.subsystems for d in s.detectors()]
            + [Job("owners_pruning", defaults.HOUSEKEEPING_S, self._prune)]).start()
        self.registry.register(self.schedule)
        self.exporter.set_ready(True)
        # libbpf freed the kernel BTF it parsed while loading: give it back
        release_free_memory()
        return self

    def _local_request(self, request: Request) -> Response:
        """The local channel: /health (what `tracehound health` decides on,
        from the subsystems' state) and whatever the TCP port serves."""
        if request.path != "/health":
            return self.exporter.handle(request)
        if not self.exporter.ready:
            return text_response(503, "probes are loading\n", [("Retry-After", "1")])
        families = []
        for s in self.subsystems:
            try:
                families.extend(s.health_families())
            except Exception as exc:       # a verdict on half the evidence is no verdict
                return text_response(500, f"{s.name} health state unreadable: {exc}"[:300])
        return Response(200, generate_latest(_Families(families)),
                        [("Content-Type", CONTENT_TYPE_LATEST)])

    def _prune(self) -> None:
        for owners in (self.owners, self.v2_owners):
            if owners is not None:
                owners.prune()

    def stop(self) -> None:
        self._stop.set()
        self.exporter.stop()
        if self.local is not None:
            self.local.close()
        self.events.detach()
        if self.schedule is not None:
            self.schedule.stop()
            self.schedule = None
        for s in reversed(self._started):
            s.close()
        self._started.clear()
        for resolver in self.resolvers:
            resolver.close()
        if self.names is not None:
            self.cgroups.names = None
            self.names.close()
            self.names = None

    def wait(self) -> None:
        self._stop.wait()


class _Families:
    """A collector of families already made (for generate_latest)."""

    def __init__(self, families: list):
        self.families = families

    def collect(self):
        return self.families


def run(config: AgentConfig, stop: threading.Event, out=None) -> int:
    """Run the agent until `stop` is set (`tracehound run` sets it on SIGINT
    or SIGTERM). A stop asked for during start-up lets the start finish, then
    takes the same clean path: probes detached, nothing left. Status lines
    go to standard output through a writer that a full pipe cannot make
    hold the stop (logsink.line_printer)."""
    out = out or line_printer()
    preflight.run_all()
    if stop.is_set():
        out("tracehound: stopped before anything was loaded")
        return 0
    # Before anything binds or loads: a second agent of this instance, or of
    # its state directory, stops here, naming the one that runs. Held until
    # the probes are detached and the pins gone, so the next agent of this
    # name starts on a clean slate.
    with InstanceLock(config.instance, state=config.state_dir):
        agent = Agent(config, stop=stop).start()     # cleans up after itself if it fails
        try:
            if not stop.is_set():
                out(f"tracehound: instance {config.instance}")
                out(f"tracehound: cgroup key: {agent.layout.describe()}")
                if config.cgroup_scope:
                    out(f"tracehound: cgroup scope: {config.cgroup_scope}")
                out(f"tracehound: serving metrics on {agent.exporter.url}")
                out(f"tracehound: anomaly events on "
                    f"{agent.exporter.url.removesuffix('/metrics')}/events")
                if agent.local is not None:
                    out(f"tracehound: local channel (root only) on {agent.local.path}")
                for s in agent.subsystems:
                    for line in s.status_lines():
                        out(f"tracehound: {line}")
            while not stop.wait(1.0):
                pass
        finally:
            agent.stop()
            out("tracehound: probes detached, exiting")
    return 0
