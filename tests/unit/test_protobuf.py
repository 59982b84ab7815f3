"""The hand-written protobuf encoder, read back by the reference protobuf
runtime through client_model's metrics.proto, built from a descriptor in
testbed/metrics_proto.py."""
import importlib.util
import math
import sys
from array import array
from itertools import accumulate

import pytest
from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import (
    CounterMetricFamily, GaugeHistogramMetricFamily, GaugeMetricFamily, HistogramMetricFamily,
    InfoMetricFamily, StateSetMetricFamily, SummaryMetricFamily, UnknownMetricFamily)
from prometheus_client.samples import Timestamp

from tracehound.exporter import protobuf

from testbed.metrics_proto import message_classes, read_varint

MetricFamily = message_classes()["MetricFamily"]


def decode(data: bytes) -> list:
    """Every MetricFamily of a delimited stream; each length prefix must end
    exactly where the next message begins."""
    families, pos = [], 0
    while pos < len(data):
        size, pos = read_varint(data, pos)
        assert pos + size <= len(data), "length prefix runs past the end"
        mf = MetricFamily()
        mf.ParseFromString(data[pos:pos + size])
        families.append(mf)
        pos += size
    return families


def one(data: bytes):
    families = decode(data)
    assert len(families) == 1
    return families[0]


def label_dict(m) -> dict:
    return {p.name: p.value for p in m.label}


def native_buckets(h) -> dict[int, int]:
    """Spans and deltas expanded back to {bucket index: count}; zero-count
    buckets (a bridged gap) carry no information and are dropped."""
    counts = list(accumulate(h.positive_delta))
    assert all(c >= 0 for c in counts)
    out, index, i = {}, None, 0
    for span in h.positive_span:
        index = span.offset if index is None else index + span.offset
        for _ in range(span.length):
            out[index] = counts[i]
            index, i = index + 1, i + 1
    assert i == len(counts), "deltas and span lengths disagree"
    return {k: v for k, v in out.items() if v}


# -- primitives --------------------------------------------------------------

@pytest.mark.parametrize("n, wire", [
    (0, b"\x00"), (1, b"\x01"), (127, b"\x7f"), (128, b"\x80\x01"), (300, b"\xac\x02"),
    (16383, b"\xff\x7f"), (16384, b"\x80\x80\x01"),
    (2 ** 63, b"\x80" * 9 + b"\x01"), (2 ** 64 - 1, b"\xff" * 9 + b"\x01"),
])
def test_varint(n, wire):
    assert protobuf.varint(n) == wire
    assert read_varint(wire) == (n, len(wire))


def test_varint_round_trips_across_byte_boundaries():
    for k in range(64):
        for n in (2 ** k - 1, 2 ** k, 2 ** k + 1):
            assert read_varint(protobuf.varint(n)) == (n, len(protobuf.varint(n)))


def test_module_loads_without_google_protobuf(monkeypatch):
    monkeypatch.setitem(sys.modules, "google", None)
    monkeypatch.setitem(sys.modules, "google.protobuf", None)
    spec = importlib.util.spec_from_file_location("protobuf_alone", protobuf.__file__)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module.varint(300) == b"\xac\x02"


# -- simple values -----------------------------------------------------------

@pytest.mark.parametrize("encode, type_, field", [
    (protobuf.counter, protobuf.COUNTER, "counter"),
    (protobuf.gauge, protobuf.GAUGE, "gauge"),
    (protobuf.untyped, protobuf.UNTYPED, "untyped"),
])
@pytest.mark.parametrize("value", [0.0, 1.0, -2.5, 1e300, 2 ** 53 + 1.0, math.inf, -math.inf])
def test_simple_values_round_trip(encode, type_, field, value):
    rows = [(("dev", "nvme0n1"), ("op", "read")), (("dev", "sda"), ("op", "write"))]
    data = protobuf.family("io_ops", "I/O operations", type_,
                           [protobuf.metric(protobuf.labels(r), encode(value)) for r in rows])
    mf = one(data)
    assert (mf.name, mf.help, mf.type) == ("io_ops", "I/O operations", type_)
    assert [label_dict(m) for m in mf.metric] == [dict(r) for r in rows]
    for m in mf.metric:
        assert getattr(m, field).value == value
        others = {"counter", "gauge", "untyped"} - {field}
        assert not any(m.HasField(o) for o in others)


def test_nan_survives():
    mf = one(protobuf.family("g", "", protobuf.GAUGE,
                             [protobuf.metric(b"", protobuf.gauge(math.nan))]))
    assert math.isnan(mf.metric[0].gauge.value)
    assert not mf.HasField("help")


