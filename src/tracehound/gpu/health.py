"""Per-GPU health conditions from the kernel log and NVML, with their rules.

Pure: no I/O, time from `clock` (CLOCK_MONOTONIC seconds, the base of the
kernel log's timestamps), so every rule is tested with a fake clock.

A GPU is keyed by its PCI bus id ("0000:3b:00.0"), the one name both the
kernel log and NVML give it; NVML GPUs without one are keyed "nvml:<index>".

Conditions (1 active, 0 cleared; a condition whose input is unknown for a
GPU is left out, never reported as 0):
  lost                      the kernel logged the GPU falling off the bus
                            (or XID 79), until NVML answers for it again
                            after that line; or NVML says GPU_IS_LOST now
  uncorrectable_ecc_pending a page retirement or row remap waits for a GPU
                            reset (NVML; both follow uncorrectable errors)
  row_remap_failure         NVML: a row remap failed (the GPU needs service)
  thermal_slowdown          NVML: a software or hardware thermal clock-event
                            reason holds the clocks down
  nvlink_down               NVML: a link that was up is down now (a link NVML
                            did not answer for keeps its last state; links never
                            seen up are unused, not down)
  recent_fatal_xid          a fatal-severity XID (xid_catalog) was logged
                            within the last `fatal_window_s` seconds; clears
                            on its own when the window passes
"""
from __future__ import annotations

import threading
import time
from typing import Callable

from .. import defaults
from ..conditions import GPU as GPU_CONDITIONS
from .xid_catalog import FATAL, lookup

# the condition labels, as health and explain know them too (conditions.py)
CONDITIONS = tuple(c.gauge for c in GPU_CONDITIONS)
THERMAL_REASONS = frozenset({"sw_thermal_slowdown", "hw_thermal_slowdown"})
FALLEN_OFF_BUS_XID = 79

# (key, condition, active, detail) for one change of state
Transition = tuple[str, str, bool, dict]


def gpu_key(gpu) -> str:
    """The key of an NVML GPU (gpu.device.Gpu): its PCI bus id, the name the
    kernel log knows it by; nvml:<index> for a GPU lost before NVML said."""
    return gpu.pci_bus_id or f"nvml:{gpu.index}"


def pending_reset(sample) -> int | None:
    """uncorrectable_ecc_pending of an NVML sample (gpu.device.GpuSample): a
    row remap (Ampere and later) or a page retirement waiting for a reset."""
    if sample.row_remap_pending is not None:
        return sample.row_remap_pending
    return sample.retired_pages_pending


