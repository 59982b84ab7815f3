"""The bytes-level exposition: the same samples as prometheus_client renders
for the same families, in Prometheus text and OpenMetrics, and one shared
collection per burst of concurrent scrapes."""
import gzip
import threading
import time
import zlib
from email.message import Message

import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.openmetrics.parser import text_string_to_metric_families as om_parse
from prometheus_client.parser import text_string_to_metric_families as text_parse

from tracehound.exporter import exposition, scrape
from tracehound.exporter.exposition import render
from tracehound.exporter.rows import Blocks, HistogramRows, Log2Histogram, ValueRows
from tracehound.exporter.messages import Request
from tracehound.exporter.scrape import Scraper

from .waiting import DEADLINE_S, wait_until

NAMES = ("cgroup", "mountpoint", "job_id")
SHAPE = Log2Histogram(32, 1e-9, 10)


def request(accept="", encoding="", query=""):
    headers = Message()
    if accept:
        headers["Accept"] = accept
    if encoding:
        headers["Accept-Encoding"] = encoding
    return Request("GET", "/metrics", query, headers, "HTTP/1.1", ("127.0.0.1", 1), "x", 1)


def parsed(text: str, parse=text_parse) -> dict:
    """family name -> (type, sorted samples without empty labels)."""
    out = {}
    for fam in parse(text):
        samples = sorted((s.name, tuple(sorted((k, v) for k, v in s.labels.items() if v)),
                          float(s.value)) for s in fam.samples)
        out[fam.name] = (fam.type, samples)
    return out


def families():
    blocks = Blocks(NAMES)
    rows = [blocks.get(v) for v in [("/a", "/", ""), ("/b \"q\" \\ \n x", "/mnt/ü", "42"),
                                    ("", "", "")]]
    slots = [[0] * 32, [3, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 2] + [0] * 19 + [5],
             [0] * 14 + [7] + [0] * 17]
    return [
        ValueRows("t_bytes", "Bytes.\nTwo lines \\ and \"quotes\".", "counter", rows, [0, 10, 2**63]),
        ValueRows("t_level", "A gauge.", "gauge", rows, [1.5, -2, float("inf")]),
        HistogramRows("t_latency_seconds", "Latency.", rows, slots, [0.0, 1.25e-3, 7e-9], SHAPE),
        GaugeMetricFamily("t_plain", "From the library.", value=3),
        ValueRows("t_empty", "No rows.", "counter", [], []),
    ]


def library_text(fams) -> str:
    class R:
        def collect(self):
            return fams
    from prometheus_client.exposition import generate_latest
    return generate_latest(R()).decode()


def test_text_has_the_samples_prometheus_client_renders_for_the_same_families():
    fams = families()
    ours = b"".join(render(fams, exposition.TEXT)).decode()
    want = parsed(library_text(fams))
    got = parsed(ours)
    assert got == want
    assert got["t_latency_seconds"][1]       # not two empty renderings
    assert 't_bytes_total{cgroup="/a",mountpoint="/"} 0\n' in ours   # empty labels left out
    assert "t_bytes_total 9223372036854775808\n" in ours            # no labels at all: no braces
    assert "# TYPE t_empty_total counter\n" in ours and "\nt_empty" not in ours


def test_openmetrics_parses_strictly_and_has_the_same_samples():
    fams = families()
    ours = b"".join(render(fams, exposition.OPENMETRICS)).decode()
    assert ours.endswith("# EOF\n") and ours.count("# EOF") == 1
    got = parsed(ours, om_parse)
    want = parsed(library_text(fams))
    # OpenMetrics names counters without _total and keeps _created apart
    assert got["t_bytes"][1] == want["t_bytes"][1]
    assert got["t_latency_seconds"] == want["t_latency_seconds"]
    assert got["t_plain"] == want["t_plain"]


def test_histogram_buckets_are_cumulative_log2_bounds_in_seconds():
    slots = [0] * 32
    slots[9] = 4        # [512, 1024) ns: inside the first bucket, le=1.024e-06
    slots[10] = 1       # [1024, 2048) ns: le=2.048e-06
    slots[31] = 2       # >= 2^31 ns: only +Inf
    block = Blocks(("cgroup",)).get(("/a",))
    text = b"".join(HistogramRows("h", "h.", [block], [slots], [9.0], SHAPE).text(False)).decode()
    samples = {(s.name, s.labels.get("le")): s.value
               for fam in text_parse(text) for s in fam.samples}
    assert samples[("h_bucket", "1.024e-06")] == 4
    assert samples[("h_bucket", "2.048e-06")] == 5
    assert samples[("h_bucket", "1.073741824")] == 5
    assert samples[("h_bucket", "2.147483648")] == 5
    assert samples[("h_bucket", "+Inf")] == samples[("h_count", None)] == 7
    assert samples[("h_sum", None)] == 9.0
    assert sum(1 for k in samples if k[0] == "h_bucket") == 23