def test_labels_keep_order_and_leave_out_empty_values():
    pairs = [("zone", "b"), ("empty", ""), ("pod", 'web-"1"\n\\ü'), ("app", "x")]
    data = protobuf.family("g", "", protobuf.GAUGE,
                           [protobuf.metric(protobuf.labels(pairs), protobuf.gauge(1))])
    m = one(data).metric[0]
    assert [(p.name, p.value) for p in m.label] == [
        ("zone", "b"), ("pod", 'web-"1"\n\\ü'), ("app", "x")]
    assert protobuf.labels([("a", "")]) == b""


def test_help_and_long_names_round_trip():
    help_ = "Bytes read — per device\n" * 40          # over 127 bytes: a 2-byte length
    value = "v" * 20000                                # past the small-varint table
    data = protobuf.family("n" * 200, help_, protobuf.COUNTER, [
        protobuf.metric(protobuf.labels([("l", value)]), protobuf.counter(3))])
    mf = one(data)
    assert (mf.name, mf.help, mf.type) == ("n" * 200, help_, protobuf.COUNTER)
    assert mf.metric[0].label[0].value == value


def test_family_without_metrics_is_left_out():
    assert protobuf.family("g", "help", protobuf.GAUGE, []) == b""


def test_families_concatenate_into_one_stream():
    data = b"".join(protobuf.family(f"g{i}", "", protobuf.GAUGE,
                                    [protobuf.metric(b"", protobuf.gauge(i))])
                    for i in range(300))
    families = decode(data)
    assert [(f.name, f.metric[0].gauge.value) for f in families] == [
        (f"g{i}", i) for i in range(300)]


# -- summaries and classic histograms ------------------------------------------

def test_summary_round_trips():
    quantiles = [(0.5, 1.25), (0.9, 3.5), (0.99, 8.0)]
    data = protobuf.family("lat", "", protobuf.SUMMARY, [
        protobuf.metric(protobuf.labels([("op", "r")]),
                        protobuf.summary(1000, 1234.5, quantiles))])
    m = one(data).metric[0]
    assert (m.summary.sample_count, m.summary.sample_sum) == (1000, 1234.5)
    assert [(q.quantile, q.value) for q in m.summary.quantile] == quantiles
    assert label_dict(m) == {"op": "r"}


def test_classic_histogram_round_trips_and_leaves_inf_to_the_count():
    buckets = [(0.001, 3), (0.01, 7), (0.1, 7), (1.0, 200000), (math.inf, 200001)]
    data = protobuf.family("lat", "", protobuf.HISTOGRAM, [
        protobuf.metric(b"", protobuf.classic_histogram(buckets, 17.5, 200001))])
    h = one(data).metric[0].histogram
    assert (h.sample_count, h.sample_sum) == (200001, 17.5)
    assert [(b.upper_bound, b.cumulative_count) for b in h.bucket] == buckets[:-1]
    # nothing that would make Prometheus read it as native
    assert h.zero_threshold == 0 and h.zero_count == 0
    assert not h.positive_span and not h.negative_span and not h.positive_delta


# -- native histograms ---------------------------------------------------------

def _native(slots, offset=0, total=1.5):
    data = protobuf.family("lat", "", protobuf.HISTOGRAM, [
        protobuf.metric(b"", protobuf.native_histogram(slots, offset, total))])
    return one(data).metric[0].histogram


def _padded(counts: dict[int, int]) -> list[int]:
    slots = [0] * 32
    for s, c in counts.items():
        slots[s] = c
    return slots


NATIVE_CASES = {
    "single slot": {7: 4},
    "single slot at 0": {0: 1},
    "last slot": {31: 9},
    "gap of 1": {3: 5, 5: 2},
    "gap of 2": {3: 5, 6: 9},
    "gap of 3": {3: 5, 7: 1},
    "gaps of 1, 2, 3 and 10": {0: 1, 2: 1, 5: 3, 9: 2, 20: 40},
    "runs and gaps": {1: 2, 2: 3, 3: 1, 8: 6, 9: 6, 12: 1},
    "all 32": {s: (s * 37) % 11 + 1 for s in range(32)},
    "decreasing": {4: 1000, 5: 10, 6: 1},
    "huge counts": {2: 2 ** 40, 3: 1, 4: 2 ** 62},
}


@pytest.mark.parametrize("offset", [0, 5, -28])
@pytest.mark.parametrize("counts", NATIVE_CASES.values(), ids=NATIVE_CASES.keys())
def test_native_histogram_buckets_round_trip(counts, offset):
    h = _native(array("Q", _padded(counts)), offset, total=123.25)
    assert native_buckets(h) == {s + offset: c for s, c in counts.items()}
    assert h.sample_count == sum(counts.values())
    assert h.sample_sum == 123.25
    assert h.schema == 0 and h.zero_count == 0 and h.zero_threshold > 0
    assert not h.bucket and not h.negative_span and not h.negative_delta


