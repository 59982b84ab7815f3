"""Bounded label values for what the kernel log names: bus ids, XIDs, SXids,
switch and device names.

A kernel log line names a bus id and a number, and each distinct one would
be a series of its own (an XID counter, two health gauges) and a key kept in
memory for the agent's life. Root can write any line to /dev/kmsg and a
broken board can log garbage, so the values are bounded: the ones the node
really has always keep their own label (the bus ids NVML enumerated, the
XIDs in the catalog), and at most `cap` others, first come first kept; any
further one is folded into the label value OTHER and counted.

Interface::

    buses = FoldedLabels(cap=8, keep={"0000:3b:00.0"})
    buses.label("0000:3b:00.0")    # "0000:3b:00.0": always kept
    buses.label("0000:99:00.0")    # itself, while fewer than 8 others were kept
    buses.label(...)               # OTHER once 8 others are kept
    buses.folded                   # reports folded so far
"""
from __future__ import annotations

import threading
from collections.abc import Hashable, Iterable

OTHER = "other"

# Bus ids the kernel log may name beside the GPUs NVML enumerated: NVSwitches
# (up to 6 on an HGX board) and a GPU lost before NVML could name it.
BUS_IDS_BESIDE_NVML = 8
# Without NVML nothing says which bus ids are real: the largest nodes have 16
# GPUs and 12 NVSwitches.
BUS_IDS_WITHOUT_NVML = 32
# XIDs outside the catalog (a newer driver's), SXid numbers (not catalogued),
# switch names and device minors each keep this many values of their own
UNCATALOGUED_XIDS = 32
SXIDS = 64
DEVICE_NAMES = 32


class FoldedLabels:
    """Thread-safe: several sources' threads ask, scrapes read `folded`."""

    def __init__(self, cap: int, keep: Iterable[Hashable] = ()):
        self.cap = cap
        self._keep = frozenset(keep)
        self._others: set = set()
        self._lock = threading.Lock()
        self.folded = 0

    def keep(self, values: Iterable[Hashable], cap: int | None = None) -> None:
        """Values that always keep their label (known to be real); `cap`
        replaces the number of others kept from now on."""
        with self._lock:
            self._keep = self._keep | frozenset(values)
            if cap is not None:
                self.cap = cap

    def label(self, value):
        """`value` itself, or OTHER once `cap` other values were kept."""
        if value is None or value in self._keep:
            return value
        with self._lock:
            if value in self._others:
                return value
            if len(self._others) < self.cap:
                self._others.add(value)
                return value
            self.folded += 1
            return OTHER
