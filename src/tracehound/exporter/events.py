"""The agent's recent anomaly events, served at /events next to /metrics.

Detectors write each anomaly as one JSON line on the `tracehound.events`
logger. A counter says *how many*; the event says *which* (the pid, the
device, the errno) and *when the agent decided*. EventLog keeps the last
`capacity` of them with a sequence number, so a reader polls
`/events?since=N` and gets only what is new, plus `next` to ask from.
`dropped` tells a reader that fell behind the ring that it missed some.
`/events?job_id=1234` (or pod, namespace, unit, vm, cgroup, event, kind)
returns only the events whose field has that value.

Eviction is fair between classes of event (event, kind, condition,
severity: a fatal XID, a segfault-derived exit, a health change are each
their own class): when full, the oldest event of the class holding the
most goes. A flood of one class (thousands of XID 13 lines, crashes of one
user's program) only ever evicts its own older events once it holds more
than any other, so a fatal XID of another GPU or another detector's events
stay readable.
"""
from __future__ import annotations

import json
import logging
import threading
import urllib.parse
from collections import deque
from typing import Callable

from ..logsink import EVENTS_LOGGER
from ..utf8 import valid_json

# the fields that make an event's class; each value cut to this many characters
CLASS_FIELDS = ("event", "kind", "condition", "severity")
CLASS_VALUE_CHARS = 64

# /events?job_id=1234&kind=job_stalled: the fields a reader may filter on
FILTER_FIELDS = ("job_id", "pod", "namespace", "unit", "vm", "cgroup", "event", "kind")
FILTER_VALUE_CHARS = 512
DEFAULT_CAPACITY = 4096


def event_class(event: dict) -> tuple[str, ...]:
    return tuple(str(event.get(f, ""))[:CLASS_VALUE_CHARS] for f in CLASS_FIELDS)


class ScopeFilter(logging.Filter):
    """Drops the events of cgroups outside the agent's --cgroup-scope (another
    node's, where several agents share one host's cgroup tree), on every
    sink of the events logger; an event of no cgroup (a GPU's) is kept."""

    def __init__(self, in_scope: Callable[[str], bool]):
        super().__init__()
        self.in_scope = in_scope

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            event = json.loads(record.getMessage())
        except ValueError:
            return True
        cgroup = event.get("cgroup") if isinstance(event, dict) else None
        return not isinstance(cgroup, str) or not cgroup or self.in_scope(cgroup)


class EventLog(logging.Handler):
    def __init__(self, capacity: int = DEFAULT_CAPACITY,
                 in_scope: Callable[[str], bool] | None = None):
        super().__init__(level=logging.WARNING)
        self.capacity = capacity
        self._scope = ScopeFilter(in_scope) if in_scope is not None else None
        self._events: dict[int, dict] = {}                  # seq -> event, oldest first
        self._classes: dict[tuple, deque[int]] = {}         # class -> its seqs, oldest first
        self._seq = 0
        self._evicted_upto = 0      # the newest seq evicted so far
        self._guard = threading.Lock()
        self._logger: logging.Logger | None = None

    def attach(self, name: str = EVENTS_LOGGER) -> "EventLog":
        self._logger = logging.getLogger(name)
        self._logger.addHandler(self)
        if self._scope is not None:
            self._logger.addFilter(self._scope)
        return self

    def detach(self) -> None:
        if self._logger is not None:
            self._logger.removeHandler(self)
            if self._scope is not None:
                self._logger.removeFilter(self._scope)
            self._logger = None

    def emit(self, record: logging.LogRecord) -> None:
        try:
            event = json.loads(record.getMessage())
        except ValueError:
            return      # a plain message on the logger is not an event
        if not isinstance(event, dict):
            return
        cls = event_class(event)
        with self._guard:
            self._seq += 1
            # a path or a process name read with surrogateescape: the JSON
            # served is UTF-8, its undecodable bytes shown as U+FFFD
            self._events[self._seq] = {**valid_json(event), "seq": self._seq}
            self._classes.setdefault(cls, deque()).append(self._seq)
            if len(self._events) > self.capacity:
                self._evict()

    def _evict(self) -> None:
        """The oldest event of the largest class (the oldest such class on a tie)."""
        cls, seqs = max(self._classes.items(), key=lambda kv: (len(kv[1]), -kv[1][0]))
        seq = seqs.popleft()
        if not seqs:
            del self._classes[cls]
        del self._events[seq]
        self._evicted_upto = max(self._evicted_upto, seq)

    def since(self, seq: int, match: dict[str, str] | None = None) -> dict:
        """Events after `seq` whose fields equal every value of `match`;
        `next` is the log's own position, so a filtered reader moves on too."""
        with self._guard:
            events = [e for s, e in self._events.items() if s > seq and (
                not match or all(str(e.get(k, "")) == v for k, v in match.items()))]
            # an event newer than the reader's position was evicted before it read it
            return {"events": events, "next": self._seq, "dropped": self._evicted_upto > seq}

    def wsgi(self, environ, start_response):
        query = urllib.parse.parse_qs(environ.get("QUERY_STRING", ""), keep_blank_values=True)
        raw = (query.pop("since", None) or ["0"])[0]
        # ASCII and at most a u64's 20 digits: '²' passes isdigit() but not
        # int(), and int() refuses strings of over 4,300 digits
        if not (raw.isascii() and raw.isdigit() and len(raw) <= 20):
            return _bad(start_response, f"since must be a sequence number, not {raw!r}")
        match, why = _filters(query)
        if why:
            return _bad(start_response, why)
        body = json.dumps(self.since(int(raw), match), sort_keys=True, default=str).encode()
        start_response("200 OK", [("Content-Type", "application/json"),
                                  ("Content-Length", str(len(body)))])
        return [body]


def _bad(start_response, why: str) -> list[bytes]:
    start_response("400 Bad Request", [("Content-Type", "text/plain; charset=utf-8")])
    return [(why + "\n").encode()]


def _filters(query: dict[str, list[str]]) -> tuple[dict[str, str], str | None]:
    """?job_id=1234&kind=job_stalled -> {field: value}, or why not."""
    match = {}
    for key, values in query.items():
        if key not in FILTER_FIELDS:
            return {}, (f"unknown parameter {key[:40]!r}: since, or a filter on "
                        + ", ".join(FILTER_FIELDS))
        if len(values) != 1 or len(values[0]) > FILTER_VALUE_CHARS or not values[0].isprintable():
            return {}, f"{key}: one printable value of at most {FILTER_VALUE_CHARS} characters"
        match[key] = values[0]
    return match, None