def test_native_histogram_spans_are_sparse():
    """Without bridging, a gap of 3 or more opens a new span whose offset is
    the gap; the first offset is the absolute index."""
    h = _native(_padded({3: 5, 4: 1, 8: 2}), offset=-10)
    assert [(s.offset, s.length) for s in h.positive_span] == [(-7, 2), (3, 1)]
    assert list(h.positive_delta) == [5, -4, 1]


def test_native_negative_deltas_are_zigzag():
    body = protobuf.native_histogram([5, 2], 0, 0.0)
    # packed deltas: 5 -> zigzag 10, -3 -> zigzag 5
    assert b"\x6a\x02\x0a\x05" in body
    assert list(_native([5, 2]).positive_delta) == [5, -3]


def test_empty_native_histogram_is_still_native():
    h = _native(array("Q", [0] * 32), offset=-28, total=0.0)
    assert h.sample_count == 0 and h.sample_sum == 0
    assert not h.positive_span and not h.positive_delta
    # Prometheus reads a histogram as native iff it has spans, a zero count
    # or a positive zero threshold
    assert h.zero_threshold == 2.0 ** -128
    custom = protobuf.native_histogram([], 0, 0.0, zero_threshold=1e-9)
    assert one(protobuf.family("x", "", protobuf.HISTOGRAM, [
        protobuf.metric(b"", custom)])).metric[0].histogram.zero_threshold == 1e-9


# -- prometheus_client families --------------------------------------------------

def test_counter_family_drops_created():
    fam = CounterMetricFamily("reqs", "Requests.", labels=["code"])
    fam.add_metric(["200"], 10, created=1700000000.0)
    fam.add_metric([""], 2.5, created=1700000001.0)
    mf = one(protobuf.from_metric(fam))
    assert (mf.name, mf.help, mf.type) == ("reqs_total", "Requests.", protobuf.COUNTER)
    assert [(label_dict(m), m.counter.value) for m in mf.metric] == [({"code": "200"}, 10),
                                                                     ({}, 2.5)]
    assert not any(m.HasField("timestamp_ms") for m in mf.metric)


def test_gauge_family_with_timestamps():
    fam = GaugeMetricFamily("temp", "Temperature.", labels=["gpu", "host"])
    fam.add_metric(["0", "a"], 41.5, timestamp=1700000000.123)
    fam.add_metric(["1", "a"], 43.0, timestamp=Timestamp(1700000001, 456000000))
    fam.add_metric(["2", "a"], 44.0)
    fam.add_metric(["3", "a"], 45.0, timestamp=-1.5)
    mf = one(protobuf.from_metric(fam))
    assert (mf.name, mf.type) == ("temp", protobuf.GAUGE)
    assert [(label_dict(m), m.gauge.value) for m in mf.metric] == [
        ({"gpu": "0", "host": "a"}, 41.5), ({"gpu": "1", "host": "a"}, 43.0),
        ({"gpu": "2", "host": "a"}, 44.0), ({"gpu": "3", "host": "a"}, 45.0)]
    assert [m.timestamp_ms for m in mf.metric] == [1700000000123, 1700000001456, 0, -1500]
    assert not mf.metric[2].HasField("timestamp_ms")


def test_info_family():
    fam = InfoMetricFamily("build", "Build.", value={"version": "1.2", "commit": ""})
    mf = one(protobuf.from_metric(fam))
    assert (mf.name, mf.type) == ("build_info", protobuf.GAUGE)
    assert [(label_dict(m), m.gauge.value) for m in mf.metric] == [({"version": "1.2"}, 1)]


def test_stateset_family():
    fam = StateSetMetricFamily("mode", "Mode.", value={"on": True, "off": False})
    mf = one(protobuf.from_metric(fam))
    assert (mf.name, mf.type) == ("mode", protobuf.GAUGE)
    assert sorted((label_dict(m)["mode"], m.gauge.value) for m in mf.metric) == [
        ("off", 0), ("on", 1)]


def test_unknown_family():
    fam = UnknownMetricFamily("thing", "Thing.", labels=["k"])
    fam.add_metric(["v"], 7)
    mf = one(protobuf.from_metric(fam))
    assert (mf.name, mf.type) == ("thing", protobuf.UNTYPED)
    assert [(label_dict(m), m.untyped.value) for m in mf.metric] == [({"k": "v"}, 7)]


def test_histogram_family_groups_by_labels_without_le():
    fam = HistogramMetricFamily("lat", "Latency.", labels=["op"])
    fam.add_metric(["r"], [("0.1", 2), ("1.0", 5), ("+Inf", 6)], 3.5)
    fam.add_metric(["w"], [("0.1", 0), ("1.0", 1), ("+Inf", 1)], 0.5)
    mf = one(protobuf.from_metric(fam))
    assert (mf.name, mf.type) == ("lat", protobuf.HISTOGRAM)
    got = [(label_dict(m), m.histogram.sample_count, m.histogram.sample_sum,
            [(b.upper_bound, b.cumulative_count) for b in m.histogram.bucket])
           for m in mf.metric]
    assert got == [({"op": "r"}, 6, 3.5, [(0.1, 2), (1.0, 5)]),
                   ({"op": "w"}, 1, 0.5, [(0.1, 0), (1.0, 1)])]


