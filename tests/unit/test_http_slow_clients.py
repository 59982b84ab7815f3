"""Clients that ask for a large answer and never read it, over real sockets
on 127.0.0.1 with a small receive buffer: they must not lock real scrapes
out, must be dropped by the write deadline, and must not make the agent hold
one rendered body each. Also: q=0 in Accept and Accept-Encoding means "not
acceptable"."""
import gzip
import http.client
import socket

import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.core import GaugeMetricFamily

from tracehound.exporter import scrape
from tracehound.exporter.http import HTTPServer
from tracehound.exporter.messages import Response
from tracehound.exporter.server import Exporter

from .waiting import DEADLINE_S, wait_until

# far more than the server's socket send buffer (tcp_wmem's 4 MiB) and the
# client's: a client that does not read leaves the server stalled writing
BIG = b"x" * (8 << 20)
HUGE = b"y" * (32 << 20)         # room for a reader to take some and still stall
HELD = 12


def app(request):
    if request.path == "/big":
        return Response(200, [BIG], [("Content-Type", "application/octet-stream")])
    if request.path == "/huge":
        return Response(200, [HUGE], [("Content-Type", "application/octet-stream")])
    return Response(200, b"ok\n", [("Content-Type", "text/plain")])


def non_reader(port: int, path: str = "/big", small: bool = True) -> socket.socket:
    """A connection that sends its request and never reads: a receive
    buffer as small as the kernel allows, set before the handshake."""
    sock = socket.socket()
    if small:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1024)
    sock.settimeout(DEADLINE_S)
    sock.connect(("127.0.0.1", port))
    sock.sendall(f"GET {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
    return sock


def stalled(server, count: int) -> bool:
    """Every one of `count` connections is answering, its client's socket
    full (the server marks such connections stalled; one that does not
    track it is taken at its word that the socket is full)."""
    slots = list(server._slots.values())
    return len(slots) == count and all(s.busy and getattr(s, "stalled", True) for s in slots)


def drained_short(sock: socket.socket, whole: int) -> bool:
    """Read until the server ends the connection: True if it ended it before
    the whole answer (`whole` bytes of body) came."""
    got = 0
    try:
        while chunk := sock.recv(1 << 20):
            got += len(chunk)
    except ConnectionResetError:
        return True
    return got < whole


def get(port, path="/", headers=None):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=DEADLINE_S)
    try:
        conn.request("GET", path, headers=headers or {})
        resp = conn.getresponse()
        return resp.status, dict(resp.getheaders()), resp.read()
    finally:
        conn.close()


@pytest.fixture
def server():
    started = []

    def start(**kwargs):
        started.append(HTTPServer("127.0.0.1", 0, app, **kwargs).start())
        return started[-1]
    yield start
    for s in started:
        s.close()


def test_a_scrape_is_answered_while_non_readers_hold_every_connection(server):
    srv = server(max_connections=HELD)
    held = [non_reader(srv.port) for _ in range(HELD)]
    try:
        wait_until(lambda: stalled(srv, HELD), f"{HELD} connections stalled writing")
        # at the limit, a stalled writer makes room: the scrape is answered
        assert get(srv.port)[::2] == (200, b"ok\n")
        assert srv.evictions >= 1
    finally:
        for sock in held:
            sock.close()


def test_the_evicted_non_reader_is_closed_by_the_server(server):
    srv = server(max_connections=2)
    first = non_reader(srv.port)
    second = non_reader(srv.port)
    try:
        wait_until(lambda: stalled(srv, 2), "both connections stalled writing")
        assert get(srv.port)[0] == 200
        wait_until(lambda: len(srv._slots) == 1, "one non-reader to be left")
        (kept,) = [slot.sock.getpeername()[1] for slot in srv._slots.values()]
        (evicted,) = [sock for sock in (first, second) if sock.getsockname()[1] != kept]
        # the other one is closed by the server, its answer cut short
        assert drained_short(evicted, len(BIG))
    finally:
        first.close()
        second.close()


def slot_of(server, sock):
    """The server's bookkeeping of the connection sock is the client end of."""
    port = sock.getsockname()[1]
    found = [slot for slot in list(server._slots.values()) if slot.sock.getpeername()[1] == port]
    return found[0] if found else None


