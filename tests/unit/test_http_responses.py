"""What the agent's HTTP server answers, over real sockets on 127.0.0.1:
gzip and OpenMetrics, HEAD, readiness, extra WSGI routes, the error statuses,
setup errors, and streamed bodies."""
import gzip
import http.client

import pytest
from prometheus_client import CollectorRegistry

from tracehound.errors import SetupError
from tracehound.exporter.events import EventLog
from tracehound.exporter.http import HTTPServer
from tracehound.exporter.messages import Response
from tracehound.exporter.server import Exporter

from .test_http_server import TIMEOUT, connect, echo, get, raw, samples, serve  # noqa: F401 (serve: a fixture)


def test_gzip_when_the_client_accepts_it(serve):
    exporter = serve()
    status, headers, body = get(exporter, headers={"Accept-Encoding": "gzip"})
    assert status == 200 and headers["Content-Encoding"] == "gzip"
    assert samples(gzip.decompress(body).decode()) == {("test_temperature_celsius", "lab"): 21.5}
    _, headers, body = get(exporter, headers={"Accept-Encoding": "gzip;q=0, identity"})
    assert "Content-Encoding" not in headers and body.startswith(b"# HELP")


def test_openmetrics_when_the_client_asks_for_it(serve):
    status, headers, body = get(serve(), headers={"Accept": "application/openmetrics-text"})
    assert status == 200 and headers["Content-Type"].startswith("application/openmetrics-text")
    assert body.endswith(b"# EOF\n") and b'test_temperature_celsius{room="lab"} 21.5' in body


def test_head_answers_the_headers_only(serve):
    exporter = serve()
    _, _, full = get(exporter, "/healthz")
    status, headers, body = get(exporter, "/healthz", method="HEAD")
    assert status == 200 and body == b"" and int(headers["Content-Length"]) == len(full) > 0
    # /metrics is streamed as it is rendered: no length to announce
    status, headers, body = get(exporter, method="HEAD")
    assert status == 200 and body == b"" and headers["Transfer-Encoding"] == "chunked"


def test_unknown_paths_are_404(serve):
    exporter = serve()
    assert get(exporter, "/")[0] == 404
    assert get(exporter, "/metrics/extra")[0] == 404


def test_health_readiness_and_metrics_follow_set_ready(serve):
    exporter = serve(ready=False)
    assert exporter.ready is False
    assert get(exporter, "/healthz")[::2] == (200, b"ok\n")
    assert get(exporter, "/readyz")[0] == 503
    status, _, body = get(exporter)
    assert status == 503 and body.count(b"\n") == 1 and b"loading" in body
    exporter.set_ready(True)
    assert exporter.ready is True
    assert get(exporter, "/readyz")[0] == 200 and get(exporter)[0] == 200
    assert get(exporter, "/healthz")[0] == 200
    exporter.set_ready(False)
    assert get(exporter, "/readyz")[0] == 503


def test_extra_routes_are_wsgi_apps_with_their_query_string(serve):
    events = EventLog(capacity=4)
    exporter = serve(routes={"/echo": echo, "/events": events.wsgi}, ready=False)
    assert get(exporter, "/echo?since=3&x=%20y")[::2] == (200, b"GET /echo?since=3&x=%20y")
    status, headers, body = get(exporter, "/events?since=0")
    assert status == 200 and headers["Content-Type"] == "application/json"
    assert body == b'{"dropped": false, "events": [], "next": 0}'
    status, _, body = get(exporter, "/events?since=x")
    assert status == 400 and b"since must be a sequence number" in body


@pytest.mark.parametrize("method", ["POST", "PUT", "DELETE", "OPTIONS"])
def test_other_methods_are_405(serve, method):
    status, headers, _ = get(serve(), method=method, body=b"a=1")
    assert status == 405 and headers["Allow"] == "GET, HEAD"


