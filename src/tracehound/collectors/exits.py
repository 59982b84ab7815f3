"""Exit probe snapshots -> Prometheus metric families, at scrape time.

Labels stay bounded: the reason (4 values) and the fatal signal (at most
the kernel's 64) per cgroup; exit status values are never labels. A core
dump is its own family rather than a label every exit would carry.
"""
from __future__ import annotations

import time

from prometheus_client.core import CounterMetricFamily

from ..attribution.owners import Owners
from ..attribution.workload import WORKLOAD_LABELS
from ..probes.exits import HEALTH, ExitsSnapshot, signal_name


class ExitsCollector:
    """prometheus_client collector over a started ExitsProbe. `detector`
    (optional) is shown each snapshot before counters of removed cgroups are
    retired, so an exit just before a cgroup's removal still makes its event
    even when a scrape comes before the detector's next look."""

    name = "exits"

    def __init__(self, probe, owners: Owners, detector=None):
        self.probe = probe
        self.owners = owners
        self.detector = detector

    def collect(self):
        snap: ExitsSnapshot = self.probe.snapshot()
        self.owners.new_scrape()
        owner = ["cgroup", *WORKLOAD_LABELS]
        exits = CounterMetricFamily(
            "tracehound_process_exits",
            "Processes that ended, counted once per process, by reason: signal (killed by a "
            "signal), oom (chosen by the OOM killer), error (exited with a non-zero status), "
            "clean (exited with status 0).", labels=[*owner, "reason", "signal"])
        cores = CounterMetricFamily(
            "tracehound_process_core_dumps",
            "Processes killed by a signal that dumped core (also counted in "
            "tracehound_process_exits).", labels=[*owner, "signal"])
        per_exit: dict[tuple, int] = {}
        per_core: dict[tuple, int] = {}
        for key, n in snap.counts.items():
            labels = self.owners.labels(key.cgroup_id)
            if not self.owners.in_scope(labels[0]):   # another node's (--cgroup-scope)
                continue
            sig = signal_name(key.signal)
            k = (*labels, key.reason, sig)
            per_exit[k] = per_exit.get(k, 0) + n
            if key.core:
                per_core[(*labels, sig)] = per_core.get((*labels, sig), 0) + n
        for k, n in sorted(per_exit.items()):
            exits.add_metric(list(k), n)
        for k, n in sorted(per_core.items()):
            cores.add_metric(list(k), n)
        drops = CounterMetricFamily("tracehound_process_exit_drops",
                                    "Exits the kernel probe could not record (a map was full).",
                                    labels=["reason"])
        for name in HEALTH:
            drops.add_metric([name], snap.health.get(name, 0))

        # counters of removed cgroups were labelled above for the last time
        counted = snap.cgroup_ids()
        gone = {cgid for cgid in counted if not self.owners.alive(cgid)}
        if gone:
            now = time.monotonic()
            if self.detector is not None:
                self.detector.observe(snap, now)
            self.probe.retire(gone)
            if self.detector is not None:
                self.detector.forget(gone, now)
        self.owners.retain(self.name, counted - gone, gone)
        yield exits
        yield cores
        yield drops