def test_gauge_histogram_family():
    fam = GaugeHistogramMetricFamily("queue", "Queue.", labels=["q"])
    fam.add_metric(["a"], [("1.0", 4), ("+Inf", 9)], 20.0)
    mf = one(protobuf.from_metric(fam))
    assert (mf.name, mf.type) == ("queue", protobuf.GAUGE_HISTOGRAM)
    h = mf.metric[0].histogram
    assert (label_dict(mf.metric[0]), h.sample_count, h.sample_sum) == ({"q": "a"}, 9, 20.0)
    assert [(b.upper_bound, b.cumulative_count) for b in h.bucket] == [(1.0, 4)]


def test_summary_family_groups_by_labels_without_quantile():
    fam = SummaryMetricFamily("rpc", "RPC.", labels=["m"])
    fam.add_metric(["get"], count_value=10, sum_value=2.0)
    fam.add_metric(["put"], count_value=3, sum_value=9.0)
    fam.add_sample("rpc", {"m": "get", "quantile": "0.5"}, 0.1)
    fam.add_sample("rpc", {"m": "get", "quantile": "0.99"}, 0.7)
    mf = one(protobuf.from_metric(fam))
    assert (mf.name, mf.type) == ("rpc", protobuf.SUMMARY)
    got = [(label_dict(m), m.summary.sample_count, m.summary.sample_sum,
            [(q.quantile, q.value) for q in m.summary.quantile]) for m in mf.metric]
    assert got == [({"m": "get"}, 10, 2.0, [(0.5, 0.1), (0.99, 0.7)]),
                   ({"m": "put"}, 3, 9.0, [])]


def test_registry_collected_metrics():
    registry = CollectorRegistry()
    reqs = Counter("served", "Served.", ["path"], registry=registry)
    reqs.labels("/metrics").inc(3)
    lat = Histogram("wait_seconds", "Wait.", registry=registry, buckets=(0.5, 2))
    lat.observe(1)
    lat.observe(7)
    data = b"".join(protobuf.from_metric(m) for m in registry.collect())
    served, wait = decode(data)
    assert (served.name, served.type, len(served.metric)) == ("served_total", protobuf.COUNTER, 1)
    assert served.metric[0].counter.value == 3
    h = wait.metric[0].histogram
    assert (wait.name, h.sample_count, h.sample_sum) == ("wait_seconds", 2, 8.0)
    assert [(b.upper_bound, b.cumulative_count) for b in h.bucket] == [(0.5, 0), (2.0, 1)]


def test_family_without_samples_is_left_out():
    assert protobuf.from_metric(GaugeMetricFamily("g", "G.", labels=["a"])) == b""


# -- content negotiation -------------------------------------------------------

NATIVE_PROMETHEUS = ("application/vnd.google.protobuf;proto=io.prometheus.client.MetricFamily;"
                     "encoding=delimited;q=0.7,text/plain;version=0.0.4;q=0.3,*/*;q=0.2")
PLAIN_PROMETHEUS = ("application/openmetrics-text;version=1.0.0,application/openmetrics-text;"
                    "version=0.0.1;q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1")


@pytest.mark.parametrize("header, expected", [
    (NATIVE_PROMETHEUS, True),
    (PLAIN_PROMETHEUS, False),
    (None, False),
    ("", False),
    (protobuf.CONTENT_TYPE, True),
    ("text/plain, Application/Vnd.Google.Protobuf ; PROTO=io.prometheus.client.MetricFamily ;"
     " Encoding=Delimited ; Q=0.5", True),
    ('application/vnd.google.protobuf;proto="io.prometheus.client.MetricFamily";'
     'encoding="delimited"', True),
    ("application/vnd.google.protobuf;proto=io.prometheus.client.MetricFamily;"
     "encoding=delimited;q=0", False),
    ("application/vnd.google.protobuf;proto=io.prometheus.client.MetricFamily;"
     "encoding=delimited;q=0.0,text/plain", False),
    ("application/vnd.google.protobuf;proto=io.prometheus.client.MetricFamily;q=0.7", False),
    ("application/vnd.google.protobuf;proto=io.prometheus.client.MetricFamily;"
     "encoding=text", False),
    ("application/vnd.google.protobuf;encoding=delimited", False),
    ("application/vnd.google.protobuf;proto=io.prometheus.client.MetricFamily;"
     "encoding=delimited;q=oops", False),
    ("*/*", False),
])
def test_accepts(header, expected):
    assert protobuf.accepts(header) is expected
