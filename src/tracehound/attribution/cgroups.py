"""cgroup id -> path relative to the root of the hierarchy counted by.

The probes count by the kernfs node id of the task's cgroup in that
hierarchy (cgroup_layout.py: the v2 tree, or one v1 controller's), which is
the inode number of its directory there, in cgroup2fs and v1 cgroupfs alike.
"""
from __future__ import annotations

import logging
import os
import threading
from collections.abc import Iterable

from .cgroup_watch import CgroupWatcher

log = logging.getLogger(__name__)


class CgroupResolver:
    """Resolves ids by walking the hierarchy; at most one walk per scrape
    (call new_scrape() first), however many unknown ids the scrape meets.
    With watch(), paths of new cgroups are learnt as they are created, so
    even a cgroup gone before the next scrape keeps its name."""

    def __init__(self, root: str):
        self.root = root.rstrip("/") or "/"
        self._paths: dict[int, str] = {}
        self._ino_of: dict[str, int] = {}
        self._lock = threading.Lock()
        self._watcher: CgroupWatcher | None = None
        # the first lookup walks the tree, unless watch() has walked it already
        self._may_rescan = True
        self._alive: dict[int, bool] = {}

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

    def _removed(self, rel: str) -> None:
        with self._lock:
            self._ino_of.pop(rel, None)

    def retain(self, in_use: Iterable[int]) -> list[tuple[int, str]]:
        """Forget the paths of removed cgroups nothing refers to any more:
        memory follows the cgroups that exist, not all that ever did.
        Returns the (id, path) pairs forgotten."""
        keep = set(in_use)
        with self._lock:
            keep.update(self._ino_of.values())     # cgroups that exist now
            dropped = [(ino, p) for ino, p in self._paths.items() if ino not in keep]
            for ino, _ in dropped:
                del self._paths[ino]
        return dropped

    def new_scrape(self) -> None:
        self._may_rescan = True
        self._alive: dict[int, bool] = {}

    def alive(self, cgroup_id: int) -> bool:
        """Whether the cgroup still exists. Its directory's inode is its id;
        an id no rescan can place belongs to a cgroup that was created and
        removed between two looks (the agent sees the host's whole tree)."""
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
        return ok

    def forget(self, cgroup_id: int) -> None:
        """Drop a removed cgroup once its last values were exported."""
        with self._lock:
            self._paths.pop(cgroup_id, None)

    def _scan(self) -> None:
        self._may_rescan = False
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
        if p is None and self._may_rescan:
            self._scan()
            p = self._paths.get(cgroup_id)
        return p