def test_native_buckets_overlap_most_of_their_slot():
    # slot s is [2^s, 2^(s+1)) ns; schema-0 bucket i is (2^(i-1), 2^i] seconds
    assert SHAPE.native_offset == -29
    for s in range(32):
        i = s + SHAPE.native_offset
        lower, upper = 2 ** s * 1e-9, 2 ** (s + 1) * 1e-9
        overlap = min(upper, 2 ** i) - max(lower, 2 ** (i - 1))
        assert overlap > 0.85 * (upper - lower)
        assert 0.93 < 2 ** i / upper < 0.94


def test_blocks_are_kept_while_used_and_forgotten_after_a_collection_without_them():
    blocks = Blocks(NAMES)
    blocks.rotate()
    a = blocks.get(("/a", "/", ""))
    assert blocks.get(("/a", "/", "")) is a and a.braced == b'{cgroup="/a",mountpoint="/"}'
    blocks.rotate()
    assert blocks.get(("/a", "/", "")) is a          # used again: the same rendering
    blocks.rotate()
    blocks.rotate()                                   # a whole collection without it
    assert blocks.get(("/a", "/", "")) is not a
    assert len(blocks) == 1


class SlowCollector:
    """A collection that takes `delay` s, or until the test opens `gate`."""

    def __init__(self, delay=0.0, fail=False, gated=False):
        self.calls = 0
        self.delay = delay
        self.fail = fail
        self.collecting = threading.Event()
        self.gate = threading.Event()
        if not gated:
            self.gate.set()
        self.spent = []                 # how long each collection took, as it saw it

    def collect(self):
        began = time.perf_counter()
        self.calls += 1
        self.collecting.set()
        assert self.gate.wait(DEADLINE_S)
        time.sleep(self.delay)          # the collection's own work
        self.spent.append(time.perf_counter() - began)
        if self.fail:
            raise OSError("map read failed")
        c = CounterMetricFamily("t_calls", "Calls.", labels=["x"])
        c.add_metric(["1"], self.calls)
        yield c


def scraper(collector):
    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)
    return Scraper(registry)


def joining(monkeypatch):
    """A list that grows by one as each scrape joins a collection already
    running (and starts waiting for it)."""
    joined = []
    wait = scrape._Pending.wait

    def counted(self):
        joined.append(self)
        return wait(self)
    monkeypatch.setattr(scrape._Pending, "wait", counted)
    return joined


def burst(s, collector, joined, count, scrape_once):
    """`count` scrapes: the first collects, and holds its collection open
    until every other one has joined it."""
    threads = [threading.Thread(target=scrape_once, daemon=True) for _ in range(count)]
    threads[0].start()
    try:
        assert collector.collecting.wait(DEADLINE_S)
        for t in threads[1:]:
            t.start()
        wait_until(lambda: len(joined) == count - 1, f"{count - 1} scrapes to join the first")
    finally:
        collector.gate.set()
    for t in threads:
        t.join(DEADLINE_S)
    assert not any(t.is_alive() for t in threads)


def test_concurrent_scrapes_share_one_collection(monkeypatch):
    joined = joining(monkeypatch)
    collector = SlowCollector(gated=True)
    s = scraper(collector)
    bodies = []
    burst(s, collector, joined, 4, lambda: bodies.append(s.respond(request()).body))
    assert collector.calls == 1 and s.collections == 1
    assert len(bodies) == 4 and all(b't_calls_total{x="1"} 1' in b for b in bodies)
    s.respond(request())          # one after the burst collects afresh
    assert collector.calls == 2


def test_a_failed_shared_collection_fails_every_scrape_that_joined_it(monkeypatch):
    joined = joining(monkeypatch)
    collector = SlowCollector(fail=True, gated=True)
    s = scraper(collector)
    errors = []

    def scrape_once():
        try:
            s.respond(request())
        except Exception as exc:   # noqa: BLE001
            errors.append(exc)
    burst(s, collector, joined, 3, scrape_once)
    assert collector.calls == 1 and len(errors) == 3


def test_the_agent_reports_its_last_scrape():
    collector = SlowCollector(delay=0.05)
    s = scraper(collector)
    s.respond(request()).body            # a scrape counts once its body is made
    second = s.respond(request()).body.decode()
    got = {fam.name: fam.samples[0].value for fam in text_parse(second)}
    # the first scrape's time, which takes in its collection
    assert got["tracehound_scrape_duration_seconds"] >= collector.spent[0]
    # the first scrape: one t_calls sample and the two scrape gauges
    assert got["tracehound_scrape_samples"] == 3


def test_gzip_openmetrics_and_name_filter():
    s = scraper(SlowCollector(delay=0))
    r = s.respond(request(encoding="gzip"))
    assert dict(r.headers)["Content-Encoding"] == "gzip"
    assert b't_calls_total{x="1"} 1' in gzip.decompress(r.body)
    om = s.respond(request(accept="application/openmetrics-text; version=1.0.0"))
    assert dict(om.headers)["Content-Type"].startswith("application/openmetrics-text")
    assert om.body.endswith(b"# EOF\n")
    only = s.respond(request(query="name[]=tracehound_scrape_samples")).body.decode()
    assert [f.name for f in text_parse(only)] == ["tracehound_scrape_samples"]
    with pytest.raises(zlib.error):
        zlib.decompress(s.respond(request()).body, 31)    # not asked: not compressed
