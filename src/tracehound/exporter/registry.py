"""What the exporter serves: every subsystem's collectors, each isolated, and
the agent's own families.

Like node_exporter's collectors: one that raises never fails /metrics; its
families are left out of that scrape and tracehound_collector_success{collector}
says so, beside how long each collector took.
"""
from __future__ import annotations

import logging
import platform
import sys
import threading
import time
from collections.abc import Iterable

from prometheus_client import CollectorRegistry
from prometheus_client.core import GaugeMetricFamily, InfoMetricFamily

from .. import __version__, build_commit
from . import failures

log = logging.getLogger(__name__)


class IsolatedCollector:
    """Runs one collector to completion or not at all, and times it."""

    def __init__(self, collector, name: str | None = None):
        self.collector = collector
        self.name = name or getattr(collector, "name", type(collector).__name__)
        self.success = True
        self.duration_s = 0.0
        self._lock = threading.Lock()

    def collect(self):
        start = time.perf_counter()
        try:
            families = list(self.collector.collect())
            ok = True
        except Exception as exc:  # noqa: BLE001 - isolation is the point
            families, ok = [], False
            if self.success:          # once per streak, not once per scrape
                log.warning("collector %s failed, its metrics are left out: %s", self.name, exc,
                            exc_info=log.isEnabledFor(logging.DEBUG))
        with self._lock:
            self.success = ok
            self.duration_s = time.perf_counter() - start
        return families


class CollectorHealth:
    """tracehound_collector_{success,duration_seconds}{collector}: the last
    run of each isolated collector (registered after them, so that is the
    current scrape's); and the families left out of earlier scrapes
    (failures.py)."""

    name = "collector_health"

    def __init__(self, isolated: Iterable[IsolatedCollector]):
        self.isolated = list(isolated)

    def collect(self):
        ok = GaugeMetricFamily("tracehound_collector_success",
                               "1 if the collector's last run succeeded, 0 if it raised "
                               "(its families were left out).", labels=["collector"])
        took = GaugeMetricFamily("tracehound_collector_duration_seconds",
                                 "How long the collector's last run took.", labels=["collector"])
        for c in self.isolated:
            ok.add_metric([c.name], int(c.success))
            took.add_metric([c.name], c.duration_s)
        yield ok
        yield took
        failed = failures.FAILURES.family()
        if failed is not None:
            yield failed


class AgentInfo:
    """tracehound_probe_info{probe,mode}, the cgroup key, the build, and the
    agent's memory."""

    name = "agent"

    def __init__(self, subsystems, layout=None):
        self.subsystems = subsystems
        self.layout = layout        # attribution.cgroup_layout.CgroupLayout
        # what runs does not change while it runs
        self.build = {"version": __version__, "commit": build_commit(),
                      "kernel": platform.release(), "python": platform.python_version()}

    def collect(self):
        fam = GaugeMetricFamily("tracehound_probe_info",
                                "Hook mode each probe runs in (fentry, kprobe, tracepoint).",
                                labels=["probe", "mode"])
        modes = set()
        for subsystem in self.subsystems:
            for name, mode in subsystem.modes().items():
                fam.add_metric([name, mode], 1)
                modes.add(mode)
        yield fam
        if self.layout is not None:
            key = GaugeMetricFamily(
                "tracehound_cgroup_key_info",
                "The cgroup hierarchy the kernel counts by (key: v2 or a v1 controller), the "
                "host's cgroup layout (v2, hybrid, v1) and where that hierarchy is mounted.",
                labels=["key", "layout", "hierarchy"])
            key.add_metric([self.layout.key, self.layout.layout, self.layout.root], 1)
            yield key
        info = InfoMetricFamily(
            "tracehound_build", "What runs: tracehound's version and the commit it was built "
            "from, the kernel, Python, and the hook modes its probes run in.")
        info.add_metric([], {**self.build, "hook_modes": ",".join(sorted(modes))})
        yield info
        # RSS also moves with allocator fragmentation; the count of live
        # Python blocks only grows if the agent keeps what it should drop.
        blocks = GaugeMetricFamily("tracehound_agent_allocated_blocks",
                                   "Python memory blocks the agent holds (sys.getallocatedblocks).")
        blocks.add_metric([], sys.getallocatedblocks())
        yield blocks


def register_all(registry: CollectorRegistry, subsystems, layout=None) -> CollectorRegistry:
    """Register the started subsystems: the agent's families, every collector
    isolated, then their health."""
    isolated = [IsolatedCollector(AgentInfo(subsystems, layout))]
    isolated += [IsolatedCollector(c) for s in subsystems for c in s.collectors()]
    for c in isolated:
        registry.register(c)
    registry.register(CollectorHealth(isolated))
    return registry