def test_a_slow_reader_outlives_a_non_reader_that_came_later(server):
    srv = server(max_connections=2)
    # it will read, in bursts: a receive buffer of the usual size
    slow = non_reader(srv.port, "/huge", small=False)
    wait_until(lambda: stalled(srv, 1), "the slow reader's answer to fill its socket")
    still = non_reader(srv.port)
    try:
        wait_until(lambda: stalled(srv, 2), "both connections stalled writing")
        mark = slot_of(srv, slow).stalled_since
        got = 0
        # a burst: until the server has made progress on it and waits again
        while slot_of(srv, slow).stalled_since == mark:
            got += len(slow.recv(1 << 20))
            assert got < len(HUGE) // 2, "the server never stalled again"
        wait_until(lambda: slot_of(srv, slow).stalled, "the slow reader's connection to stall")
        assert get(srv.port)[0] == 200
        # the one that made no progress for longest went, not the older answer
        assert drained_short(still, len(BIG))
        assert slot_of(srv, slow) is not None
    finally:
        slow.close()
        still.close()


def test_a_client_that_does_not_read_is_dropped_at_the_write_deadline(server):
    srv = server(write_timeout=0.5)
    with non_reader(srv.port) as sock:
        wait_until(lambda: srv._slots, "the server to take the connection")
        wait_until(lambda: not srv._slots, "the server to drop the connection")
        assert drained_short(sock, len(BIG))


class Wide:
    """A registry of a few megabytes of text."""

    def collect(self):
        fam = GaugeMetricFamily("test_wide", "Many series.", labels=["i", "pad"])
        for i in range(40_000):
            fam.add_metric([str(i), "p" * 40], float(i))
        yield fam


def test_concurrent_non_readers_share_a_bounded_number_of_bodies():
    registry = CollectorRegistry()
    registry.register(Wide())
    exporter = Exporter(registry, "127.0.0.1:0").start()
    exporter.set_ready(True)
    held = []
    try:
        for count in range(1, HELD + 1):
            # one after the other: each is a collection of its own
            held.append(non_reader(exporter.port, "/metrics"))
            wait_until(lambda: stalled(exporter._server, count), f"{count} scrapes stalled")
        scraper = exporter.scraper
        # yet they hold at most MAX_BODIES bodies, not one each
        assert scraper.collections == HELD
        assert scraper.bodies_made <= scrape.MAX_BODIES
        status, _, body = get(exporter.port, "/metrics")
        assert status == 200 and body.count(b"test_wide{") == 40_000
    finally:
        for sock in held:
            sock.close()
        exporter.stop()
    wait_until(lambda: not exporter.scraper._bodies, "every body to be let go")


def exporter_for(registry_collector):
    registry = CollectorRegistry()
    registry.register(registry_collector)
    exporter = Exporter(registry, "127.0.0.1:0").start()
    exporter.set_ready(True)
    return exporter


class Small:
    def collect(self):
        fam = GaugeMetricFamily("test_small", "One series.")
        fam.add_metric([], 1.0)
        yield fam


@pytest.mark.parametrize("accept,openmetrics", [
    ("application/openmetrics-text;q=0", False),
    ("application/openmetrics-text; version=1.0.0; q=0.0, */*;q=0.1", False),
    ("application/openmetrics-text;q=0.2, text/plain;q=0.5", False),
    ("application/openmetrics-text;q=0.5, text/plain;q=0.2", True),
    ("application/openmetrics-text;q=x", False),        # a malformed q is no q
    ("application/openmetrics-text", True),
])
def test_accept_quality_values_are_honoured(accept, openmetrics):
    exporter = exporter_for(Small())
    try:
        status, headers, body = get(exporter.port, "/metrics", {"Accept": accept})
    finally:
        exporter.stop()
    assert status == 200
    assert headers["Content-Type"].startswith("application/openmetrics-text") == openmetrics
    assert body.endswith(b"# EOF\n") == openmetrics


@pytest.mark.parametrize("encoding,compressed", [
    ("gzip;q=0", False),
    ("gzip;q=0.000, identity", False),
    ("x-gzip;q=0, gzip;q=0", False),
    ("identity;q=1, *;q=0.5", True),
    ("gzip;q=0, *;q=1", False),
    ("gzip;q=0.3", True),
])
def test_accept_encoding_quality_values_are_honoured(encoding, compressed):
    exporter = exporter_for(Small())
    try:
        status, headers, body = get(exporter.port, "/metrics", {"Accept-Encoding": encoding})
    finally:
        exporter.stop()
    assert status == 200 and ("Content-Encoding" in headers) == compressed
    text = gzip.decompress(body) if compressed else body
    assert b"test_small 1.0" in text
