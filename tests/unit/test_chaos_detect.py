"""Detection probes against real HTTP endpoints served from the test: an
agent-style /metrics page whose values change when the "fault" lands, and a
real Prometheus (Debian's) scraping such a page."""
import http.server
import sys
import threading
import time

import pytest

from testbed import prometheus as prometheus_server
from tracehound.chaos import detection as detect, metrics
from tracehound.chaos.faults import Detection
from tracehound.clients.prometheus import wait_for

# what a test waits for at most: never reached unless something is broken
DEADLINE = 60


class Endpoint:
    """A tiny HTTP server whose answer the test changes while probes poll it."""

    def __init__(self):
        self.body = ""
        self.content_type = "text/plain"
        self.served = 0
        self.changed = threading.Condition()
        endpoint = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                data = endpoint.body.encode()
                self.send_response(200)
                self.send_header("Content-Type", endpoint.content_type)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)
                with endpoint.changed:
                    endpoint.served += 1
                    endpoint.changed.notify_all()

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05},
                         daemon=True).start()
        self.address = f"127.0.0.1:{self.server.server_port}"
        self.url = f"http://{self.address}"

    def wait_served(self, count: int) -> None:
        """Until `count` answers in all have been sent."""
        with self.changed:
            assert self.changed.wait_for(lambda: self.served >= count, DEADLINE), \
                f"{self.served} requests, not {count}"

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
    spec = {"url": endpoint.url + "/metrics", "interval": 0.05, "timeout": DEADLINE,
            "window": 0.2}
    spec = detect.with_defaults(spec, Detection(
        query='tracehound_io_write_latency_seconds{cgroup="/job"}', signal="mean",
        predicate="> 0.01", note="slow writes"))
    baseline = detect.take_baseline(spec)
    # the fault went in 30 s before the probe started (a long apply, a pause)
    applied = time.monotonic() - 30
    read_before = endpoint.served
    landed = []

    def fault_lands():
        endpoint.wait_served(read_before + 3)   # the probe saw the unchanged page
        landed.append(time.monotonic())
        endpoint.body = exposition(1000, 2.001, 20)   # 10 calls, 0.2 s each

    lands = threading.Thread(target=fault_lands)
    lands.start()
    result = detect.run_detection(spec, applied, baseline, "io.throttle")
    returned = time.monotonic()
    lands.join()
    assert result["detected"] is True
    assert result["tracehound_signal"] is True
    assert result["value"] == pytest.approx(0.2)
    assert result["note"] == "slow writes"
    # MTTD runs from `applied` to the reading that saw the fault: after it
    # landed, by the time the probe returned (to the millisecond it rounds to)
    assert landed[0] - applied - 0.001 <= result["mttd_seconds"] <= returned - applied + 0.001
    # no reading before the fault landed had a value; the one that saw it is the last
    assert result["samples"] == [[result["mttd_seconds"], pytest.approx(0.2)]]


def test_detection_times_out_and_says_why(endpoint):
    endpoint.body = exposition(1000, 0, 0)
    spec = {"url": endpoint.url, "query": 'tracehound_io_write_bytes_total{cgroup="/gone"}',
            "predicate": "> 0", "timeout": 0.3, "interval": 0.1}
    result = detect.run_detection(spec, time.monotonic(), None, "proc.stop")
    assert result["detected"] is False and result["mttd_seconds"] is None
    assert "no series matched" in result["note"]


def test_fault_without_tracehound_signal_is_reported_not_polled(monkeypatch):
    def no_reading(spec):
        raise AssertionError(f"polled {spec}")

    def no_waiting(seconds):
        raise AssertionError(f"waited {seconds} s")

    monkeypatch.setattr(detect, "reader", no_reading)
    monkeypatch.setattr(detect.time, "sleep", no_waiting)
    spec = detect.with_defaults({"timeout": 30}, Detection(note="no network metric"))
    result = detect.run_detection(spec, time.monotonic(), None, "net.loss")
    assert result["detected"] is False and result["tracehound_signal"] is False
    assert result["mttd_seconds"] is None and result["samples"] == []
    assert result["note"] == "no network metric"


