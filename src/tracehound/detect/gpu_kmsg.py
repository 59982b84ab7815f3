"""GPU errors from the kernel log, merged with NVML's XID events: counts,
anomaly events with what the catalog says of them, and health transitions.

Sources call in on their own threads, never a scrape's:
  kernel_event(e)     the kernel-log watcher (gpu/kmsg.py), one driver line
  nvml_xid(gpu, ...)  the NVML event thread (collectors/gpu.py), one XID
  observe(obs)        the GPU detector's NVML reading, every few seconds
and run_once() runs on the detector schedule: it turns health changes into
`gpu_health` events. The collector (collectors/gpu_kmsg.py) only reads
snapshot() and health conditions.

XIDs go through one XidLedger (gpu/xid_ledger.py), so an XID NVML and the
kernel log both report is counted, and raises its anomaly event, once:
the event carries `source`, the first that reported it. Every event of an
XID, SXid, fallen-off-the-bus or failed adapter init carries the catalog's
name, severity and recommended action, the GPU (gpu/uuid/model when NVML
enumerated it, empty otherwise; pci_bus_id always when the line names
one) and the process the driver named (driver_pid, driver_process).

Label values are bounded (gpu/kmsg_labels.py): a bus id NVML did not
enumerate keeps its own label only among the first few (beside NVML; more
without it), an XID outside the catalog, an SXid number and a switch or
device name likewise; the rest are counted under "other" and in
tracehound_gpu_kmsg_folded_total. A folded bus id feeds no health rule (it
is not one GPU), so no line can make an enumerated GPU "lost" but one
naming its own bus id, and the health gauges stay bounded too. Events keep
the line's own values: they are bounded by the event buffer, not series.

Lines a first start reads back from the ring (no saved position: the
node's history, possibly hours old) are counted and feed the health rules,
which time them by the kernel's timestamp, but raise no event each: lines
the agent missed while down or across a reboot do.
"""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Callable

from .. import defaults
from ..gpu.health import GpuHealth, gpu_key
from ..gpu.kmsg import GpuKernelEvent
from ..gpu.kmsg_labels import (BUS_IDS_BESIDE_NVML, BUS_IDS_WITHOUT_NVML, DEVICE_NAMES, OTHER,
                               SXIDS, UNCATALOGUED_XIDS, FoldedLabels)
from ..gpu.xid_catalog import CATALOG, kernel_event_info, xid154_recovery_action
from ..gpu.xid_ledger import XidLedger
from . import now_iso
from .gpu import GpuDetector

IDENTITY = ("gpu", "uuid", "model", "pci_bus_id")
# an NVML event for a handle the agent did not enumerate
UNKNOWN_GPU = {"gpu": "unknown", "uuid": "unknown", "model": "unknown", "pci_bus_id": ""}


@dataclass
class KernelLogCounts:
    """A copy of every count, for one scrape."""
    xids: dict = field(default_factory=dict)          # (key, xid) -> n
    duplicates: dict = field(default_factory=dict)    # source -> n
    sxids: dict = field(default_factory=dict)         # (device, pci, sxid, severity) -> n
    fallen: dict = field(default_factory=dict)        # key -> n
    init_failed: dict = field(default_factory=dict)   # (pci, device) -> n
    xid_numbers: frozenset = frozenset()              # every XID number counted
    folded: dict = field(default_factory=dict)        # label -> reports folded into "other"


