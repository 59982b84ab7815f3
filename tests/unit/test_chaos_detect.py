"""Detection probes against real HTTP endpoints served from the test: an
agent-style /metrics page whose values change when the "fault" lands, and
a Prometheus-style /api/v1/query."""
import http.server
import json
import sys
import threading
import time
import urllib.parse

import pytest

from tracehound.chaos import detection as detect, metrics
from tracehound.chaos.faults import Detection


class Endpoint:
    """A tiny HTTP server whose answer the test changes while probes poll it."""

    def __init__(self):
        self.body = ""
        self.content_type = "text/plain"
        self.queries = []
        endpoint = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self, form=None):
                q = form if form is not None else urllib.parse.urlparse(self.path).query
                endpoint.queries.append(urllib.parse.parse_qs(q).get("query", [""])[0])
                data = endpoint.body.encode()
                self.send_response(200)
                self.send_header("Content-Type", endpoint.content_type)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_POST(self):  # Prometheus' query API takes a form as well
                length = int(self.headers.get("Content-Length", 0))
                self.do_GET(self.rfile.read(length).decode())

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_port}"

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def endpoint():
    e = Endpoint()
    yield e
    e.close()


def exposition(write_bytes: float, lat_sum: float, lat_count: float, cg="/job") -> str:
    return f"""# HELP tracehound_io_write_bytes_total bytes
# TYPE tracehound_io_write_bytes_total counter
tracehound_io_write_bytes_total{{cgroup="{cg}",mountpoint="/"}} {write_bytes}
tracehound_io_write_bytes_total{{cgroup="/other",mountpoint="/"}} 999999
# HELP tracehound_io_write_latency_seconds latency
# TYPE tracehound_io_write_latency_seconds histogram
tracehound_io_write_latency_seconds_bucket{{cgroup="{cg}",le="+Inf"}} {lat_count}
tracehound_io_write_latency_seconds_sum{{cgroup="{cg}"}} {lat_sum}
tracehound_io_write_latency_seconds_count{{cgroup="{cg}"}} {lat_count}
"""


def test_selector_parsing():
    sel = metrics.parse_selector('up{job="a\\"b", x!="y", z=~"c.*", w!~"d"}')
    assert sel.name == "up"
    assert [(m.label, m.op, m.value) for m in sel.matchers] == [
        ("job", "=", 'a"b'), ("x", "!=", "y"), ("z", "=~", "c.*"), ("w", "!~", "d")]
    assert sel.matchers[2].matches({"z": "cat"}) and not sel.matchers[3].matches({"w": "d"})
    for bad in ("", "1up", "up{job}", 'up{job="x"', 'up{a=~"("}'):
        with pytest.raises(metrics.QueryError):
            metrics.parse_selector(bad)


def test_counter_name_with_or_without_total(endpoint):
    endpoint.body = exposition(100, 0, 0)
    sel = metrics.parse_selector('tracehound_io_write_bytes{cgroup="/job"}')
    assert metrics.agent_point(endpoint.url, sel, False) == 100
    sel = metrics.parse_selector('tracehound_io_write_bytes_total{cgroup=~"/.*"}')
    assert metrics.agent_point(endpoint.url, sel, False) == 100 + 999999
    sel = metrics.parse_selector('tracehound_io_write_bytes_total{cgroup="/none"}')
    assert metrics.agent_point(endpoint.url, sel, False) is None


@pytest.mark.parametrize("text,ok", [("> 0.5", True), ("== 0", True), ("<=-1e3", True),
                                     ("0.5", False), ("> x", False), (5, False)])
def test_predicates(text, ok):
    if ok:
        detect.parse_predicate(text)
    else:
        with pytest.raises(ValueError):
            detect.parse_predicate(text)
    assert detect.compare(2.0, ("<", 3.0)) and not detect.compare(2.0, ("==", 3.0))


def test_signal_window_rate_and_mean():
    w = detect.SignalWindow("rate", 1.0, baseline=(0.0, 100.0))
    assert w.add(0.5, 150.0) is None            # not a full window yet
    assert w.add(1.0, 200.0) == pytest.approx(100.0)
    assert w.add(2.2, 200.0) == pytest.approx(0.0)
    m = detect.SignalWindow("mean", 1.0, baseline=(0.0, (1.0, 10.0)))
    assert m.add(1.0, (3.0, 14.0)) == pytest.approx(0.5)
    assert m.add(2.0, (3.0, 14.0)) is None      # no calls finished in the window
    inc = detect.SignalWindow("increase", 1.0, baseline=(0.0, None))
    assert inc.add(0.1, 5.0) == 5.0             # a series that appears counts from zero


