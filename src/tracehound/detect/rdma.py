"""RDMA anomaly rules over snapshots of the probe's maps and the kernel's view.

  leaked_objects   objects still owned by a process that exited, after a grace
                   period (the kernel frees them when the last uverbs file
                   reference goes; if they stay, teardown failed or leaked)
  destroy_failed   a destroy verb returned an error (the object stays)
  mirror_mismatch  the BPF mirror and `rdma resource show` disagree on how many
                   objects of a type a device holds, beyond the grace period
  app_only_objects     a process holds objects (by libibverbs) the kernel does
                       not, beyond the grace period (rdma_views.py)
  kernel_only_objects  the kernel holds objects of a process that the process
                       released with a destroy that failed, or never saw
  error_burst      errors of one (op, errno) in one cgroup within a sliding
                   window reached the threshold
  port_error, device_fatal, qp_error   the matching asynchronous events
  link_flap, link_restored             a port left ACTIVE and came back (rdma_ports.py)

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
from ..probes.rdma_app import mapped_by
from ..probes.rdma_maps import DESTROY_OPS, RdmaSnapshot, app_key, errno_name
from . import log_event, now_iso
from .rdma_ports import KINDS as PORT_KINDS
from .rdma_views import IDENTITY, Comparison, compare

log = logging.getLogger(__name__)

KINDS = ("leaked_objects", "destroy_failed", "mirror_mismatch", "app_only_objects",
         "kernel_only_objects", "error_burst", "port_error", "device_fatal", "qp_error",
         *PORT_KINDS)
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
                 cgroup_path: Callable[[int], str] = str,
                 workload: Callable[[str], dict] = lambda path: {}):
        self.config = config or RdmaDetectorConfig()
        self.emit = emit
        self.alive = alive
        self.cgroup_path = cgroup_path
        self.workload = workload
        self._lock = threading.Lock()
        self._counts = dict.fromkeys(KINDS, 0)
        self._started: float | None = None
        self._exited = _Persisting()      # owners gone, objects still held (by tgid)
        self._verbs: dict[tuple[str, int], int] = {}
        self._history: dict[tuple[str, int], deque] = {}
        self._bursting: set[tuple[str, int]] = set()
        self._events: dict[tuple[int, int, str], int] = {}
        self._diverged = _Persisting()     # mirror vs kernel, by (device, type)
        self._views = _Persisting()        # app vs kernel, by (tgid, device, type, side)

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

    def owner(self, cgroup_id: int) -> dict:
        """cgroup and workload fields of an event about cgroup `cgroup_id`."""
        path = self.cgroup_path(cgroup_id)
        return {"cgroup": path, **self.workload(path)}

    def fire(self, kind: str, **detail) -> dict:
        """Report an anomaly found outside this detector's own rules."""
        fired: list = []
        with self._lock:
            self._fire(kind, fired, **detail)
        return fired[0]

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
            errors = snap.errors()
            for key in [k for k in self._verbs if k not in errors]:   # retired with their cgroup
                del self._verbs[key]
                self._history.pop(key, None)
                self._bursting.discard(key)
            for key, count in errors.items():
                op, err, cgroup_id = key
                grew = count - self._verbs.get(key, 0)
                self._verbs[key] = count
                if op in DESTROY_OPS:
                    if grew > 0:
                        self._fire("destroy_failed", fired, op=op, errno=errno_name(err),
                                   failures=grew, total=count, **self.owner(cgroup_id))
                    continue
                self._check_burst(key, count, now, fired)
            for key, count in [*snap.events.items(), *snap.qp_events.items()]:
                grew = count - self._events.get(key, 0)
                self._events[key] = count
                kind = EVENT_KIND.get(key[2])
                if kind and grew > 0:
                    dev, port, event, *owned = key
                    # a QP event names the QP's owner
                    who = {"pid": owned[0], **self.owner(owned[1])} if owned else {}
                    self._fire(kind, fired, device=snap.device_name(dev), port=port,
                               async_event=event, occurrences=grew, **who)
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
            op, err, cgroup_id = key
            self._fire("error_burst", fired, op=op, errno=errno_name(err), errors=in_window,
                       window_s=window, **self.owner(cgroup_id))
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
                    unreleased = sum(1 for a in snap.app_objects if a.tgid == tgid)
                    self._fire("leaked_objects", fired, pid=tgid, comm=objs[0].comm,
                               **self.owner(objs[0].cgroup_id),
                               devices=sorted({snap.device_name(o.device) for o in objs}),
                               objects=by_type, exited_for_s=round(now - since, 1),
                               **({"app_never_released": unreleased} if unreleased else {}))
        return fired

    # -- the application's view against the kernel's ----------------------
    def check_views(self, snap: RdmaSnapshot, now: float, since_ns: int) -> Comparison:
        """Compare what libibverbs handed each process with the kernel's
        objects; returns the comparison (its stale records are to drop)."""
        cmp = compare(snap, since_ns)
        fired: list[dict] = []
        seen = set()
        with self._lock:
            for d in cmp.disagreements:
                # a process that exited: the kernel freed its objects, its own
                # records wait to be dropped (the leak rule watches the kernel)
                if not self.alive(d.tgid):
                    continue
                base = {"pid": d.tgid, "comm": d.comm, **self.owner(d.cgroup_id),
                        "device": d.device, "type": d.type}
                ident = IDENTITY.get(d.type, "handle")
                if d.app_only_count:
                    key = (d.tgid, d.device, d.type, "app")
                    seen.add(key)
                    since = self._views.due(key, now, self.config.grace_s)
                    if since is not None:
                        self._fire("app_only_objects", fired, **base, count=d.app_only_count,
                                   **({ident + "s": d.app_only} if d.app_only else {}),
                                   disagreeing_for_s=round(now - since, 1))
                if d.kernel_only_count:
                    key = (d.tgid, d.device, d.type, "kernel")
                    seen.add(key)
                    since = self._views.due(key, now, self.config.grace_s)
                    if since is not None:
                        self._fire("kernel_only_objects", fired, **base,
                                   count=d.kernel_only_count,
                                   released_by_app=[{ident: i, "destroy_errno": errno_name(e)}
                                                    for i, e in d.released],
                                   never_seen_by_app=d.unseen or d.unseen_count,
                                   disagreeing_for_s=round(now - since, 1))
            for key in list(self._views.since):
                if key not in seen:
                    self._views.clear(key)
        return cmp

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
        self._looked_at: set[int] = set()     # processes whose libraries were looked for
        self._gone_since: dict[int, float] = {}
        # cgroups holding user RDMA objects at the last look: their data moves
        # by RDMA, which no progress source counts
        self.holders: frozenset[int] = frozenset()

    def _check_views(self, snap, now: float) -> None:
        cmp = self.detector.check_views(snap, now, self.probe.app_since_ns)
        drop = list(cmp.stale)
        # records of processes gone for the grace period: the kernel's leak
        # rule has had its look at them
        tgids = {o.tgid for o in snap.app_objects}
        for tgid in tgids:
            if self.detector.alive(tgid):
                self._gone_since.pop(tgid, None)
            elif now - self._gone_since.setdefault(tgid, now) >= self.detector.config.grace_s:
                drop += [o for o in snap.app_objects if o.tgid == tgid]
                del self._gone_since[tgid]
        for tgid in list(self._gone_since):
            if tgid not in tgids:
                del self._gone_since[tgid]
        if drop:
            self.probe.forget_app_objects([app_key(o) for o in drop])
        # a process with kernel objects the application view never saw may
        # map a libibverbs of its own (a container's): attach to it too, in
        # one call, so one time budget bounds the look at all of them
        mapped: dict[int, set] = {}
        for o in snap.objects:
            if o.user and o.tgid not in cmp.covered and o.tgid not in self._looked_at \
                    and o.created_ns >= self.probe.app_since_ns:
                self._looked_at.add(o.tgid)
                mapped[o.tgid] = mapped_by(o.tgid)
        if mapped:
            self.probe.attach_libraries(set().union(*mapped.values()))
            # a file left for later (the scan's budget spent, a parse over its
            # own) is looked at again on the next turn, through its process
            later = self.probe.app_unsettled()
            self._looked_at -= {tgid for tgid, libs in mapped.items() if libs & later}
        self._looked_at &= {o.tgid for o in snap.objects}

    def run_once(self, now: float) -> None:
        with_objects = now >= self._next_objects
        snap = self.probe.snapshot(objects=with_objects)
        self.detector.check_counters(snap, now)
        if not with_objects:
            return
        self._next_objects = now + self.object_interval
        self.holders = frozenset(o.cgroup_id for o in snap.objects if o.user)
        self.detector.check_objects(snap, now)
        if "rdma.app" in self.probe.modes():
            self._check_views(snap, now)
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