class GpuKernelLog:
    name = "gpu_kmsg"

    def __init__(self, detector: GpuDetector, *,
                 workload_labels: Callable[[int], dict] | None = None,
                 fatal_window_s: float = defaults.GPU_FATAL_XID_WINDOW_S,
                 ledger: XidLedger | None = None, health: GpuHealth | None = None,
                 clock: Callable[[], float] = time.monotonic,
                 interval: float = defaults.GPU_HEALTH_INTERVAL_S):
        self.detector = detector
        self.workload_labels = workload_labels
        self.clock = clock
        self.ledger = ledger or XidLedger(clock=clock)
        self.health = health or GpuHealth(fatal_window_s, clock=clock)
        self.interval = interval
        self._lock = threading.Lock()
        self._identity: dict[str, dict[str, str]] = {}
        self._sxids: dict[tuple[str, str, int, str], int] = {}
        self._fallen: dict[str, int] = {}
        self._init: dict[tuple[str, str], int] = {}
        self._numbers: set[int] = set()
        # label value -> itself or "other" (gpu/kmsg_labels.py), one bound per label
        self.bounds = {"pci_bus_id": FoldedLabels(BUS_IDS_WITHOUT_NVML),
                       "xid": FoldedLabels(UNCATALOGUED_XIDS, keep=CATALOG),
                       "sxid": FoldedLabels(SXIDS),
                       "device": FoldedLabels(DEVICE_NAMES)}

    def _bus(self, pci: str | None) -> str | None:
        return self.bounds["pci_bus_id"].label(pci)

    def _xid(self, number: int):
        return self.bounds["xid"].label(number)

    def set_gpus(self, gpus) -> None:
        """The GPUs NVML enumerated (gpu.device.Gpu): before any source starts."""
        gpus = list(gpus)
        with self._lock:
            for g in gpus:
                key = gpu_key(g)
                self._identity[key] = {**g.labels, "pci_bus_id": g.pci_bus_id}
                self.health.add(key)
        if gpus:    # NVML answers: few other bus ids are real
            self.bounds["pci_bus_id"].keep(map(gpu_key, gpus), cap=BUS_IDS_BESIDE_NVML)

    def identity(self, key: str | None) -> dict[str, str]:
        if key is None:
            return dict(UNKNOWN_GPU)
        with self._lock:
            known = self._identity.get(key)
        return dict(known) if known else {"gpu": "", "uuid": "", "model": "", "pci_bus_id": key}

    # -- sources -------------------------------------------------------------

    def nvml_xid(self, gpu, xid: int, processes: list[dict] = ()) -> None:
        key = gpu_key(gpu) if gpu is not None else None
        label = self._xid(xid)
        if not self.ledger.report("nvml", key, label):
            return
        self._counted(key, xid, label, None)
        self.detector.xid(self.identity(key), xid, processes, source="nvml",
                          **kernel_event_info("xid", xid))

    def kernel_event(self, e: GpuKernelEvent) -> None:
        # The kernel's timestamp (its sched clock, seconds since boot) is on
        # the event, so a line read back from the ring at start-up reads as
        # old. Rules time a line read live by its arrival: the sched clock can
        # drift from CLOCK_MONOTONIC by minutes over a long uptime, too much for
        # pairing NVML reports a moment apart; for replayed lines it only has
        # to tell old from recent.
        logged = {"uptime_seconds": round(e.usec / 1e6, 6)} if e.usec is not None else {}
        at = e.usec / 1e6 if e.replayed and e.usec is not None else None
        labels = self.identity(e.pci)     # a line naming no bus id: "unknown", as NVML's
        key = self._bus(e.pci)
        if e.kind == "xid":
            label = self._xid(e.number)
            if not self.ledger.report("kmsg", key, label, at):
                return
            self._counted(key, e.number, label, at)
            if e.history:
                return      # the ring's past at a first start: counted, not news
            extra = {}
            if e.gpu_instance is not None:
                extra["gpu_instance"] = e.gpu_instance
            if e.number == 154:
                extra["recovery_action"] = xid154_recovery_action(e.detail)
            self.detector.xid(labels, e.number, self._driver_process(e), source="kmsg",
                              detail=e.detail, driver_pid=e.pid, driver_process=e.process,
                              **extra, **logged, **kernel_event_info("xid", e.number))
            return
        if e.kind == "sxid":
            severity = {True: "fatal", False: "non_fatal"}.get(e.fatal, "unknown")
            k = (self.bounds["device"].label(e.device or ""), key or "",
                 self.bounds["sxid"].label(e.number), severity)
            with self._lock:
                self._sxids[k] = self._sxids.get(k, 0) + 1
            if e.history:
                return
            # a switch is not a GPU: its own pci_bus_id, no GPU identity
            self.detector.kernel({**dict.fromkeys(IDENTITY, ""), "pci_bus_id": e.pci or ""},
                                 "sxid", (), source="kmsg", sxid=e.number, device=e.device,
                                 fatal=e.fatal, detail=e.detail, **logged,
                                 **kernel_event_info("sxid", e.number, e.fatal))
            return
        if e.kind == "fallen_off_bus":
            with self._lock:
                self._fallen[key] = self._fallen.get(key, 0) + 1
            if key and key != OTHER:
                self.health.fallen_off_bus(key, at)
        elif e.kind == "init_failed":
            k = (key or "", self.bounds["device"].label(e.device or ""))
            with self._lock:
                self._init[k] = self._init.get(k, 0) + 1
        else:
            return
        if e.history:
            return
        self.detector.kernel(labels, e.kind, self._driver_process(e), source="kmsg",
                             device=e.device,
                             detail=e.detail, **logged, **kernel_event_info(e.kind))

    def observe(self, observations: list[dict]) -> list[dict]:
        """Feed NVML's reading of every GPU to the health rules; returns it
        unchanged, so it sits in the GPU detector's read chain."""
        for o in observations:
            key = o.get("key")
            if key is None:
                continue
            self.health.nvml(key, lost=o["lost"], ecc_pending=o.get("ecc_pending"),
                             row_remap_failure=o.get("row_remap_failure"),
                             clock_reasons=o.get("clock_reasons"),
                             nvlink_up=o.get("nvlink_up"))
        return observations

    def _counted(self, key: str | None, xid: int, label, at: float | None) -> None:
        """An XID counted under `label`: its number for the info metric when
        it kept its own label, and the health rules of a GPU (never of "other")."""
        if label == xid:
            with self._lock:
                self._numbers.add(xid)
        if key is not None and key != OTHER:
            self.health.xid(key, xid, at)

    def _driver_process(self, e: GpuKernelEvent) -> list[dict]:
        """The process the driver named, with its workload labels when it is
        still alive to ask about."""
        if e.pid is None:
            return []
        labels = {}
        if self.workload_labels is not None:
            try:
                labels = dict(self.workload_labels(e.pid) or {})
            except Exception:  # a process gone, a resolver hiccup: the pid alone
                labels = {}
        return [{**labels, "pid": e.pid, "name": e.process}]

    # -- detector schedule -----------------------------------------------------

    def run_once(self, now: float) -> None:
        for key, condition, active, detail in self.health.transitions():
            self.detector.emit({"time": now_iso(), "event": "gpu_health",
                                "condition": condition,
                                "state": "active" if active else "cleared",
                                **self.identity(key), **detail})

    # -- read side ------------------------------------------------------------

    def snapshot(self) -> KernelLogCounts:
        with self._lock:
            return KernelLogCounts(xids=self.ledger.counts(), duplicates=self.ledger.duplicates(),
                                   sxids=dict(self._sxids), fallen=dict(self._fallen),
                                   init_failed=dict(self._init),
                                   xid_numbers=frozenset(self._numbers),
                                   folded={name: f.folded for name, f in self.bounds.items()})
