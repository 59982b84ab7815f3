"""Names read from the node in the agent's own output: a cgroup (or process,
or mount point) named with bytes that are not UTF-8, or with control
characters, reaches every format as valid UTF-8, and one family that cannot
be rendered never cuts the scrape short or fails it."""
import gzip
import json
import logging
import os

import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.openmetrics.parser import text_string_to_metric_families as om_parse
from prometheus_client.parser import text_string_to_metric_families as text_parse

from tracehound.attribution.cgroup_watch import CgroupWatcher
from tracehound.exporter import failures
from tracehound.exporter import rows as rows_mod
from tracehound.exporter.events import EventLog
from tracehound.exporter.messages import call_wsgi
from tracehound.exporter.registry import CollectorHealth
from tracehound.exporter.scrape import Scraper
from tracehound.utf8 import valid_utf8

from .test_exposition import request
from .test_protobuf import decode, label_dict
from .waiting import wait_until

# what os.listdir() and /proc give for a directory named b"bad\xff\xfe\r"
RAW = b"/x/bad\xff\xfe\r\x1b[2J"
HOSTILE = RAW.decode("utf-8", "surrogateescape")
SHOWN = "/x/bad\ufffd\ufffd\r\x1b[2J"
OM = "application/openmetrics-text; version=1.0.0"
PROTO = ("application/vnd.google.protobuf; proto=io.prometheus.client.MetricFamily; "
         "encoding=delimited")


class Families:
    """A collector yielding fixed families (made fresh at each collection)."""

    def __init__(self, make):
        self.make = make

    def collect(self):
        return self.make()


def scraper(make) -> Scraper:
    registry = CollectorRegistry()
    registry.register(Families(make))
    registry.register(CollectorHealth([]))
    return Scraper(registry)


@pytest.fixture(autouse=True)
def fresh_failures(monkeypatch):
    """Failures counted by these tests alone."""
    counted = failures.FamilyFailures()
    monkeypatch.setattr(failures, "FAILURES", counted)
    return counted


def net_like():
    """Families as the net collector builds them (prometheus_client classes
    with the owner's cgroup path), between two others."""
    before = GaugeMetricFamily("t_before", "First.", value=1)
    sent = CounterMetricFamily("t_sent_bytes", "Bytes sent.", labels=["cgroup", "job_id"])
    sent.add_metric([HOSTILE, ""], 7)
    sent.add_metric(["/ok", "3"], 1)
    after = GaugeMetricFamily("t_after", "Last.", value=2)
    return [before, sent, after]


def samples_of(fams) -> dict:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value for f in fams for s in f.samples}


EXPECTED = {
    ("t_before", ()): 1.0,
    ("t_sent_bytes_total", (("cgroup", SHOWN),)): 7.0,
    ("t_sent_bytes_total", (("cgroup", "/ok"), ("job_id", "3"))): 1.0,
    ("t_after", ()): 2.0,
}


def test_a_cgroup_named_with_non_utf8_bytes_is_served_whole_in_text_and_gzip():
    s = scraper(net_like)
    plain = s.respond(request()).body
    gz = s.respond(request(encoding="gzip"))
    assert gz.status == 200
    for body in (plain, gzip.decompress(gz.body)):
        got = samples_of(text_parse(body.decode("utf-8")))
        assert {k: v for k, v in got.items() if k[0].startswith("t_")} == EXPECTED
        assert "tracehound_scrape_samples" in {k[0] for k in got}
    assert failures.FAILURES.counts() == {}


def test_a_cgroup_named_with_non_utf8_bytes_is_served_in_openmetrics_and_protobuf():
    s = scraper(net_like)
    om = s.respond(request(accept=OM)).body.decode("utf-8")
    assert om.endswith("# EOF\n")
    got = samples_of(om_parse(om))
    assert {k: v for k, v in got.items() if k[0].startswith("t_")} == EXPECTED
    messages = {m.name: m for m in decode(s.respond(request(accept=PROTO)).body)}
    labels = [label_dict(m) for m in messages["t_sent_bytes_total"].metric]
    assert {"cgroup": SHOWN} in labels and "t_after" in messages


class Broken(Metric):
    """A family whose samples cannot even be read."""

    def __init__(self):
        super().__init__("t_broken", "Raises.", "gauge")

    @property
    def samples(self):
        raise RuntimeError("no samples today")

    @samples.setter
    def samples(self, _value):
        pass


class BrokenRows(rows_mod.ValueRows):
    def text(self, openmetrics):
        raise RuntimeError("no text today")

    def proto(self):
        raise RuntimeError("no proto today")


def with_broken():
    blocks = rows_mod.Blocks(["cgroup"])
    rows = [blocks.get((HOSTILE,))]
    return [GaugeMetricFamily("t_before", "First.", value=1), Broken(),
            BrokenRows("t_rows", "Rows.", "gauge", rows, [1]),
            rows_mod.ValueRows("t_good_rows", "Rows.", "gauge", rows, [5]),
            GaugeMetricFamily("t_after", "Last.", value=2)]