@pytest.mark.parametrize("request_bytes", [
    b"garbage\r\n\r\n",
    b"GET /metrics HTTP/1.1 extra\r\nHost: x\r\n\r\n",
    b"GET /metrics HTTP/x.y\r\nHost: x\r\n\r\n",
    b"GET /metrics\r\n\r\n",
    b"GET /metrics HTTP/1.1\r\n\r\n",                            # HTTP/1.1 needs a Host
    b"GET /metrics HTTP/1.1\r\nHost: a b\r\n\r\n",
    b"GET /metrics HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n",
    b"GET metrics HTTP/1.1\r\nHost: x\r\n\r\n",
    b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03\r\n\r\n",     # TLS hello, roughly
])
def test_bad_requests_are_400_and_the_server_carries_on(serve, request_bytes):
    exporter = serve()
    assert raw(exporter, request_bytes).startswith(b"HTTP/1.1 400 ")
    assert get(exporter)[0] == 200


def test_an_oversized_request_head_is_cut_off(serve):
    exporter = serve()
    head = b"GET /metrics HTTP/1.1\r\nHost: x\r\n" + b"X-Pad: " + b"p" * 60000 + b"\r\n"
    with connect(exporter) as sock:
        try:
            sock.sendall(head * 3 + b"\r\n")
            answer = sock.recv(4096)
        except ConnectionResetError:
            answer = b""
    assert not answer.startswith(b"HTTP/1.1 200")
    assert get(exporter)[0] == 200


def test_failures_are_500_without_a_traceback(serve, capfd):
    def broken(environ, start_response):
        raise RuntimeError("boom")

    exporter = serve(routes={"/broken": broken})
    assert get(exporter, "/broken")[0] == 500
    raw(exporter, b"garbage\r\n\r\n")
    with connect(exporter) as sock:
        sock.sendall(b"GET /metr")                               # and hang up
    assert get(exporter)[0] == 200
    out, err = capfd.readouterr()
    assert out == "" and err == ""


def test_a_busy_port_is_a_setup_error(serve):
    exporter = serve()
    with pytest.raises(SetupError, match="address already in use"):
        Exporter(CollectorRegistry(), f"127.0.0.1:{exporter.port}").start()


def test_an_address_not_on_this_host_is_a_setup_error():
    with pytest.raises(SetupError, match=r"cannot listen on 192\.0\.2\.1:0: "):
        Exporter(CollectorRegistry(), "192.0.2.1:0").start()


def test_stop_twice_and_before_start_are_harmless(serve):
    Exporter(CollectorRegistry(), "127.0.0.1:0").stop()
    exporter = serve()
    exporter.stop()
    exporter.stop()


def test_plain_metrics_are_streamed_chunked_or_until_close(serve):
    exporter = serve()
    status, headers, body = get(exporter)
    assert status == 200 and headers["Transfer-Encoding"] == "chunked"
    assert "Content-Length" not in headers
    assert samples(body.decode()) == {("test_temperature_celsius", "lab"): 21.5}
    # HTTP/1.0 has no chunks: the body ends when the connection does
    sock = connect(exporter)
    sock.sendall(b"GET /metrics HTTP/1.0\r\n\r\n")
    raw = b""
    while chunk := sock.recv(65536):
        raw += chunk
    sock.close()
    head, _, body = raw.partition(b"\r\n\r\n")
    assert b"Connection: close" in head and b"Transfer-Encoding" not in head
    assert samples(body.decode()) == {("test_temperature_celsius", "lab"): 21.5}
    # compressed answers are whole, with their length
    _, headers, body = get(exporter, headers={"Accept-Encoding": "gzip"})
    assert int(headers["Content-Length"]) == len(body)


def test_a_stream_that_fails_midway_is_cut_short_and_cleaned_up():
    closed = []

    def body():
        try:
            yield b"first part\n"
            raise OSError("map read failed")
        finally:
            closed.append(True)

    server = HTTPServer("127.0.0.1", 0, lambda request: Response(200, body())).start()
    try:
        conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=TIMEOUT)
        conn.request("GET", "/")
        resp = conn.getresponse()
        assert resp.status == 200
        with pytest.raises(http.client.IncompleteRead) as err:
            resp.read()
        assert err.value.partial == b"first part\n"
        conn.close()
        assert closed == [True]
    finally:
        server.close()
