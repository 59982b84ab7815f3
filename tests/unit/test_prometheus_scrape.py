"""A real Prometheus (Debian's 2.42) scrapes the agent's exporter over the
fixed map contents of test_exposition_unchanged, beside what the agent
served for the same maps before its exposition was rewritten (golden.prom):

* in text, every series and value, and every histogram_quantile, equal the
  old exposition's;
* with native histograms enabled Prometheus asks for protobuf: counters are
  the same, each latency histogram arrives as a native histogram (no
  `_bucket` series) with the same count and sum, and its quantiles are the
  classic ones times 2^(round(l) - l), l = log2(1e-9): the schema-0 buckets
  sit 0.93 below the kernel's nanosecond slots.
"""
import json
import math
import os

import pytest
from prometheus_client import CollectorRegistry

from testbed import prometheus as prometheus_server
from tests.unit.test_exposition_unchanged import (HERE, LEFT_OUT, NEW_FAMILIES, comparable,
                                                   retire_removed,
                                                   started_subsystems)
from tracehound.exporter.registry import register_all
from tracehound.exporter.server import Exporter
from tracehound.clients.prometheus import query, wait_for

HISTOGRAMS = [f"tracehound_io_{op}_latency_seconds" for op in ("read", "write", "fsync")]
QUANTILES = (0.1, 0.5, 0.9, 0.99)
SHIFT = 2 ** (round(math.log2(1e-9)) - math.log2(1e-9))
# the classic first bucket (le=1.024e-06) also holds every faster call, and
# the last one (+Inf) every slower call than 2^31 ns: there the two forms
# interpolate over different ranges
FIRST_CLASSIC_BOUND, LAST_CLASSIC_BOUND = 2 ** 10 * 1e-9, 2 ** 31 * 1e-9


def config(address: str, jobs: dict) -> dict:
    return {"global": {"scrape_interval": "1s", "scrape_timeout": "1s"},
            "scrape_configs": [{"job_name": job, "metrics_path": path,
                                "static_configs": [{"targets": [address]}]}
                               for job, path in jobs.items()]}


@pytest.fixture(scope="module")
def exporter():
    with open(os.path.join(HERE, "maps.json")) as f:
        maps = json.load(f)
    with open(os.path.join(HERE, "golden.prom")) as f:
        # the second scrape: after the removed cgroup's last export
        old = f.read().split("# scrape ")[2].split("\n", 1)[1].encode()

    def old_exposition(environ, start_response):
        start_response("200 OK", [("Content-Type", "text/plain; version=0.0.4")])
        return [old]

    subsystems = started_subsystems(maps)
    registry = register_all(CollectorRegistry(auto_describe=False), subsystems)
    server = Exporter(registry, "127.0.0.1:0", {"/old": old_exposition}).start()
    server.set_ready(True)
    retire_removed(subsystems)
    server.scraper.families()          # the new side's first collection: the same last export
    yield f"127.0.0.1:{server.port}"
    server.stop()


@pytest.fixture(scope="module")
def classic(exporter, tmp_path_factory):
    with prometheus_server.serving(tmp_path_factory.mktemp("classic"),
                                   config(exporter, {"old": "/old", "new": "/metrics"})) as url:
        for job in ("old", "new"):
            wait_for(url, f'count_over_time(up{{job="{job}"}}[1m]) >= 2', timeout=60)
        yield url


@pytest.fixture(scope="module")
def native(exporter, tmp_path_factory):
    with prometheus_server.serving(tmp_path_factory.mktemp("native"),
                                   config(exporter, {"native": "/metrics"}),
                                   flags=["--enable-feature=native-histograms"]) as url:
        wait_for(url, 'count_over_time(up{job="native"}[1m]) >= 2', timeout=60)
        yield url


def series(url: str, job: str, selector: str = '__name__=~"tracehound_.+"') -> dict:
    families: dict[str, list] = {}
    for s in query(url, f'{{job="{job}",{selector}}}'):
        labels = {k: v for k, v in s.labels.items() if k not in ("job", "instance", "__name__")}
        name = s.labels["__name__"]
        if name.startswith(NEW_FAMILIES + LEFT_OUT + ("tracehound_scrape_",)):
            continue
        # a histogram's samples are one family: its _count says whether the
        # label set was ever timed (comparable)
        family = next((h for h in HISTOGRAMS if name.startswith(h + "_")),
                      name.removesuffix("_total"))
        families.setdefault(family, []).append((name, labels, s.value))
    out = {}
    for family, samples in families.items():
        out.update(comparable(family, samples))
    return out


def by_labels(samples) -> dict:
    """labels -> value, NaN as the string "NaN" so that equal results compare equal."""
    return {tuple(sorted((k, v) for k, v in s.labels.items() if k not in ("job", "instance"))):
            "NaN" if math.isnan(s.value) else s.value for s in samples}


def test_text_scrape_has_every_old_series_with_its_value(classic):
    old, new = series(classic, "old"), series(classic, "new")
    assert len(old) > 500
    assert new == old


@pytest.mark.parametrize("name", HISTOGRAMS)
def test_text_quantiles_equal_the_old_ones(classic, name):
    for q in QUANTILES:
        # a label set of no timed call has no quantile (NaN from the old
        # exposition's zeros, nothing from the new one, which leaves it out)
        got = {job: {k: v for k, v in by_labels(query(
                   classic, f'histogram_quantile({q}, sum by (le, cgroup, mountpoint) '
                            f'({name}_bucket{{job="{job}"}}))')).items() if v != "NaN"}
               for job in ("old", "new")}
        assert got["new"] == got["old"] and got["old"], (name, q)


def test_protobuf_counters_equal_the_text_ones(classic, native):
    selector = '__name__=~"tracehound_(io|rdma|map|series)_.+_total"'
    text = series(classic, "new", selector)
    assert len(text) > 100
    assert series(native, "native", selector) == text


@pytest.mark.parametrize("name", HISTOGRAMS)
def test_latency_arrives_as_native_histograms(classic, native, name):
    assert query(native, f'{name}_bucket{{job="native"}}') == []
    for fn, suffix in (("histogram_count", "_count"), ("histogram_sum", "_sum")):
        got = by_labels(query(native, f'{fn}({name}{{job="native"}})'))
        want = by_labels(query(classic, f'{name}{suffix}{{job="new"}}'))
        want = {tuple((k, v) for k, v in key if k != "__name__"): v for key, v in want.items()}
        assert got.keys() == want.keys() and got, (name, fn)
        for key in want:
            assert got[key] == pytest.approx(want[key], rel=1e-9), (name, fn, key)


@pytest.mark.parametrize("name", HISTOGRAMS)
def test_native_quantiles_are_the_classic_ones_shifted(classic, native, name):
    checked = 0
    for q in QUANTILES:
        nat = by_labels(query(native, f'histogram_quantile({q}, {name}{{job="native"}})'))
        cls = by_labels(query(classic, f'histogram_quantile({q}, sum by (le, cgroup, mountpoint, '
                                       f'fstype) ({name}_bucket{{job="new"}}))'))
        nat = {tuple((k, v) for k, v in key if k in ("cgroup", "mountpoint", "fstype")): v
               for key, v in nat.items()}
        assert nat.keys() == cls.keys() and cls
        for key, classic_q in cls.items():
            if classic_q == "NaN" or not FIRST_CLASSIC_BOUND < classic_q < LAST_CLASSIC_BOUND:
                continue
            assert nat[key] == pytest.approx(classic_q * SHIFT, rel=1e-6), (name, q, key)
            checked += 1
    assert checked >= 3