@pytest.fixture(scope="module")
def prometheus(tmp_path_factory):
    """A real Prometheus scraping a page with two series of one metric."""
    page = Endpoint()
    page.body = ("# TYPE chaos_probe_level gauge\n"
                 'chaos_probe_level{part="a"} 0.25\n'
                 'chaos_probe_level{part="b"} 0.5\n')
    config = {"global": {"scrape_interval": "200ms", "scrape_timeout": "200ms"},
              "scrape_configs": [{"job_name": "page",
                                  "static_configs": [{"targets": [page.address]}]}]}
    try:
        with prometheus_server.serving(tmp_path_factory.mktemp("prometheus"), config) as url:
            wait_for(url, "count(chaos_probe_level) == 2", timeout=DEADLINE, interval=0.1)
            yield url
    finally:
        page.close()


def test_prometheus_source(prometheus):
    # the query returns both series: the probe adds them up
    spec = {"source": "prometheus", "url": prometheus, "query": "chaos_probe_level",
            "predicate": "> 0.7", "timeout": DEADLINE, "interval": 0.1}
    result = detect.run_detection(spec, time.monotonic(), None, "io.throttle")
    assert result["detected"] and result["value"] == pytest.approx(0.75)
    assert result["query"] == "chaos_probe_level" and not result["tracehound_signal"]
    assert metrics.promql_value(prometheus, 'chaos_probe_level{part="b"}') == 0.5
    assert metrics.promql_value(prometheus, 'chaos_probe_level{part="c"}') is None
    with pytest.raises(metrics.QueryError, match="parse error"):
        metrics.promql_value(prometheus, "((")


def test_process_source_extracts_a_number(tmp_path):
    counter, reads = tmp_path / "n", tmp_path / "reads"
    counter.write_text("drops 0\n")
    spec = {"source": "process", "command": ["sh", "-c", f"echo >> {reads}; cat {counter}"],
            "extract": r"drops (\d+)", "signal": "increase", "predicate": "> 2",
            "timeout": DEADLINE, "interval": 0.05}
    baseline = detect.take_baseline(spec)

    def fault_lands():
        # once the probe has read the counter after the baseline did
        deadline = time.monotonic() + DEADLINE
        while time.monotonic() < deadline and len(reads.read_text().splitlines()) < 2:
            time.sleep(0.01)
        counter.write_text("drops 7\n")

    lands = threading.Thread(target=fault_lands)
    lands.start()
    result = detect.run_detection(spec, time.monotonic(), baseline, "net.loss")
    lands.join()
    assert result["detected"] and result["value"] == 7 and not result["tracehound_signal"]
    # the readings before the counter moved showed no increase
    assert [v for _, v in result["samples"]][:-1] == [0.0] * (len(result["samples"]) - 1)


def test_query_probe_reads_once_or_over_a_window(endpoint):
    endpoint.body = exposition(500, 0, 0)
    assert detect.run_query({"url": endpoint.url,
                             "query": 'tracehound_io_write_bytes_total{cgroup="/job"}'}) == 500
    spec = {"url": endpoint.url, "query": "tracehound_io_write_bytes_total", "signal": "rate",
            "window": 0.2}
    assert detect.run_query(spec) == pytest.approx(0.0, abs=1e-9)


def test_the_signal_before_the_fault_is_read_as_the_probe_will_judge_it(endpoint):
    endpoint.body = exposition(500, 0, 0)
    spec = {"url": endpoint.url, "query": 'tracehound_io_write_bytes_total{cgroup="/job"}',
            "signal": "rate", "window": 0.2}
    served = endpoint.served

    def grows():            # 100 bytes between the two readings, 0.2 s or more apart
        endpoint.wait_served(served + 1)
        endpoint.body = exposition(600, 0, 0)
    writer = threading.Thread(target=grows)
    writer.start()
    baseline, before = detect.baseline_and_before(spec)
    writer.join()
    assert 0 < before <= 100 / 0.2
    # the second reading is where the signal under the fault starts from
    assert baseline[1] == 600
    # an agent that does not answer: no value, and the run goes on
    assert detect.baseline_and_before({**spec, "url": "http://127.0.0.1:1/metrics"}) == \
        (None, None)


def test_check_spec_problems():
    assert detect.check_spec({"source": "process", "command": [sys.executable],
                              "extract": "(a)(b)"})[0][0] == "extract"
    assert detect.check_spec({"source": "udp"}) == [("source", "source must be one of "
                                                               "agent, events, prometheus, process")]
    assert ("timeout", "timeout must be a number of seconds between 0.1 and 3600") in \
        detect.check_spec({"timeout": 0})
