"""Families left out of /metrics because rendering them raised.

exposition.render leaves such a family out of that scrape and serves the
rest; this says how often, per family, as
tracehound_exposition_families_failed_total{family} (beside the collectors'
health, registry.py), and logs the first failure of each family once.
"""
from __future__ import annotations

import logging
import threading
from typing import Optional

from prometheus_client.core import CounterMetricFamily

log = logging.getLogger(__name__)


class FamilyFailures:
    def __init__(self):
        self._counts: dict[str, int] = {}
        self._lock = threading.Lock()

    def record(self, name: str, exc: BaseException) -> None:
        with self._lock:
            first = name not in self._counts
            self._counts[name] = self._counts.get(name, 0) + 1
        if first:
            log.warning("family %s could not be rendered and is left out of /metrics: %r",
                        name, exc)

    def counts(self) -> dict[str, int]:
        with self._lock:
            return dict(self._counts)

    def family(self) -> Optional[CounterMetricFamily]:
        """The counter, or None while no family has failed (it has no series
        to show until then)."""
        counts = self.counts()
        if not counts:
            return None
        fam = CounterMetricFamily(
            "tracehound_exposition_families_failed",
            "Times a family was left out of /metrics because rendering it raised "
            "(the rest of the scrape was served).", labels=["family"])
        for name, n in sorted(counts.items()):
            fam.add_metric([name], n)
        return fam


# the agent serves one exposition; render() and the name[] filter report here
FAILURES = FamilyFailures()
