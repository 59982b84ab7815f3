"""The agent's recent anomaly events, served at /events next to /metrics.

Detectors write each anomaly as one JSON line on the `tracehound.events`
logger. A counter says *how many*; the event says *which* (the pid, the
device, the errno) and *when the agent decided*. EventLog keeps the last
`capacity` of them with a sequence number, so a reader polls
`/events?since=N` and gets only what is new, plus `next` to ask from.
`dropped` tells a reader that fell behind the ring that it missed some.
"""
from __future__ import annotations

import json
import logging
import threading
import urllib.parse
from collections import deque

from .utf8 import valid_json

EVENTS_LOGGER = "tracehound.events"
DEFAULT_CAPACITY = 4096


class EventLog(logging.Handler):
    def __init__(self, capacity: int = DEFAULT_CAPACITY):
        super().__init__(level=logging.WARNING)
        self._ring: deque[dict] = deque(maxlen=capacity)
        self._seq = 0
        self._guard = threading.Lock()
        self._logger: logging.Logger | None = None

    def attach(self, name: str = EVENTS_LOGGER) -> "EventLog":
        self._logger = logging.getLogger(name)
        self._logger.addHandler(self)
        return self

    def detach(self) -> None:
        if self._logger is not None:
            self._logger.removeHandler(self)
            self._logger = None

    def emit(self, record: logging.LogRecord) -> None:
        try:
            event = json.loads(record.getMessage())
        except ValueError:
            return      # a plain message on the logger is not an event
        if not isinstance(event, dict):
            return
        with self._guard:
            self._seq += 1
            # a path or a process name read with surrogateescape: the JSON
            # served is UTF-8, its undecodable bytes shown as U+FFFD
            self._ring.append({**valid_json(event), "seq": self._seq})

    def since(self, seq: int) -> dict:
        with self._guard:
            events = [e for e in self._ring if e["seq"] > seq]
            oldest = self._ring[0]["seq"] if self._ring else self._seq + 1
            return {"events": events, "next": self._seq, "dropped": seq + 1 < oldest}

    def wsgi(self, environ, start_response):
        query = urllib.parse.parse_qs(environ.get("QUERY_STRING", ""))
        raw = (query.get("since") or ["0"])[0]
        # ASCII and at most a u64's 20 digits: '²' passes isdigit() but not
        # int(), and int() refuses strings of over 4,300 digits
        if not (raw.isascii() and raw.isdigit() and len(raw) <= 20):
            start_response("400 Bad Request", [("Content-Type", "text/plain")])
            return [f"since must be a sequence number, not {raw!r}\n".encode()]
        body = json.dumps(self.since(int(raw)), sort_keys=True, default=str).encode()
        start_response("200 OK", [("Content-Type", "application/json"),
                                  ("Content-Length", str(len(body)))])
        return [body]
