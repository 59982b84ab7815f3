"""The agent's HTTP server over real sockets on 127.0.0.1: concurrent and
keep-alive requests, idle and slowloris connections that must not block a
scrape, and a stop() that returns whatever clients hold open (what it
answers: test_http_responses.py)."""
import http.client
import select
import socket
import threading

import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.parser import text_string_to_metric_families

from tracehound.exporter.server import Exporter

from .waiting import DEADLINE_S, wait_until

TIMEOUT = DEADLINE_S    # generous: a server that stalls fails the test instead of hanging it


class Temperature:
    def collect(self):
        fam = GaugeMetricFamily("test_temperature_celsius", "A gauge.", labels=["room"])
        fam.add_metric(["lab"], 21.5)
        yield fam


def echo(environ, start_response):
    body = f"{environ['REQUEST_METHOD']} {environ['PATH_INFO']}?{environ['QUERY_STRING']}"
    start_response("200 OK", [("Content-Type", "text/plain")])
    return [body.encode()]


@pytest.fixture
def serve():
    """serve(**exporter kwargs) -> a started, ready Exporter; all stopped after."""
    started = []

    def start(ready=True, routes=None, **kwargs):
        registry = CollectorRegistry()
        registry.register(Temperature())
        exporter = Exporter(registry, "127.0.0.1:0", routes or {"/echo": echo}, **kwargs)
        started.append(exporter.start())
        exporter.set_ready(ready)
        return exporter

    yield start
    for exporter in started:
        exporter.stop()


def get(exporter, path="/metrics", method="GET", headers=None, body=None):
    conn = http.client.HTTPConnection("127.0.0.1", exporter.port, timeout=TIMEOUT)
    try:
        conn.request(method, path, body=body, headers=headers or {})
        resp = conn.getresponse()
        return resp.status, dict(resp.getheaders()), resp.read()
    finally:
        conn.close()


def connect(exporter) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", exporter.port), timeout=TIMEOUT)
    return sock


def raw(exporter, data: bytes) -> bytes:
    """Send data on a fresh connection and read until the server closes it."""
    with connect(exporter) as sock:
        sock.sendall(data)
        out = b""
        while chunk := sock.recv(65536):
            out += chunk
    return out


def samples(text: str) -> dict:
    """The test registry's samples (the exporter adds its own scrape gauges)."""
    return {(s.name, s.labels.get("room")): s.value
            for fam in text_string_to_metric_families(text) for s in fam.samples
            if not s.name.startswith("tracehound_scrape_")}


def held(exporter, count, data=b""):
    socks = [connect(exporter) for _ in range(count)]
    for sock in socks:
        if data:
            sock.sendall(data)
    return socks


def close_all(socks):
    for sock in socks:
        sock.close()


def test_metrics_are_served_with_the_listen_address(serve):
    exporter = serve()
    assert exporter.port != 0 and exporter.host == "127.0.0.1"
    assert exporter.url == f"http://127.0.0.1:{exporter.port}/metrics"
    status, headers, body = get(exporter)
    assert status == 200 and headers["Content-Type"].startswith("text/plain")
    assert samples(body.decode()) == {("test_temperature_celsius", "lab"): 21.5}


