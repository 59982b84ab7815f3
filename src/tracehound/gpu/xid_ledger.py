"""One count per XID, whichever source reports it first.

The driver reports an XID twice: as an NVML event and as an "NVRM: Xid" line
in the kernel log. Either can arrive first (two threads, two wake-ups), a
moment apart. The ledger counts a report unless it pairs with a report of
the *other* source for the same (PCI bus id, XID) that arrived at most
`window_s` earlier and has not been paired yet; a pair is one XID.

Consequences, by design:
  - a burst of N identical XIDs seen by both sources counts N (pairs are
    one to one), never 2N and never 1;
  - two reports from the same source always count twice: the driver
    reports each occurrence once per source;
  - a report whose GPU is unknown (an NVML event for a handle the agent did
    not enumerate) has no key to pair by and always counts;
  - when one source misses a report (a kernel ring overrun), the other
    still counts it; two different XIDs never pair;
  - a report says when it happened where it knows (`at`: the kernel log's
    timestamp): a line read back from the ring at start-up, logged long
    before, is its own XID and never swallows a new NVML report.

Interface::

    ledger = XidLedger(window_s=5.0)
    ledger.report("nvml", "0000:3b:00.0", 79)     # True: counted
    ledger.report("kmsg", "0000:3b:00.0", 79)     # False: the same XID
    ledger.counts()       # {("0000:3b:00.0", 79): 1}
    ledger.duplicates()   # {"kmsg": 1}: reports folded into an earlier one
"""
from __future__ import annotations

import threading
import time
from collections import deque
from typing import Callable

SOURCES = ("nvml", "kmsg")
# Both reports come from one driver call; seconds apart would already be a
# second occurrence. Wide enough for a busy node's scheduling delays.
DEDUP_WINDOW_S = 5.0
# unpaired reports kept per key: a storm of one XID must not grow memory
MAX_PENDING = 256


class XidLedger:
    def __init__(self, window_s: float = DEDUP_WINDOW_S,
                 clock: Callable[[], float] = time.monotonic):
        self.window_s = window_s
        self.clock = clock
        self._lock = threading.Lock()
        self._counts: dict[tuple[str | None, int], int] = {}
        self._dups: dict[str, int] = dict.fromkeys(SOURCES, 0)
        # (key, xid) -> unpaired counted reports, oldest first: (source, time)
        self._pending: dict[tuple[str, int], deque] = {}

    def report(self, source: str, key: str | None, xid: int, at: float | None = None) -> bool:
        """True when this report is a new XID (count it, raise the event).
        `at`: when it happened on the clock's time base, if the source says."""
        now = self.clock()
        t = now if at is None else min(at, now)
        with self._lock:
            if key is not None and self._pair(source, (key, xid), t, now):
                self._dups[source] = self._dups.get(source, 0) + 1
                return False
            self._counts[(key, xid)] = self._counts.get((key, xid), 0) + 1
            if key is not None and now - t <= self.window_s:
                self._pending.setdefault((key, xid), deque(maxlen=MAX_PENDING)).append(
                    (source, t))
            return True

    def _pair(self, source: str, k: tuple[str, int], t: float, now: float) -> bool:
        q = self._pending.get(k)
        if not q:
            return False
        while q and now - q[0][1] > self.window_s:
            q.popleft()
        for i, (other, when) in enumerate(q):
            if other != source and abs(t - when) <= self.window_s:
                del q[i]
                break
        else:
            if not q:
                del self._pending[k]
            return False
        if not q:
            del self._pending[k]
        return True

    def counts(self) -> dict[tuple[str | None, int], int]:
        with self._lock:
            return dict(self._counts)

    def duplicates(self) -> dict[str, int]:
        with self._lock:
            return dict(self._dups)