class GpuHealth:
    """Thread-safe: the kernel log thread, the NVML event thread and the
    detector schedule feed it; scrapes read it."""

    def __init__(self, fatal_window_s: float = defaults.GPU_FATAL_XID_WINDOW_S,
                 clock: Callable[[], float] = time.monotonic):
        self.fatal_window_s = fatal_window_s
        self.clock = clock
        self._lock = threading.Lock()
        self._keys: set[str] = set()
        self._kernel_lost: dict[str, float] = {}        # key -> when the log said so
        self._fatal: dict[str, tuple[float, int]] = {}  # key -> (when, xid) of the newest
        # key -> fatal xid -> when it was last logged: what a drain reason names
        self._fatal_xids: dict[str, dict[int, float]] = {}
        self._nvml: dict[str, dict[str, int]] = {}      # key -> NVML-derived conditions
        self._links: dict[str, dict[int, bool]] = {}   # key -> link -> last known state
        self._links_seen_up: dict[str, set[int]] = {}
        self._reported: dict[tuple[str, str], int] = {}

    def add(self, key: str) -> None:
        """A GPU to report from the start (lost and recent_fatal_xid at 0)."""
        with self._lock:
            self._keys.add(key)

    # -- inputs ----------------------------------------------------------

    def xid(self, key: str, xid: int, at: float | None = None) -> None:
        """An XID counted for this GPU, logged at `at` (default now)."""
        at = self._when(at)
        with self._lock:
            self._keys.add(key)
            if lookup(xid).severity == FATAL:
                newest = self._fatal.get(key)
                if newest is None or at >= newest[0]:
                    self._fatal[key] = (at, xid)
                seen = self._fatal_xids.setdefault(key, {})
                seen[xid] = max(at, seen.get(xid, at))
            if xid == FALLEN_OFF_BUS_XID:
                self._lost_at(key, at)

    def fallen_off_bus(self, key: str, at: float | None = None) -> None:
        at = self._when(at)
        with self._lock:
            self._keys.add(key)
            self._lost_at(key, at)

    def _lost_at(self, key: str, at: float) -> None:
        self._kernel_lost[key] = max(at, self._kernel_lost.get(key, at))

    def _when(self, at: float | None) -> float:
        # a kernel timestamp a hair ahead of our clock is "now", not the future
        now = self.clock()
        return now if at is None else min(at, now)

    def nvml(self, key: str, *, lost: bool, ecc_pending: int | None = None,
             row_remap_failure: int | None = None, clock_reasons=None,
             nvlink_up: dict[int, bool] | None = None) -> None:
        """One NVML reading of one GPU (GpuCollector.observations)."""
        now = self.clock()
        with self._lock:
            self._keys.add(key)
            got: dict[str, int] = {"lost": int(lost)}
            if not lost:
                # answering after the log said it fell off: it was reset
                if key in self._kernel_lost and self._kernel_lost[key] < now:
                    del self._kernel_lost[key]
                if ecc_pending is not None:
                    got["uncorrectable_ecc_pending"] = int(bool(ecc_pending))
                if row_remap_failure is not None:
                    got["row_remap_failure"] = int(bool(row_remap_failure))
                if clock_reasons is not None:
                    got["thermal_slowdown"] = int(bool(THERMAL_REASONS & set(clock_reasons)))
                if nvlink_up is not None:
                    links = self._links.setdefault(key, {})
                    links.update(nvlink_up)
                    seen = self._links_seen_up.setdefault(key, set())
                    seen.update(link for link, up in nvlink_up.items() if up)
                    got["nvlink_down"] = int(any(not links[link] for link in seen))
            else:
                # what a lost GPU last said is stale; keep only the link memory
                got.update({c: v for c, v in self._nvml.get(key, {}).items()
                            if c == "nvlink_down"})
            self._nvml[key] = got

    # -- outputs -----------------------------------------------------------

    def conditions(self, now: float | None = None) -> dict[str, dict[str, int]]:
        """key -> condition -> 1/0, as of `now`; read-only."""
        now = self.clock() if now is None else now
        with self._lock:
            return {key: self._of(key, now) for key in sorted(self._keys)}

    def _of(self, key: str, now: float) -> dict[str, int]:
        nv = self._nvml.get(key, {})
        out = {c: nv[c] for c in CONDITIONS if c in nv}
        out["lost"] = int(bool(nv.get("lost")) or key in self._kernel_lost)
        fatal = self._fatal.get(key)
        out["recent_fatal_xid"] = int(fatal is not None and now - fatal[0] < self.fatal_window_s)
        return out

    def recent_fatal_xids(self, now: float | None = None) -> dict[str, dict[int, float]]:
        """key -> fatal XID -> seconds since it was last logged, for the
        XIDs logged within the window alone (what `tracehound health` names:
        an XID older than the window no longer holds)."""
        now = self.clock() if now is None else now
        with self._lock:
            return {key: {x: now - at for x, at in sorted(xids.items())
                          if now - at < self.fatal_window_s}
                    for key, xids in sorted(self._fatal_xids.items())
                    if any(now - at < self.fatal_window_s for at in xids.values())}

    def transitions(self, now: float | None = None) -> list[Transition]:
        """What changed since the last call (a condition first seen active
        counts; first seen cleared does not). For the detector schedule."""
        now = self.clock() if now is None else now
        out = []
        with self._lock:
            for key in sorted(self._keys):
                for cond, value in self._of(key, now).items():
                    before = self._reported.get((key, cond), 0)
                    if value != before:
                        self._reported[(key, cond)] = value
                        out.append((key, cond, bool(value), self._detail(key, cond)))
        return out

    def _detail(self, key: str, cond: str) -> dict:
        if cond == "recent_fatal_xid" and key in self._fatal:
            return {"xid": self._fatal[key][1], "window_seconds": self.fatal_window_s}
        return {}
