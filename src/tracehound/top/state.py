"""What the user chose on screen (sort, filter, panel) and how keys change it."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from .model import SORT_KEYS, Snapshot, filter_rdma, filter_rows, sort_rows

PANELS = ("io", "jobs", "rdma", "gpu")
PANEL_TITLES = {"io": "I/O", "jobs": "Jobs", "rdma": "RDMA", "gpu": "GPU"}
SORT_BY_KEY = {"r": "read", "w": "write", "i": "iops", "l": "p99", "e": "errors", "n": "name"}
ESC, TAB, BACKSPACES, ENTERS = "\x1b", "\t", ("\x7f", "\x08"), ("\r", "\n")
HELP = "r/w/i/l/e/n sort  / filter  tab panel  a idle rows  q quit"


def is_active(row) -> bool:
    return bool(row.read_bytes_per_second or row.write_bytes_per_second
                or row.ops_per_second or row.errors_per_second)


@dataclass
class ViewState:
    sort: str = "write"
    reverse: bool = False
    filter: str = ""
    panel: str = "io"
    show_idle: bool = False
    # while typing a filter: the text so far, and the filter to go back to on ESC
    editing: Optional[str] = None
    saved_filter: str = ""
    error: Optional[str] = None

    def __post_init__(self):
        if self.sort not in SORT_KEYS:
            raise ValueError(f"unknown sort column {self.sort!r}")

    def io_rows(self, snap: Optional[Snapshot]) -> list:
        if snap is None:
            return []
        rows = snap.io if self.show_idle else [r for r in snap.io if is_active(r)]
        return sort_rows(filter_rows(rows, self.filter), self.sort, self.reverse)

    def job_rows(self, snap: Optional[Snapshot]) -> list:
        """The jobs whose name or kind holds the filter (CPU order kept)."""
        if snap is None:
            return []
        needle = self.filter.lower()
        return [r for r in snap.jobs if needle in r.name.lower() or needle in r.kind.lower()]

    def rdma_objects(self, snap: Optional[Snapshot]):
        return None if snap is None else filter_rdma(snap.rdma_objects, self.filter)

    def handle_key(self, key: str) -> bool:
        """Apply one key; True means quit."""
        if self.editing is not None:
            self._edit(key)
            return False
        if key in ("q", "Q"):
            return True
        if key in SORT_BY_KEY:
            column = SORT_BY_KEY[key]
            # the same key twice flips the direction, like most top-likes
            self.reverse = not self.reverse if column == self.sort else False
            self.sort = column
        elif key == "/":
            self.editing, self.saved_filter = self.filter, self.filter
        elif key == TAB:
            self.panel = PANELS[(PANELS.index(self.panel) + 1) % len(PANELS)]
        elif key == "a":
            self.show_idle = not self.show_idle
        elif key == ESC:
            self.filter = ""
        return False

    def _edit(self, key: str) -> None:
        # the filter applies while it is typed, so the rows narrow as you go
        if key in ENTERS:
            self.editing = None
            return
        if key == ESC:
            self.filter, self.editing = self.saved_filter, None
            return
        if key in BACKSPACES:
            self.editing = self.editing[:-1]
        elif len(key) == 1 and key.isprintable():
            self.editing += key
        self.filter = self.editing