def test_a_family_that_raises_is_left_out_counted_and_the_rest_is_served(caplog, fresh_failures):
    s = scraper(with_broken)
    with caplog.at_level(logging.WARNING):
        for accept, encoding, parse in (("", "", text_parse), ("", "gzip", text_parse),
                                        (OM, "", om_parse), (OM, "gzip", om_parse)):
            r = s.respond(request(accept=accept, encoding=encoding))
            assert r.status == 200
            body = gzip.decompress(r.body) if encoding else r.body
            got = samples_of(parse(body.decode("utf-8")))
            assert {k for k in got if k[0].startswith("t_")} == {
                ("t_before", ()), ("t_good_rows", (("cgroup", SHOWN),)), ("t_after", ())}
        messages = {m.name for m in decode(s.respond(request(accept=PROTO)).body)}
        assert {"t_before", "t_good_rows", "t_after"} <= messages
        assert not {"t_broken", "t_rows"} & messages
        only = s.respond(request(query="name[]=t_after&name[]=t_broken")).body.decode()
        assert [f.name for f in text_parse(only)] == ["t_after"]
    assert fresh_failures.counts() == {"t_broken": 6, "t_rows": 5}
    # said once per family, not once per scrape
    assert sum("t_broken" in r.getMessage() for r in caplog.records) == 1
    counted = samples_of(text_parse(s.respond(request()).body.decode()))
    assert counted[("tracehound_exposition_families_failed_total",
                    (("family", "t_broken"),))] == 6.0


def test_a_watched_directory_named_with_non_utf8_bytes_is_watched(tmp_path):
    """cgroupfs or not, inotify takes the name's bytes: a subtree named so is
    reported at start and its new children after."""
    root = os.fsencode(tmp_path)
    os.makedirs(root + b"/a/bad\xff\xfe")
    seen = []
    watcher = CgroupWatcher(str(tmp_path), lambda ino, path: seen.append(path),
                            lambda path: None).start()
    try:
        assert "/a/bad\udcff\udcfe" in seen
        os.mkdir(root + b"/a/bad\xff\xfe/child\x80")
        wait_until(lambda: "/a/bad\udcff\udcfe/child\udc80" in seen,
                   "the watcher reporting a child of a non-UTF-8 directory")
    finally:
        watcher.close()


def test_events_carrying_non_utf8_names_are_served_as_utf8_json():
    log = EventLog()
    # detectors write events with json.dumps: a surrogate becomes "\udcff"
    log.emit(logging.LogRecord("tracehound.events", logging.WARNING, __file__, 1, json.dumps(
        {"kind": "stall", "cgroup": HOSTILE, "names": [HOSTILE], HOSTILE: 1}), None, None))
    body = call_wsgi(log.wsgi, request(query="since=0")).body
    body.decode("utf-8")
    (event,) = json.loads(body)["events"]
    # no lone surrogate left: every string encodes as UTF-8, as any reader needs
    assert event["cgroup"] == event["names"][0] == SHOWN and event[SHOWN] == 1
    json.dumps(event, ensure_ascii=False).encode("utf-8")


def test_valid_utf8_replaces_what_utf8_cannot_carry_and_keeps_the_rest():
    assert valid_utf8(HOSTILE) == SHOWN
    assert valid_utf8("\ud800x\udfff") == "\ufffdx\ufffd"
    assert valid_utf8("naïve \u2028 ok") == "naïve \u2028 ok"


HOSTILE_VALUES = [HOSTILE, "\ud800\udfff", 'q"uote\\back\nnew\\n', "\x00\x7f\x85\u2028\u2029",
                  "}{,=", " lead and trail ", "\ufffd", "é 日本 🙂"]


def test_promtool_accepts_every_hostile_label_value_in_one_scrape():
    """Prometheus's own parser (promtool, once) over what the tests above
    generate one by one."""
    import shutil
    import subprocess

    def make():
        blocks = rows_mod.Blocks(["cgroup"])
        rows = rows_mod.ValueRows("t_rows", "Rows.", "counter",
                                    [blocks.get((v,)) for v in HOSTILE_VALUES],
                                    list(range(len(HOSTILE_VALUES))))
        plain = GaugeMetricFamily("t_plain", "Plain \udcff help.", labels=["cgroup"])
        for i, v in enumerate(HOSTILE_VALUES):
            plain.add_metric([v], i)
        return [rows, plain]

    promtool = shutil.which("promtool")
    assert promtool, "promtool is missing: apt-get install prometheus (scripts/install --dev does)"
    body = scraper(make).respond(request()).body
    res = subprocess.run([promtool, "check", "metrics"], input=body, capture_output=True,
                         timeout=60)
    assert res.returncode == 0, res.stdout + res.stderr
    got = samples_of(text_parse(body.decode("utf-8")))
    assert {dict(k[1])["cgroup"] for k in got if k[0] == "t_plain"} == {
        valid_utf8(v) for v in HOSTILE_VALUES}
