"""cgroup id -> path relative to the root of the hierarchy counted by.

The probes count by the kernfs node id of the task's cgroup in that
hierarchy (cgroup_layout.py: the v2 tree, or one v1 controller's), which is
the inode number of its directory there, in cgroup2fs and v1 cgroupfs alike.
"""
from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Iterable

from .cgroup_watch import CgroupWatcher

log = logging.getLogger(__name__)

# How long an id no rescan can place is given before it is judged removed: a
# cgroup created just after a rescan is unknown until the watcher reports it
# (or the next round rescans), and judging it dead at once would retire a
# living cgroup's counters under "unknown:ID". A second later, a rescan that
# still cannot place it means it is gone and its name was never learnt.
UNPLACED_SETTLE_S = 1.0


class CgroupResolver:
    """Resolves ids by walking the hierarchy; at most one walk per scrape
    (call new_scrape() first), however many unknown ids the scrape meets.
    With watch(), paths of new cgroups are learnt as they are created, so
    even a cgroup gone before the next scrape keeps its name."""

    def __init__(self, root: str, settle_s: float = UNPLACED_SETTLE_S, clock=time.monotonic):
        self.root = root.rstrip("/") or "/"
        self._paths: dict[int, str] = {}
        self._ino_of: dict[str, int] = {}
        # removed, unreferenced ids the last retain() found: the next forgets them
        self._unused: set[int] = set()
        self._lock = threading.Lock()
        self._watcher: CgroupWatcher | None = None
        # the first lookup walks the tree, unless watch() has walked it already
        self._may_rescan = True
        self._alive: dict[int, bool] = {}
        # ids met that no rescan could place, and when first met so
        self._unplaced: dict[int, float] = {}
        self._scanned_at = float("-inf")
        self.settle_s = settle_s
        self.clock = clock
        # the kernel's name for an id (probes/cgroup_names.py), asked before
        # a rescan: it cannot have missed a cgroup that came and went
        self.names: Callable[[int], str | None] | None = None

    def watch(self) -> None:
        try:
            self._watcher = CgroupWatcher(self.root, self._created, self._removed).start()
            self._may_rescan = False
        except OSError as exc:
            log.warning("cgroup names are learnt at scrapes only (inotify: %s)", exc)

    def close(self) -> None:
        if self._watcher is not None:
            self._watcher.close()
            self._watcher = None

    def _created(self, ino: int, rel: str) -> None:
        with self._lock:
            self._paths[ino] = rel
            self._ino_of[rel] = ino
        self._check_names(ino, rel)

    def _check_names(self, ino: int, rel: str) -> None:
        """The kernel names cgroups from its hierarchy's root; this tree may
        start lower (a cgroup namespace of the agent's own). Then every name
        it gives ends with the one found here but is longer: stop asking."""
        names = self.names
        if names is None or rel == "/":
            return
        named = names(ino)
        if named is not None and named != rel and named.endswith(rel):
            log.warning("cgroup names from the kernel (%s) start above %s (%s): "
                        "not used", named, self.root, rel)
            self.names = None

    def _removed(self, rel: str) -> None:
        with self._lock:
            self._ino_of.pop(rel, None)

    def retain(self, in_use: Iterable[int]) -> list[tuple[int, str]]:
        """Forget the paths of removed cgroups nothing refers to any more:
        memory follows the cgroups that exist, not all that ever did. A path
        goes at the second call that finds it unused, not the first: a cgroup
        created and removed since its users last looked (they retire on the
        same schedule, before this) keeps its name for their next look.
        Returns the (id, path) pairs forgotten."""
        keep = set(in_use)
        with self._lock:
            keep.update(self._ino_of.values())     # cgroups that exist now
            unused = {ino for ino in self._paths if ino not in keep}
            dropped = [(ino, self._paths.pop(ino)) for ino in unused & self._unused]
            self._unused = unused - self._unused
        return dropped

    def new_scrape(self) -> None:
        self._may_rescan = True
        self._alive: dict[int, bool] = {}

    def alive(self, cgroup_id: int) -> bool:
        """Whether the cgroup exists, as far as this round can tell. Its
        directory's inode is its id. An id no rescan can place is not alive
        either: a cgroup created and removed between two looks, or one newer
        than this round's rescan (removed() tells them apart)."""
        known = self._alive.get(cgroup_id)
        if known is not None:
            return known
        p = self._lookup(cgroup_id)
        ok = False
        if p is not None:
            try:
                ok = os.stat(self.root + ("" if p == "/" else p)).st_ino == cgroup_id
            except OSError:
                ok = False
        self._alive[cgroup_id] = ok
        if p is None:
            self._unplaced.setdefault(cgroup_id, self.clock())
        else:
            self._unplaced.pop(cgroup_id, None)
        return ok

    def removed(self, cgroup_id: int) -> bool:
        """Whether the cgroup is gone for good, so its counters may be
        retired: its directory is gone, or no rescan since settle_s after it
        was first met could place it. An id met for the first time and not
        placed yet (a cgroup newer than the round's rescan) is not removed."""
        if self.alive(cgroup_id):
            return False
        first = self._unplaced.get(cgroup_id)
        return first is None or self._scanned_at - first >= self.settle_s

    def forget(self, cgroup_id: int) -> None:
        """Drop a removed cgroup once its last values were exported."""
        with self._lock:
            self._paths.pop(cgroup_id, None)
            self._unplaced.pop(cgroup_id, None)

    def _scan(self) -> None:
        self._may_rescan = False
        self._scanned_at = self.clock()
        root_len = len(self.root)
        found: dict[str, int] = {}
        for dirpath, _dirs, _files in os.walk(self.root):
            try:
                found[dirpath[root_len:] or "/"] = os.stat(dirpath).st_ino
            except OSError:
                continue
        with self._lock:
            for rel, ino in found.items():
                self._paths[ino] = rel
                # a rescan knows more than the answers cached before it
                self._alive.pop(ino, None)
            self._ino_of = found

    def path(self, cgroup_id: int) -> str:
        """The cgroup's path; ids of removed cgroups keep their last known path
        so a series never changes labels while the agent runs."""
        p = self._lookup(cgroup_id)
        return f"unknown:{cgroup_id}" if p is None else p

    def _lookup(self, cgroup_id: int) -> str | None:
        """The known path, after this scrape's one rescan if it is new."""
        p = self._paths.get(cgroup_id)
        names = self.names
        if p is None and names is not None:
            p = names(cgroup_id)
            if p is not None:
                with self._lock:
                    self._paths[cgroup_id] = p
        if p is None and self._may_rescan:
            self._scan()
            p = self._paths.get(cgroup_id)
        return p
