"""/metrics: one collection of the registry shared by the scrapes that
arrive while it runs, rendered in the format each one asks for.

Prometheus HA pairs scrape every target twice, `tracehound top` polls
beside them: reading every kernel map once per scrape would double the cost
for nothing. Each scrape renders on its own (formats differ), from the
shared families.
"""
from __future__ import annotations

import threading
import time
import urllib.parse
import zlib
from typing import Iterable, Iterator, Optional

from prometheus_client.core import GaugeMetricFamily, Metric

from ..host.memory import release_free_memory
from . import exposition
from .messages import Request, Response, gzip_accepted

# zlib level 1: a scrape is compressed on its critical path, and on these
# expositions level 6 buys a few percent smaller bodies for ~3x the time
GZIP_LEVEL = 1


class _Pending:
    """A collection in progress, awaited by the scrapes that joined it."""

    def __init__(self):
        self.done = threading.Event()
        self.families: list[Metric] = []
        self.error: Optional[BaseException] = None

    def wait(self) -> list[Metric]:
        self.done.wait()
        if self.error is not None:
            raise RuntimeError(f"the shared collection failed: {self.error}") from self.error
        return self.families


class Scraper:
    """Serves /metrics for a registry and reports on its own last scrape."""

    def __init__(self, registry):
        self.registry = registry
        self._lock = threading.Lock()
        self._pending: Optional[_Pending] = None
        self.collections = 0          # collections run (shared ones counted once)
        self.last_duration_s = 0.0
        self.last_samples = 0

    def families(self) -> tuple[list[Metric], bool]:
        """The registry's families now, and whether this caller collected
        them (False: it joined a collection already running)."""
        with self._lock:
            pending = self._pending
            leader = pending is None
            if leader:
                pending = self._pending = _Pending()
        if not leader:
            return pending.wait(), False
        try:
            pending.families = list(self.registry.collect())
            self.collections += 1
            return pending.families, True
        except BaseException as exc:
            pending.error = exc
            raise
        finally:
            with self._lock:
                self._pending = None
            pending.done.set()

    def own_families(self) -> list[Metric]:
        took = GaugeMetricFamily(
            "tracehound_scrape_duration_seconds",
            "How long the agent's last completed collection and rendering of /metrics took.")
        took.add_metric([], self.last_duration_s)
        samples = GaugeMetricFamily("tracehound_scrape_samples",
                                    "Samples the agent's last completed /metrics served.")
        samples.add_metric([], self.last_samples)
        return [took, samples]

    def respond(self, request: Request) -> Response:
        """The exposition the request asks for. Compressed, it is made
        whole here (a few percent of its plain size); plain, it is streamed
        as it is rendered, so no scrape holds an uncompressed body."""
        start = time.perf_counter()
        families, leader = self.families()
        families = families + self.own_families()
        names = urllib.parse.parse_qs(request.query).get("name[]")
        if names:
            families = list(restrict(families, set(names)))
        fmt = exposition.choose(request.headers.get("Accept"))
        headers = [("Content-Type", exposition.CONTENT_TYPES[fmt]),
                   ("Vary", "Accept, Accept-Encoding")]
        chunks = self._rendered(families, fmt, start, leader and not names, leader)
        if gzip_accepted(request.headers.get("Accept-Encoding")):
            gz = zlib.compressobj(GZIP_LEVEL, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
            body = [gz.compress(chunk) for chunk in chunks]
            body.append(gz.flush())
            headers.append(("Content-Encoding", "gzip"))
            return Response(200, body, headers)
        return Response(200, chunks, headers)

    def _rendered(self, families, fmt, start, report, trim) -> Iterator[bytes]:
        try:
            yield from exposition.render(families, fmt)
            if report:
                self.last_duration_s = time.perf_counter() - start
                self.last_samples = exposition.samples_in(families)
        finally:
            if trim:
                del families
                # what this collection and its uncompressed rendering held
                release_free_memory()


def restrict(families: Iterable[Metric], names: set[str]):
    """Only the samples named in `names` (as prometheus_client's
    `?name[]=` filter does: full sample names, e.g. x_total, x_bucket).
    A family whose samples cannot be read is left out (and counted)."""
    for fam in families:
        every = exposition.samples_or_none(fam)   # a Rows family builds them on each access
        if every is None:
            continue
        samples = [s for s in every if s.name in names]
        if not samples:
            continue
        if len(samples) == len(every) and not isinstance(fam, exposition.Rows):
            yield fam
            continue
        out = Metric(fam.name, fam.documentation, fam.type, fam.unit)
        out.samples = samples
        yield out
