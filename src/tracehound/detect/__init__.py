"""Rules over collected state that emit anomaly events and counters."""
from __future__ import annotations

import datetime
import json
import logging

from ..exporter.events import EVENTS_LOGGER

events_log = logging.getLogger(EVENTS_LOGGER)


def log_event(event: dict) -> None:
    # default=str so a stray non-JSON detail (a path, an enum) still logs
    events_log.warning(json.dumps(event, sort_keys=True, default=str))


def now_iso() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="milliseconds")
