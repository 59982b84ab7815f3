"""Runs every detector on its own schedule, in one thread, apart from scrapes.

A detector here is any object with `name`, `interval` (seconds) and
`run_once(now)`; what it decides goes out as events and counters of its own.
Scrapes never run rules: an anomaly is found whether or not anyone scrapes,
and a slow rule never slows a scrape. One failing detector is logged and
tried again at its next turn; the others go on.
"""
from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence

from prometheus_client.core import CounterMetricFamily

log = logging.getLogger(__name__)


class Job:
    """Housekeeping the schedule runs beside the rules (what a scrape must
    not do): `action()` every `interval` seconds, under `name`."""

    def __init__(self, name: str, interval: float, action: Callable[[], object]):
        self.name = name
        self.interval = interval
        self.action = action

    def run_once(self, now: float) -> None:
        self.action()


class DetectorSchedule:
    def __init__(self, detectors: Sequence, clock: Callable[[], float] = time.monotonic):
        self.detectors = list(detectors)
        self.clock = clock
        self.failures: dict[str, int] = {d.name: 0 for d in self.detectors}
        # completed turns, failed or not: a reader that must know a rule has
        # looked at the node after some moment waits for this to move twice
        self.runs: dict[str, int] = {d.name: 0 for d in self.detectors}
        self._due = {d.name: 0.0 for d in self.detectors}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> "DetectorSchedule":
        if self.detectors:
            self._thread = threading.Thread(target=self._run, name="detectors", daemon=True)
            self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None

    def run_due(self, now: float) -> float:
        """Run the detectors whose turn it is; returns when the next one is due."""
        for d in self.detectors:
            if now < self._due[d.name]:
                continue
            try:
                d.run_once(now)
            except Exception as exc:  # noqa: BLE001 - one bad rule must not end detection
                self.failures[d.name] += 1
                log.warning("%s detector: %s", d.name, exc)
            self.runs[d.name] += 1
            self._due[d.name] = now + d.interval
        return min(self._due.values())

    def collect(self):
        """tracehound_detector_{runs,failures}_total{detector}."""
        runs = CounterMetricFamily("tracehound_detector_runs_total",
                                   "Turns each detector has taken on the agent's schedule.",
                                   labels=["detector"])
        failed = CounterMetricFamily("tracehound_detector_failures_total",
                                     "Turns that raised (logged; the detector runs again at its "
                                     "next turn).", labels=["detector"])
        for name in self.runs:
            runs.add_metric([name], self.runs[name])
            failed.add_metric([name], self.failures[name])
        yield runs
        yield failed

    def _run(self) -> None:
        while not self._stop.is_set():
            next_due = self.run_due(self.clock())
            self._stop.wait(max(0.01, next_due - self.clock()))
