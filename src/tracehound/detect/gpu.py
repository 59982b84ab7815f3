"""GPU anomaly rules: new XID, uncorrectable ECC increase, row-remap failure,
thermal/power slowdown, GPU lost, NUMA misplacement, an NVLink link gone down.

Each anomaly is one JSON line on the `tracehound.events` logger and one
increment of tracehound_gpu_anomalies_total{gpu,uuid,kind}. Rules fire on a
transition (a count that grew, a state that switched on), never again while
the state persists, so a scrape every few seconds does not flood the log.
"""
from __future__ import annotations

import threading
from typing import Callable

from prometheus_client.core import CounterMetricFamily

from .. import defaults
from . import log_event, now_iso

KINDS = ("xid", "ecc_uncorrectable", "row_remap_failure", "thermal_slowdown",
         "power_slowdown", "hw_slowdown", "gpu_lost", "numa_misplaced", "nvlink_down")
# reported by the kernel log only (detect/gpu_kmsg.py); not pre-seeded per GPU
KERNEL_KINDS = ("sxid", "fallen_off_bus", "init_failed")

# Clock-event reason -> anomaly kind. sw_power_cap is left out on purpose: a
# training GPU at full load sits at its power cap, which is normal operation.
SLOWDOWN_KIND = {
    "sw_thermal_slowdown": "thermal_slowdown",
    "hw_thermal_slowdown": "thermal_slowdown",
    "hw_power_brake_slowdown": "power_slowdown",
    # NVML sets this for heat, a power brake or a power spike alike
    "hw_slowdown": "hw_slowdown",
}

Emit = Callable[[dict], None]
Labels = dict  # {"gpu", "uuid", "model"}
Process = dict  # {"pid": int, **workload labels}


