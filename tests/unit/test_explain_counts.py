"""How much a counter grew over a job's span (explain's `grew`), asked of a
real Prometheus (Debian's) scraping an exporter the test serves, across a
failed scrape: Prometheus marks every series of a target stale when one
scrape fails, and a span that starts just after it must not count a
counter's old value (an XID logged before the job) as the job's."""
import json
import threading
import urllib.parse
import urllib.request

import pytest

from testbed import prometheus as prometheus_server
from tracehound.clients import prometheus as promql
from tracehound.explain.rules import fill, grew

from tests.unit.test_top_sources import serve


class Counters:
    """An exporter of counter c_total{k=...}, or a failing one."""

    def __init__(self):
        self.lock = threading.Lock()
        self.values: dict[str, float] | None = {}

    def set(self, values: dict[str, float] | None) -> None:
        with self.lock:
            self.values = values

    def __call__(self, path, params):
        with self.lock:
            values = self.values
        if values is None:
            return 503, "text/plain", b"down"
        body = "# TYPE c_total counter\n" + "".join(
            f'c_total{{k="{k}"}} {v}\n' for k, v in values.items())
        return 200, "text/plain; version=0.0.4", body.encode()


def raw_samples(url: str, promql_range: str, at: float) -> list[tuple[float, float]]:
    """The samples a range selector holds, through the HTTP API (the client
    answers instant vectors only)."""
    form = urllib.parse.urlencode({"query": promql_range, "time": f"{at:.3f}"}).encode()
    with urllib.request.urlopen(url + "/api/v1/query", form, timeout=10) as r:
        result = json.load(r)["data"]["result"]
    return [(float(t), float(v)) for t, v in (result[0]["values"] if result else [])]


@pytest.fixture
def scraped(tmp_path):
    counters = Counters()
    with serve(counters) as exporter:
        config = {"global": {"scrape_interval": "200ms", "scrape_timeout": "200ms"},
                  "scrape_configs": [{"job_name": "counts", "static_configs": [
                      {"targets": [exporter.removeprefix("http://")]}]}]}
        with prometheus_server.serving(tmp_path, config) as url:
            yield counters, url


def grown(url: str, start: float, end: float) -> dict[str, float]:
    expr = fill(grew("c_total", ""), window=f"{round((end - start) * 1000)}ms",
                at=f" @ {end:.3f}")
    return {s.labels["k"]: s.value for s in promql.query(url, expr)}


def test_a_failed_scrape_before_the_span_does_not_count_a_counters_old_value(scraped):
    counters, url = scraped
    counters.set({"held": 1, "grows": 1})
    promql.wait_for(url, 'c_total{k="grows"} == 1', timeout=60)
    counters.set(None)                                  # one scrape (or more) fails
    promql.wait_for(url, 'up{job="counts"} == 0', timeout=60)
    counters.set({"held": 1, "grows": 3, "born": 1})    # then: one grew, one is new
    promql.wait_for(url, 'c_total{k="born"} == 1', timeout=60)
    end = promql.query(url, "time()")[0].value
    # the span starts just after the last failed scrape: every series is stale there
    up = raw_samples(url, 'up{job="counts"}[5m]', end)
    failed = max(t for t, v in up if v == 0)
    start = failed + 0.001
    instant = promql.query(url, 'c_total{k="held"}', at=start)
    assert instant == [], instant               # the staleness the span starts in
    assert grown(url, start, end) == {"held": 0, "grows": 2, "born": 1}
