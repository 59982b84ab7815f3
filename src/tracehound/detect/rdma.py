"""RDMA anomaly rules over snapshots of the probe's maps and the kernel's view.

  leaked_objects   objects still owned by a process that exited, after a grace
                   period (the kernel frees them when the last uverbs file
                   reference goes; if they stay, teardown failed or leaked)
  destroy_failed   a destroy verb returned an error (the object stays)
  mirror_mismatch  the BPF mirror and `rdma resource show` disagree on how many
                   objects of a type a device holds, beyond the grace period
  error_burst      errors of one (op, errno) within a sliding window reached
                   the threshold
  port_error, device_fatal, qp_error   the matching asynchronous events

Each anomaly is one JSON line on the `tracehound.events` logger and one
increment of tracehound_rdma_anomalies_total{kind}. Rules fire on a
transition (a state that began, a counter that grew), never again while a
state persists.
"""
from __future__ import annotations

import logging
import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from prometheus_client.core import CounterMetricFamily

from .. import defaults
from ..probes.rdma_maps import DESTROY_OPS, RdmaSnapshot, errno_name
from . import log_event, now_iso

log = logging.getLogger(__name__)

KINDS = ("leaked_objects", "destroy_failed", "mirror_mismatch", "error_burst",
         "port_error", "device_fatal", "qp_error")
EVENT_KIND = {"PORT_ERR": "port_error", "DEVICE_FATAL": "device_fatal",
              "QP_FATAL": "qp_error", "QP_REQ_ERR": "qp_error", "QP_ACCESS_ERR": "qp_error"}

Emit = Callable[[dict], None]


