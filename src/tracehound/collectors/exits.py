"""Exit probe snapshots -> Prometheus metric families, at scrape time.

Labels stay bounded: the reason (4 values) and the fatal signal (at most
the kernel's 64) per cgroup; exit status values are never labels. A core
dump is its own family rather than a label every exit would carry.
"""
from __future__ import annotations

import time

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from ..attribution.owners import Owners
from ..attribution.workload import WORKLOAD_LABELS
from ..probes.exits import COUNTS_ENTRIES, HEALTH, ExitsSnapshot, signal_name

# how long a removed cgroup's exit counters are still exported: two scrapes
# at a 60 s interval, so both members of a Prometheus pair, and any other
# reader of /metrics, see a finished job's last exits
RETIRE_AFTER_S = 120.0
# the exits whose time is exported: a kill names the moment a job broke, and
# explain says it to the millisecond rather than to the next scrape
TIMED_REASONS = ("signal", "oom")
# more removed cgroups than this waiting (a burst of short jobs), or a half
# full kernel table, and they all go at once: memory stays bounded
MAX_PENDING = 256


def _clocks() -> tuple[int, float]:
    """The monotonic clock the kernel stamps exits with, and the wall clock."""
    return time.monotonic_ns(), time.time()


class ExitsCollector:
    """prometheus_client collector over a started ExitsProbe. Counters of a
    removed cgroup are exported for `retire_after_s` more, then retired by
    `retire_expired`, on the agent's schedule.
    `detector` (optional) is shown each snapshot before they are retired, so
    an exit just before a cgroup's removal still makes its event even when a
    scrape comes before the detector's next look."""

    name = "exits"

    def __init__(self, probe, owners: Owners, detector=None,
                 retire_after_s: float = RETIRE_AFTER_S, clock=time.monotonic,
                 clocks=_clocks):
        self.probe = probe
        self.owners = owners
        self.detector = detector
        self.retire_after_s = retire_after_s
        self.clock = clock
        self.clocks = clocks
        self._dead_since: dict[int, float] = {}     # removed cgroup id -> first seen removed

    def _expired(self, snap: ExitsSnapshot, gone: set[int]) -> set[int]:
        """Removed cgroups whose counters have been exported for
        retire_after_s: every scraper (a Prometheus pair, `health`, a chaos
        probe) sees a finished job's last exits, not only the first to ask.
        Past MAX_PENDING of them, or with the kernel's table half full, all
        of them go now."""
        now = self.clock()
        self._dead_since = {c: self._dead_since.get(c, now) for c in gone}
        if len(gone) > MAX_PENDING or len(snap.counts) > COUNTS_ENTRIES // 2:
            return set(gone)
        return {c for c, t in self._dead_since.items() if now - t >= self.retire_after_s}

    def retire_expired(self) -> int:
        """Removed cgroups' counters whose time is up leave the kernel table
        (and the detector's memory); run on the agent's own schedule
        (subsystems/exits.py), whether or not anyone scrapes. Returns how many
        cgroups went."""
        snap: ExitsSnapshot = self.probe.snapshot()
        self.owners.new_scrape()
        counted = snap.cgroup_ids()
        expired = self._expired(snap, {c for c in counted if self.owners.removed(c)})
        if expired:
            now = self.clock()
            if self.detector is not None:
                self.detector.observe(snap, now)
            self.probe.retire(expired)
            if self.detector is not None:
                self.detector.forget(expired, now)
        self.owners.retain(self.name, counted - expired, expired)
        return len(expired)

    def collect(self):
        """Reads a snapshot and exports it; changes nothing."""
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
        last_at = self._last_kills(snap)
        for k, n in sorted(per_core.items()):
            cores.add_metric(list(k), n)
        drops = CounterMetricFamily("tracehound_process_exit_drops",
                                    "Exits the kernel probe could not record (a map was full).",
                                    labels=["reason"])
        for name in HEALTH:
            drops.add_metric([name], snap.health.get(name, 0))

        yield exits
        yield cores
        yield last_at
        yield drops

    def _last_kills(self, snap: ExitsSnapshot) -> GaugeMetricFamily:
        """When the latest process of each label set was killed (a signal, the
        OOM killer), from the kernel's stamp: a kill's own time, not the
        scrape after it. A core dump is folded into its signal, as above."""
        family = GaugeMetricFamily(
            "tracehound_process_last_exit_timestamp_seconds",
            "When the latest process of the label set ended, as a Unix time, for the reasons "
            "signal and oom (the kernel's time of the exit).",
            labels=["cgroup", *WORKLOAD_LABELS, "reason", "signal"])
        mono_ns, wall = self.clocks()
        latest: dict[tuple, float] = {}
        for key, last in snap.last.items():
            if key.reason not in TIMED_REASONS:
                continue
            labels = self.owners.labels(key.cgroup_id)
            if not self.owners.in_scope(labels[0]):
                continue
            k = (*labels, key.reason, signal_name(key.signal))
            at = round(last.wall_time(mono_ns, wall), 3)
            latest[k] = max(latest.get(k, at), at)
        for k, at in sorted(latest.items()):
            family.add_metric(list(k), at)
        return family