def test_detection_measures_mttd_from_apply_time(endpoint):
    endpoint.body = exposition(1000, 0.001, 10)
    spec = {"url": endpoint.url + "/metrics", "interval": 0.05, "timeout": 5, "window": 0.2}
    spec = detect.with_defaults(spec, Detection(
        query='tracehound_io_write_latency_seconds{cgroup="/job"}', signal="mean",
        predicate="> 0.01", note="slow writes"))
    baseline = detect.take_baseline(spec)
    applied = time.monotonic()

    def fault_lands():
        time.sleep(0.4)
        endpoint.body = exposition(1000, 2.001, 20)   # 10 calls, 0.2 s each

    threading.Thread(target=fault_lands).start()
    result = detect.run_detection(spec, applied, baseline, "io.throttle")
    assert result["detected"] is True
    assert result["tracehound_signal"] is True
    assert 0.4 <= result["mttd_seconds"] < 1.5
    assert result["value"] == pytest.approx(0.2)
    assert result["note"] == "slow writes"


def test_detection_times_out_and_says_why(endpoint):
    endpoint.body = exposition(1000, 0, 0)
    spec = {"url": endpoint.url, "query": 'tracehound_io_write_bytes_total{cgroup="/gone"}',
            "predicate": "> 0", "timeout": 0.3, "interval": 0.1}
    result = detect.run_detection(spec, time.monotonic(), None, "proc.stop")
    assert result["detected"] is False and result["mttd_seconds"] is None
    assert "no series matched" in result["note"]


def test_fault_without_tracehound_signal_is_reported_not_polled():
    spec = detect.with_defaults({"timeout": 30}, Detection(note="no network metric"))
    start = time.monotonic()
    result = detect.run_detection(spec, start, None, "net.loss")
    assert time.monotonic() - start < 0.5
    assert result["detected"] is False and result["tracehound_signal"] is False
    assert result["note"] == "no network metric"


def test_prometheus_source(endpoint):
    endpoint.content_type = "application/json"
    endpoint.body = json.dumps({"status": "success", "data": {"resultType": "vector", "result": [
        {"metric": {}, "value": [0, "0.25"]}, {"metric": {}, "value": [0, "0.5"]}]}})
    spec = {"source": "prometheus", "url": endpoint.url, "query": "sum(rate(x[1m]))",
            "predicate": "> 0.7", "timeout": 1, "interval": 0.1}
    result = detect.run_detection(spec, time.monotonic(), None, "io.throttle")
    assert result["detected"] and result["value"] == pytest.approx(0.75)
    assert endpoint.queries[-1] == "sum(rate(x[1m]))"
    endpoint.body = json.dumps({"status": "error", "error": "parse error"})
    with pytest.raises(metrics.QueryError, match="parse error"):
        metrics.promql_value(endpoint.url, "((")


def test_process_source_extracts_a_number(tmp_path):
    counter = tmp_path / "n"
    counter.write_text("drops 0\n")
    spec = {"source": "process", "command": ["cat", str(counter)], "extract": r"drops (\d+)",
            "signal": "increase", "predicate": "> 2", "timeout": 3, "interval": 0.05}
    baseline = detect.take_baseline(spec)
    threading.Timer(0.2, lambda: counter.write_text("drops 7\n")).start()
    result = detect.run_detection(spec, time.monotonic(), baseline, "net.loss")
    assert result["detected"] and result["value"] == 7 and not result["tracehound_signal"]


def test_query_probe_reads_once_or_over_a_window(endpoint):
    endpoint.body = exposition(500, 0, 0)
    assert detect.run_query({"url": endpoint.url,
                             "query": 'tracehound_io_write_bytes_total{cgroup="/job"}'}) == 500
    spec = {"url": endpoint.url, "query": "tracehound_io_write_bytes_total", "signal": "rate",
            "window": 0.2}
    assert detect.run_query(spec) == pytest.approx(0.0, abs=1e-9)


def test_check_spec_problems():
    assert detect.check_spec({"source": "process", "command": [sys.executable],
                              "extract": "(a)(b)"})[0][0] == "extract"
    assert detect.check_spec({"source": "udp"}) == [("source", "source must be one of "
                                                               "agent, events, prometheus, process")]
    assert ("timeout", "timeout must be a number of seconds between 0.1 and 3600") in \
        detect.check_spec({"timeout": 0})
