"""Abnormal process exits, from the exit probe's counters.

  oom_kill       the OOM killer chose a process of the cgroup
  process_crash  a process died of a signal that means a fault in the
                 program (SEGV, BUS, ILL, FPE, ABRT, SYS, TRAP), or dumped core

Deliberate ends (KILL, TERM, INT, PIPE, HUP, a non-zero exit status) are
counted in tracehound_process_exits_total only: schedulers, operators and
pipelines end processes that way every day.

Each anomaly is one JSON line on the `tracehound.events` logger and one
increment of tracehound_exits_anomalies_total{kind}; an event is about one
(cgroup, reason, signal) counter that grew since the last look, with how
many processes it counts and the latest of them (pid, comm, signal).
"""
from __future__ import annotations

import datetime
import signal as signal_mod
import threading
import time
from collections.abc import Callable, Iterable

from prometheus_client.core import CounterMetricFamily

from ..probes.exits import ExitKey, ExitsSnapshot, signal_name
from . import log_event, now_iso

KINDS = ("oom_kill", "process_crash")
CRASH_SIGNALS = frozenset(int(getattr(signal_mod, "SIG" + s)) for s in
                          ("SEGV", "BUS", "ILL", "FPE", "ABRT", "SYS", "TRAP"))
INTERVAL_S = 1.0
# how long a retired cgroup's counters are ignored: a look that read the map
# before they were retired must not take them for new. Looks and retirements
# share the schedule's one thread, so a few of its turns are ample; longer
# would hold an id for every cgroup a busy node removes meanwhile.
RETIRED_FOR_S = 10.0

Emit = Callable[[dict], None]


def kind_of(key: ExitKey) -> str | None:
    """The anomaly an exit of this kind is, or None for normal life."""
    if key.reason == "oom":
        return "oom_kill"
    if key.reason == "signal" and (key.signal in CRASH_SIGNALS or key.core):
        return "process_crash"
    return None


def _iso(ts: float) -> str:
    return datetime.datetime.fromtimestamp(ts, datetime.timezone.utc).isoformat(
        timespec="milliseconds")


class ExitsDetector:
    """A detector for the agent's schedule (`name`, `interval`, `run_once`)
    and a collector of its anomaly counter.

    baseline: the first read only records the counters. The probe's maps
    start empty when it loads, so everything they hold happened after the
    agent started and the agent runs with baseline off; a probe whose maps
    outlive the agent would need it on."""

    name = "exits_detector"

    def __init__(self, probe, emit: Emit = log_event,
                 cgroup_path: Callable[[int], str] = str,
                 workload: Callable[[str], dict] = lambda path: {},
                 interval: float = INTERVAL_S, baseline: bool = False):
        self.probe = probe
        self.emit = emit
        self.cgroup_path = cgroup_path
        self.workload = workload
        self.interval = interval
        self._lock = threading.Lock()
        self._seen: dict[ExitKey, int] | None = None if baseline else {}
        self._retired: dict[int, float] = {}      # cgroup id -> when its counters went
        self._counts = dict.fromkeys(KINDS, 0)

    def run_once(self, now: float) -> None:
        self.observe(self.probe.snapshot(), now)

    def observe(self, snap: ExitsSnapshot, now: float) -> list[dict]:
        """Fire for every counter that grew since the last look. Counters
        only grow while their cgroup lives, so an older snapshot (a scrape's,
        read before the last look) never fires twice."""
        fired: list[dict] = []
        with self._lock:
            for cgid in [c for c, t in self._retired.items() if now - t > RETIRED_FOR_S]:
                del self._retired[cgid]
            if self._seen is None:
                self._seen = dict(snap.counts)
                return fired
            for key, total in snap.counts.items():
                before = self._seen.get(key, 0)
                if total <= before or key.cgroup_id in self._retired:
                    continue
                self._seen[key] = total
                kind = kind_of(key)
                if kind is not None:
                    self._fire(kind, key, total - before, total, snap, fired)
        return fired

    def forget(self, cgroup_ids: Iterable[int], now: float | None = None) -> None:
        """The probe retired these cgroups' counters."""
        ids = set(cgroup_ids)
        now = time.monotonic() if now is None else now
        with self._lock:
            self._retired.update(dict.fromkeys(ids, now))
            if self._seen is not None:
                for key in [k for k in self._seen if k.cgroup_id in ids]:
                    del self._seen[key]

    def _fire(self, kind: str, key: ExitKey, grew: int, total: int, snap: ExitsSnapshot,
              fired: list) -> None:
        self._counts[kind] += 1
        path = self.cgroup_path(key.cgroup_id)
        event = {"time": now_iso(), "event": "exits_anomaly", "kind": kind,
                 "cgroup": path, **self.workload(path), "count": grew, "total": total,
                 "reason": key.reason, "signal": signal_name(key.signal),
                 "core_dumped": key.core}
        last = snap.last.get(key)
        if last is not None:
            event.update(pid=last.pid, comm=last.comm, exit_time=_iso(last.wall_time()))
        fired.append(event)
        self.emit(event)

    def counts(self) -> dict[str, int]:
        with self._lock:
            return dict(self._counts)

    def collect(self):
        fam = CounterMetricFamily("tracehound_exits_anomalies",
                                  "Abnormal process exits reported as events, by rule.",
                                  labels=["kind"])
        for kind, n in self.counts().items():
            fam.add_metric([kind], n)
        yield fam