class GpuDetector:
    """Thread-safe: XIDs arrive from the event thread, the rest from scrapes."""

    def __init__(self, emit: Emit = log_event):
        self.emit = emit
        self._lock = threading.Lock()
        self._counts: dict[tuple[str, str, str], int] = {}
        self._uncorrected: dict[tuple[str, str], int] = {}
        self._remap_failed: set[tuple[str, str]] = set()
        self._slowdowns: dict[tuple[str, str], set[str]] = {}
        self._lost: set[tuple[str, str]] = set()
        self._misplaced: dict[tuple[str, str], set[int]] = {}
        self._links_up: dict[tuple[str, str], set[int]] = {}     # links seen active
        self._links_down: dict[tuple[str, str], set[int]] = {}   # of those, inactive now

    @staticmethod
    def _key(labels: Labels) -> tuple[str, str]:
        return labels["gpu"], labels["uuid"]

    def add_gpu(self, labels: Labels) -> None:
        """Export every kind at 0 from the start so rate() and increase() work."""
        with self._lock:
            for kind in KINDS:
                self._counts.setdefault((*self._key(labels), kind), 0)

    def _fire(self, labels: Labels, kind: str, processes=(), **detail) -> None:
        key = (*self._key(labels), kind)
        self._counts[key] = self._counts.get(key, 0) + 1
        event = {"time": now_iso(), "event": "gpu_anomaly", "kind": kind, **labels, **detail}
        if processes:
            event["processes"] = list(processes)
        self.emit(event)

    def xid(self, labels: Labels, xid: int, processes: list[Process] = (), **detail) -> None:
        """Every XID event is news: the driver reports each occurrence once."""
        with self._lock:
            self._fire(labels, "xid", processes, xid=xid, **detail)

    def kernel(self, labels: Labels, kind: str, processes: list[Process] = (), **detail) -> None:
        """A kernel-log report of one of KERNEL_KINDS: each line is news."""
        with self._lock:
            self._fire(labels, kind, processes, **detail)

    def gpu_lost(self, labels: Labels, lost: bool) -> None:
        key = self._key(labels)
        with self._lock:
            if lost and key not in self._lost:
                self._lost.add(key)
                self._fire(labels, "gpu_lost")
            elif not lost:
                self._lost.discard(key)

    def observe(self, labels: Labels, *, uncorrected_ecc: int | None,
                row_remap_failure: int | None, clock_reasons: set[str],
                processes: list[Process] = ()) -> None:
        """One scrape's reading of one answering GPU."""
        key = self._key(labels)
        with self._lock:
            if uncorrected_ecc is not None:
                before = self._uncorrected.get(key)
                # the first reading is a baseline: errors from before the
                # agent started are history, not a new anomaly
                if before is not None and uncorrected_ecc > before:
                    self._fire(labels, "ecc_uncorrectable", processes,
                               count=uncorrected_ecc, increase=uncorrected_ecc - before)
                self._uncorrected[key] = uncorrected_ecc
            if row_remap_failure is not None:
                if row_remap_failure and key not in self._remap_failed:
                    self._remap_failed.add(key)
                    self._fire(labels, "row_remap_failure", processes)
                elif not row_remap_failure:
                    self._remap_failed.discard(key)
            active = {r for r in clock_reasons if r in SLOWDOWN_KIND}
            seen = self._slowdowns.setdefault(key, set())
            for reason in sorted(active - seen):
                self._fire(labels, SLOWDOWN_KIND[reason], processes, reason=reason)
            self._slowdowns[key] = active

    def misplacement(self, labels: Labels, misplaced: dict[int, tuple[Process, dict]]) -> None:
        """misplaced: pid -> (process record, NUMA detail) for every process
        misplaced on this GPU now; a pid that leaves the set may fire again."""
        key = self._key(labels)
        with self._lock:
            seen = self._misplaced.setdefault(key, set())
            for pid in sorted(set(misplaced) - seen):
                proc, detail = misplaced[pid]
                self._fire(labels, "numa_misplaced", [proc], **detail)
            self._misplaced[key] = set(misplaced)

    def nvlinks(self, labels: Labels, nvlink_up: dict[int, bool] | None,
                processes: list[Process] = ()) -> None:
        """A link seen active that is inactive now fires once per going
        down; a link never seen active (unused, cabled off) never does."""
        if nvlink_up is None:
            return
        key = self._key(labels)
        with self._lock:
            seen = self._links_up.setdefault(key, set())
            seen.update(link for link, up in nvlink_up.items() if up)
            # a link NVML did not answer for this time keeps its last state
            before = self._links_down.get(key, set())
            down = ({link for link in seen if nvlink_up.get(link) is False}
                    | {link for link in before if link not in nvlink_up})
            for link in sorted(down - before):
                self._fire(labels, "nvlink_down", processes, link=link)
            self._links_down[key] = down

    name = "gpu_detector"

    def collect(self):
        yield self.family()

    def family(self) -> CounterMetricFamily:
        fam = CounterMetricFamily("tracehound_gpu_anomalies",
                                  "GPU anomalies detected (one per transition).",
                                  labels=["gpu", "uuid", "kind"])
        with self._lock:
            for (gpu, uuid, kind), n in sorted(self._counts.items()):
                fam.add_metric([gpu, uuid, kind], n)
        return fam


class GpuWatcher:
    """Feeds the detector on the agent's detector schedule: `read()` returns
    one observation per GPU (see GpuCollector.observations)."""

    name = "gpu"

    def __init__(self, read: Callable[[], list[dict]], detector: GpuDetector,
                 interval: float = defaults.GPU_DETECT_INTERVAL_S):
        self.read = read
        self.detector = detector
        self.interval = interval

    def run_once(self, now: float) -> None:
        seen = self.read()
        for o in seen:
            self.detector.gpu_lost(o["labels"], o["lost"])
        answering = [o for o in seen if not o["lost"]]
        for o in answering:
            self.detector.misplacement(o["labels"], o["misplaced"])
        for o in answering:
            self.detector.observe(o["labels"], uncorrected_ecc=o["uncorrected_ecc"],
                                  row_remap_failure=o["row_remap_failure"],
                                  clock_reasons=o["clock_reasons"], processes=o["processes"])
            self.detector.nvlinks(o["labels"], o.get("nvlink_up"), o["processes"])
