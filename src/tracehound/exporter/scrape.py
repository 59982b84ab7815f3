"""/metrics: one collection of the registry shared by the scrapes that
arrive while it runs, rendered in the format each one asks for.

Prometheus HA pairs scrape every target twice, `tracehound top` polls
beside them: reading every kernel map once per scrape would double the cost
for nothing. The scrapes that share a collection and a format also share
its rendering (bodies.py): one body in memory however many clients read it,
and however slowly. Past MAX_BODIES distinct bodies alive at once, a new
scrape is served the newest body of its format still being read (its data
at most a write deadline old) instead of a new one: concurrent large
scrapes hold a bounded amount of memory.
"""
from __future__ import annotations

import threading
import time
import urllib.parse
import zlib
from typing import Iterable, Iterator, Optional

from prometheus_client.core import GaugeMetricFamily, Metric

from ..host.memory import release_free_memory
from . import exposition, rows
from .bodies import SharedBody
from .messages import Request, Response
from .negotiation import acceptable_media, gzip_accepted

# zlib level 1: a scrape is compressed on its critical path, and on these
# expositions level 6 buys a few percent smaller bodies for ~3x the time
GZIP_LEVEL = 1
# distinct bodies (collection, format, compression) alive at once, beyond
# the first of each format
MAX_BODIES = 2


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
        self._bodies: list[SharedBody] = []     # alive, oldest first
        self.bodies_made = 0

    def families(self) -> tuple[list[Metric], bool]:
        """The registry's families now, and whether this caller collected
        them (False: it joined a collection already running)."""
        families, leader, _pending = self._collect()
        return families, leader

    def _collect(self) -> tuple[list[Metric], bool, "_Pending"]:
        with self._lock:
            pending = self._pending
            leader = pending is None
            if leader:
                pending = self._pending = _Pending()
        if not leader:
            return pending.wait(), False, pending
        try:
            pending.families = list(self.registry.collect())
            self.collections += 1
            return pending.families, True, pending
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
        """The exposition the request asks for, streamed as it is rendered
        (plain) or whole (compressed: a few percent of its plain size), from
        a body shared with the other scrapes of the same collection."""
        start = time.perf_counter()
        families, leader, pending = self._collect()
        fmt = exposition.choose(acceptable_media(request.headers.get("Accept")))
        gz = gzip_accepted(request.headers.get("Accept-Encoding"))
        headers = [("Content-Type", exposition.CONTENT_TYPES[fmt]),
                   ("Vary", "Accept, Accept-Encoding")]
        if gz:
            headers.append(("Content-Encoding", "gzip"))
        names = urllib.parse.parse_qs(request.query).get("name[]")
        if names:
            # a few named series, made for this scrape alone
            chosen = list(restrict(families + self.own_families(), set(names)))
            chunks = self._rendered(chosen, fmt, start, False)
            return Response(200, _gzipped(chunks) if gz else chunks, headers)
        reader = self._body(pending, families, fmt, gz, start, leader).reader()
        if gz:
            with reader:
                return Response(200, list(reader), headers)
        return Response(200, reader, headers)

    def _body(self, pending, families, fmt, gz, start, leader) -> SharedBody:
        """The body to read: this collection's in this format, else (past
        MAX_BODIES) the newest of this format, else a new one."""
        key = (fmt, gz)
        with self._lock:
            same = [b for b in self._bodies if b.key == key]
            for body in reversed(same):
                if body.generation is pending or len(self._bodies) >= MAX_BODIES and same:
                    body.join()
                    return body
            chunks = self._rendered(families + self.own_families(), fmt, start, leader)
            body = SharedBody(_gzipped(chunks) if gz else chunks, key, pending, self._dropped)
            body.join()
            self._bodies.append(body)
            self.bodies_made += 1
            return body

    def _dropped(self, body: SharedBody) -> None:
        """The last reader of body is done: forget it; with no body left,
        give back what the collection and its rendering held."""
        with self._lock:
            if body in self._bodies:
                self._bodies.remove(body)
            idle = not self._bodies
        if idle:
            release_free_memory()

    def _rendered(self, families, fmt, start, report) -> Iterator[bytes]:
        yield from exposition.render(families, fmt)
        if report:
            self.last_duration_s = time.perf_counter() - start
            self.last_samples = exposition.samples_in(families)


def _gzipped(chunks: Iterator[bytes]) -> Iterator[bytes]:
    gz = zlib.compressobj(GZIP_LEVEL, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    try:
        for chunk in chunks:
            out = gz.compress(chunk)
            if out:
                yield out
        yield gz.flush()
    finally:
        close = getattr(chunks, "close", None)
        if close is not None:
            close()


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
        if len(samples) == len(every) and not isinstance(fam, rows.Rows):
            yield fam
            continue
        out = Metric(fam.name, fam.documentation, fam.type, fam.unit)
        out.samples = samples
        yield out
