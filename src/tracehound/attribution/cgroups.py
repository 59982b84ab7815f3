"""cgroup v2 id -> path relative to the cgroup2 root.

bpf_get_current_cgroup_id() returns the kernfs node id of the task's cgroup,
which is the inode number of its directory in cgroup2fs.
"""
from __future__ import annotations

import os


class CgroupResolver:
    """Resolves ids by walking the hierarchy; at most one walk per scrape
    (call new_scrape() first), however many unknown ids the scrape meets."""

    def __init__(self, root: str):
        self.root = root.rstrip("/") or "/"
        self._paths: dict[int, str] = {}
        self._may_rescan = False
        self._alive: dict[int, bool] = {}
        self._scan()

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
        p = self._paths.get(cgroup_id)
        if p is None and self._may_rescan:
            self._scan()
            p = self._paths.get(cgroup_id)
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
        self._paths.pop(cgroup_id, None)

    def _scan(self) -> None:
        self._may_rescan = False
        root_len = len(self.root)
        for dirpath, _dirs, _files in os.walk(self.root):
            try:
                ino = os.stat(dirpath).st_ino
            except OSError:
                continue
            rel = dirpath[root_len:] or "/"
            self._paths[ino] = rel
            # a rescan knows more than the answers cached before it
            self._alive.pop(ino, None)

    def path(self, cgroup_id: int) -> str:
        """The cgroup's path; ids of removed cgroups keep their last known path
        so a series never changes labels while the agent runs."""
        p = self._paths.get(cgroup_id)
        if p is None and self._may_rescan:
            self._scan()
            p = self._paths.get(cgroup_id)
        if p is None:
            return f"unknown:{cgroup_id}"
        return p