def pid_alive(pid: int) -> bool:
    """A zombie has already closed its files, so it counts as exited."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")


@dataclass
class RdmaDetectorConfig:
    grace_s: float = defaults.RDMA_GRACE_S   # exited owner / diverged mirror tolerated this long
    burst_window_s: float = 10.0
    burst_threshold: int = 1       # errors of one (op, errno) within the window


class _Persisting:
    """A condition per key that is reported once it has lasted the grace
    period, and not again until it has cleared."""

    def __init__(self):
        self.since: dict = {}
        self.reported: set = set()

    def clear(self, key) -> None:
        self.since.pop(key, None)
        self.reported.discard(key)

    def due(self, key, now: float, grace: float) -> float | None:
        """When the condition began, the first time it has lasted `grace`."""
        since = self.since.setdefault(key, now)
        if now - since < grace or key in self.reported:
            return None
        self.reported.add(key)
        return since


class RdmaDetector:
    def __init__(self, config: RdmaDetectorConfig | None = None, emit: Emit = log_event,
                 alive: Callable[[int], bool] = pid_alive,
                 cgroup_path: Callable[[int], str] = str):
        self.config = config or RdmaDetectorConfig()
        self.emit = emit
        self.alive = alive
        self.cgroup_path = cgroup_path
        self._lock = threading.Lock()
        self._counts = dict.fromkeys(KINDS, 0)
        self._started: float | None = None
        self._exited = _Persisting()      # owners gone, objects still held (by tgid)
        self._verbs: dict[tuple[str, int], int] = {}
        self._history: dict[tuple[str, int], deque] = {}
        self._bursting: set[tuple[str, int]] = set()
        self._events: dict[tuple[int, int, str], int] = {}
        self._diverged = _Persisting()     # mirror vs kernel, by (device, type)

    def counts(self) -> dict[str, int]:
        with self._lock:
            return dict(self._counts)

    name = "rdma_detector"

    def collect(self):
        yield self.metric()

    def metric(self) -> CounterMetricFamily:
        fam = CounterMetricFamily("tracehound_rdma_anomalies", "RDMA anomalies detected, by rule.",
                                  labels=["kind"])
        for kind, n in self.counts().items():
            fam.add_metric([kind], n)
        return fam

    def _fire(self, kind: str, fired: list, **detail) -> None:
        self._counts[kind] += 1
        event = {"time": now_iso(), "event": "rdma_anomaly", "kind": kind, **detail}
        fired.append(event)
        self.emit(event)

    # -- counters: verbs and async events ---------------------------------
    def check_counters(self, snap: RdmaSnapshot, now: float) -> list[dict]:
        fired: list[dict] = []
        with self._lock:
            if self._started is None:
                self._started = now
            for key, count in snap.errors().items():
                op, err = key
                grew = count - self._verbs.get(key, 0)
                self._verbs[key] = count
                if op in DESTROY_OPS:
                    if grew > 0:
                        self._fire("destroy_failed", fired, op=op, errno=errno_name(err),
                                   failures=grew, total=count)
                    continue
                self._check_burst(key, count, now, fired)
            for key, count in snap.events.items():
                grew = count - self._events.get(key, 0)
                self._events[key] = count
                kind = EVENT_KIND.get(key[2])
                if kind and grew > 0:
                    dev, port, event = key
                    self._fire(kind, fired, device=snap.device_name(dev), port=port,
                               async_event=event, occurrences=grew)
        return fired

    def _check_burst(self, key, count: int, now: float, fired: list) -> None:
        window = self.config.burst_window_s
        history = self._history.setdefault(key, deque([(self._started, 0)]))
        history.append((now, count))
        # keep one sample at or before the window's start as the baseline
        while len(history) > 1 and history[1][0] <= now - window:
            history.popleft()
        in_window = count - history[0][1]
        if in_window >= self.config.burst_threshold and key not in self._bursting:
            self._bursting.add(key)
            op, err = key
            self._fire("error_burst", fired, op=op, errno=errno_name(err), errors=in_window,
                       window_s=window)
        elif in_window == 0:
            self._bursting.discard(key)

    # -- objects: owners that exited --------------------------------------
    def check_objects(self, snap: RdmaSnapshot, now: float) -> list[dict]:
        fired: list[dict] = []
        owners: dict[int, list] = {}
        for o in snap.objects:
            if o.user and o.tgid:
                owners.setdefault(o.tgid, []).append(o)
        with self._lock:
            for tgid in list(self._exited.since):
                if tgid not in owners:        # everything it held is gone
                    self._exited.clear(tgid)
            for tgid, objs in owners.items():
                if self.alive(tgid):
                    self._exited.clear(tgid)
                    continue
                since = self._exited.due(tgid, now, self.config.grace_s)
                if since is not None:
                    by_type: dict[str, int] = {}
                    for o in objs:
                        by_type[o.type] = by_type.get(o.type, 0) + 1
                    self._fire("leaked_objects", fired, pid=tgid, comm=objs[0].comm,
                               cgroup=self.cgroup_path(objs[0].cgroup_id),
                               devices=sorted({snap.device_name(o.device) for o in objs}),
                               objects=by_type, exited_for_s=round(now - since, 1))
        return fired

    # -- the mirror against the kernel's own tracker ----------------------
    def check_kernel_view(self, before: dict, kernel: dict, after: dict, now: float,
                          device_name: Callable[[int], str] = str) -> list[dict]:
        """`before`/`after`: mirror counts {(device, type): n} read just before
        and after `kernel` (the same from `rdma resource show`); a count the
        kernel reports between the two mirror readings is not a divergence."""
        fired: list[dict] = []
        with self._lock:
            for key in set(before) | set(kernel) | set(after):
                lo, hi = sorted((before.get(key, 0), after.get(key, 0)))
                if lo <= kernel.get(key, 0) <= hi:
                    self._diverged.clear(key)
                    continue
                since = self._diverged.due(key, now, self.config.grace_s)
                if since is not None:
                    dev, kind = key
                    self._fire("mirror_mismatch", fired, device=device_name(dev), type=kind,
                               mirror=after.get(key, 0), kernel=kernel.get(key, 0),
                               diverged_for_s=round(now - since, 1))
        return fired


class RdmaWatcher:
    """Feeds the detector from a running RdmaProbe, on the agent's detector
    schedule (every `interval`): counters each time, object owners every
    `object_interval`, and the kernel's own view every `kernel_interval`
    (it costs a netlink dump per check)."""

    name = "rdma"

    def __init__(self, probe, detector: RdmaDetector, kernel_view: Callable[[], dict],
                 interval: float = defaults.RDMA_DETECT_INTERVAL_S, object_interval: float = 1.0,
                 kernel_interval: float = 5.0):
        self.probe = probe
        self.detector = detector
        self.kernel_view = kernel_view
        self.interval = interval
        self.object_interval = object_interval
        self.kernel_interval = kernel_interval
        self._next_objects = 0.0
        self._next_kernel = 0.0
        self._kernel_ok = True

    def run_once(self, now: float) -> None:
        with_objects = now >= self._next_objects
        snap = self.probe.snapshot(objects=with_objects)
        self.detector.check_counters(snap, now)
        if not with_objects:
            return
        self._next_objects = now + self.object_interval
        self.detector.check_objects(snap, now)
        if self._kernel_ok and now >= self._next_kernel and "rdma.restrack" in self.probe.modes():
            self._next_kernel = now + self.kernel_interval
            try:
                kernel = self.kernel_view()
            except Exception as exc:  # noqa: BLE001 - e.g. no rdma tool: drop the rule, keep the rest
                log.warning("rdma detector: mirror check off: %s", exc)
                self._kernel_ok = False
                return
            after = self.probe.snapshot().object_counts()
            self.detector.check_kernel_view(snap.object_counts(), kernel, after, now,
                                            snap.device_name)