def test_requests_are_served_concurrently(serve):
    # five requests meet at a barrier inside the app: a server that handled
    # them one at a time would break the barrier and answer 500
    barrier = threading.Barrier(5, timeout=TIMEOUT)

    def meet(environ, start_response):
        barrier.wait()
        start_response("200 OK", [])
        return [b"met"]

    exporter = serve(routes={"/meet": meet})
    results = []
    threads = [threading.Thread(target=lambda: results.append(get(exporter, "/meet")[::2]))
               for _ in range(5)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(TIMEOUT * 2)
    assert results == [(200, b"met")] * 5


def test_keep_alive_serves_two_requests_on_one_connection(serve):
    exporter = serve()
    conn = http.client.HTTPConnection("127.0.0.1", exporter.port, timeout=TIMEOUT)
    try:
        conn.request("GET", "/metrics")
        first = conn.getresponse()
        assert first.status == 200 and not first.will_close and first.read()
        sock = conn.sock
        conn.request("GET", "/healthz")
        second = conn.getresponse()
        assert second.status == 200 and second.read() == b"ok\n"
        assert conn.sock is sock            # http.client would have reconnected
    finally:
        conn.close()


def test_an_http_1_0_client_gets_its_answer_and_the_connection_closed(serve):
    out = raw(serve(), b"GET /healthz HTTP/1.0\r\n\r\n")
    assert out.startswith(b"HTTP/1.1 200 OK\r\n") and out.endswith(b"\r\n\r\nok\n")
    assert b"Connection: close" in out


@pytest.mark.parametrize("sent", [b"", b"GET /metrics HT"],
                         ids=["idle connections", "partial request lines"])
def test_fifty_held_connections_do_not_block_a_scrape(serve, sent):
    exporter = serve()
    socks = held(exporter, 50, sent)
    try:
        status, _, body = get(exporter)
        assert status == 200 and b"test_temperature_celsius" in body
    finally:
        close_all(socks)


def test_idle_connections_beyond_the_bound_are_evicted_not_queued(serve):
    exporter = serve(max_connections=4)
    socks = held(exporter, 10) + held(exporter, 10, b"GET / HTTP/1.1\r\nHo")
    try:
        status, _, _ = get(exporter)
        assert status == 200
    finally:
        close_all(socks)


def test_a_connection_beyond_the_bound_is_refused_when_all_are_busy(serve):
    release = threading.Event()
    inside = threading.Semaphore(0)

    def slow(environ, start_response):
        inside.release()
        release.wait(TIMEOUT)
        start_response("200 OK", [])
        return [b"done"]

    exporter = serve(max_connections=2, routes={"/slow": slow})
    busy = held(exporter, 2, b"GET /slow HTTP/1.1\r\nHost: x\r\n\r\n")
    try:
        for _ in busy:                       # both requests are inside the app now
            assert inside.acquire(timeout=TIMEOUT)
        with connect(exporter) as extra:     # answered at once, before any request
            answer = extra.recv(4096)
        assert answer.startswith(b"HTTP/1.1 503 ") and b"Connection: close" in answer
    finally:
        release.set()
        for sock in busy:
            assert sock.recv(4096).startswith(b"HTTP/1.1 200 OK")
        close_all(busy)


def closed_by_server(sock) -> bool:
    """Whether reading shows the server's end of file (or reset): a client
    timeout (TIMEOUT, far beyond any idle_timeout here) raises instead."""
    try:
        return sock.recv(1024) == b""
    except ConnectionResetError:
        return True


def test_an_idle_connection_is_closed_after_the_idle_timeout(serve):
    exporter = serve(idle_timeout=0.5)
    with connect(exporter) as quiet, connect(exporter) as partial, connect(exporter) as used:
        partial.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n")   # head never ends
        used.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        answer = b""
        while not answer.endswith(b"ok\n"):
            chunk = used.recv(1024)
            assert chunk, f"closed before its answer: {answer!r}"
            answer += chunk
        # answered and kept open, then idle from the end of its response
        assert answer.startswith(b"HTTP/1.1 200 ") and b"Connection: close" not in answer
        assert closed_by_server(quiet)
        assert closed_by_server(partial)
        assert closed_by_server(used)


def test_a_slow_dripping_request_head_is_dropped_at_the_deadline(serve):
    # a byte every 50 ms keeps a per-read timeout of 0.5 s from ever expiring:
    # only a deadline for the whole head ends this connection
    exporter = serve(idle_timeout=0.5)
    with connect(exporter) as sock:
        sock.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\nX-Drip: ")
        closed = []

        def drip_until_closed():
            readable, _, _ = select.select([sock], [], [], 0.05)
            if readable:
                closed.append(closed_by_server(sock))
                return True
            try:
                sock.sendall(b"a")          # the head never ends
            except OSError:
                closed.append(True)
                return True
            return False
        wait_until(drip_until_closed, "the server to drop a connection that drips its head")
        assert closed == [True]


def answer_begun(sock) -> bool:
    readable, _, _ = select.select([sock], [], [], 0)
    return bool(readable)


@pytest.mark.parametrize("count,sent,kind", [
    pytest.param(50, b"", "idle", id="idle"),
    pytest.param(50, b"GET /metrics HTTP/1.1\r\nHost", "idle", id="slowloris"),
    pytest.param(3, b"GET /big HTTP/1.1\r\nHost: x\r\n\r\n", "answering", id="not-reading"),
    pytest.param(3, b"GET /slow HTTP/1.1\r\nHost: x\r\n\r\n", "in-app", id="in-app"),
])
def test_stop_returns_while_clients_hold_connections(serve, count, sent, kind):
    big = b"x" * (32 << 20)                  # far more than the socket buffers hold
    inside = threading.Semaphore(0)
    release = threading.Event()

    def slow(environ, start_response):
        inside.release()
        release.wait(TIMEOUT)                # held until after stop() has returned
        start_response("200 OK", [])
        return [b""]

    exporter = serve(routes={"/big": lambda env, sr: (sr("200 OK", []), [big])[1],
                             "/slow": slow})
    socks = held(exporter, count, sent)
    try:
        # the server holds every one of them before it is stopped
        server = exporter._server
        wait_until(lambda: len(server._slots) == count, f"the server to take all {count}")
        if kind == "in-app":
            for _ in socks:
                assert inside.acquire(timeout=TIMEOUT)
        if kind == "answering":
            wait_until(lambda: all(answer_begun(sock) for sock in socks),
                       "the server to start answering each client")
        stopper = threading.Thread(target=exporter.stop, daemon=True)
        stopper.start()
        stopper.join(TIMEOUT)
        assert not stopper.is_alive()
        with pytest.raises(OSError):
            socket.create_connection(("127.0.0.1", exporter.port), timeout=1).close()
    finally:
        release.set()
        close_all(socks)
