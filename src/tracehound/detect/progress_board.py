"""Where subsystems say, per cgroup, how much work has been moved so far, so
the stall detector can tell a job that waits from one that works without
knowing any subsystem.

A source is a function returning {cgroup id: a number that grows while the
cgroup makes progress} (bytes read and written, TCP bytes acknowledged and
received, GPU busy time). Only changes matter: a number that went down
(a socket closed, a counter retired) is a change too. Sources are read on
the stall detector's own schedule, never inside a scrape.
"""
from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable, Mapping

log = logging.getLogger(__name__)

Source = Callable[[], Mapping[int, float]]
Blind = Callable[[], Iterable[int]]


class ProgressBoard:
    def __init__(self):
        self._sources: dict[str, Source] = {}
        self._blind: dict[str, Blind] = {}
        self._lock = threading.Lock()

    def add(self, name: str, read: Source) -> None:
        with self._lock:
            self._sources[name] = read

    def add_blind(self, name: str, read: Blind) -> None:
        """`read` names the cgroups whose work moves through a channel this
        subsystem sees but cannot count (RDMA queue pairs, GPU kernels):
        their silence elsewhere proves nothing."""
        with self._lock:
            self._blind[name] = read

    def remove(self, name: str) -> None:
        with self._lock:
            self._sources.pop(name, None)
            self._blind.pop(name, None)

    def blind(self) -> set[int]:
        with self._lock:
            sources = list(self._blind.items())
        out: set[int] = set()
        for name, read in sources:
            try:
                out.update(read())
            except Exception as exc:  # noqa: BLE001 - a source's failure is its own
                log.warning("blind source %s: %s", name, exc)
        return out

    def names(self) -> list[str]:
        with self._lock:
            return sorted(self._sources)

    def read(self) -> dict[str, dict[int, float]]:
        """Every source's current numbers; a source that fails is left out
        this time (and logged), so one broken source never hides the rest."""
        with self._lock:
            sources = list(self._sources.items())
        out: dict[str, dict[int, float]] = {}
        for name, read in sources:
            try:
                out[name] = dict(read())
            except Exception as exc:  # noqa: BLE001 - a source's failure is its own
                log.warning("progress source %s: %s", name, exc)
        return out
