"""tracehound.clients.prometheus against a real Prometheus server (no agent, no
root): result types, errors, and waiting through a server that is still starting."""
import shutil
import threading
import time

import pytest

from testbed import prometheus as prometheus_server
from tracehound.clients import prometheus as fleet_prometheus
from tracehound.clients.prometheus import (
    DetectionTimeout,
    PrometheusError,
    query,
    wait_for,
)

CONFIG = {"global": {"evaluation_interval": "1s"}}


@pytest.fixture(scope="module")
def prometheus(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("prometheus")
    try:
        with prometheus_server.serving(tmp, CONFIG) as url:
            yield url
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def test_vector_and_scalar_results(prometheus):
    before = time.time()
    (sample,) = query(prometheus, 'label_replace(vector(3), "node", "n1", "", "")')
    after = time.time()
    assert sample.labels == {"node": "n1"} and sample.value == 3.0 and sample.name == ""
    # evaluated at the server's "now" (Unix seconds, to the millisecond): during the call
    assert before - 0.001 <= sample.timestamp <= after + 0.001
    (scalar,) = query(prometheus, "scalar(vector(0.5))")
    assert scalar.labels == {} and scalar.value == 0.5
    assert query(prometheus, "vector(1) > 2") == []
    (nan,) = query(prometheus, "0 / 0")
    assert nan.value != nan.value


def test_rejected_queries_are_not_retried(prometheus):
    with pytest.raises(PrometheusError) as syntax:
        wait_for(prometheus, "rate(", timeout=30)
    assert not syntax.value.retryable and "bad_data" in str(syntax.value)
    with pytest.raises(PrometheusError, match="instant vector"):
        query(prometheus, "vector(1)[1m:1s]")


def test_wait_for_measures_from_the_given_start(prometheus):
    # a fault injected long before the wait began: its seconds count from then
    started = time.monotonic() - 1000
    called = time.monotonic()
    samples, seconds = wait_for(prometheus, "vector(1)", started=started)
    returned = time.monotonic()
    assert samples[0].value == 1
    assert called - started <= seconds <= returned - started
    seen = []
    samples, _ = wait_for(prometheus, "vector(time())",
                          lambda s: seen.append(s[0].value) or len(seen) >= 3, interval=0.1)
    assert len(seen) == 3
    assert samples[0].value == seen[-1]


def test_timeout_keeps_the_last_result(prometheus):
    with pytest.raises(DetectionTimeout) as late:
        wait_for(prometheus, "vector(7)", lambda s: s[0].value > 7, timeout=1, interval=0.2)
    assert isinstance(late.value, TimeoutError) and not late.value.retryable
    assert str(late.value) == "'vector(7)' not satisfied within 1 s (last result: {} 7)"
    assert [s.value for s in late.value.last] == [7] and late.value.last_error is None


def test_unreachable_server_is_retried_until_it_answers(tmp_path, monkeypatch):
    prometheus_server.require()
    port = prometheus_server.free_port()
    url = f"http://127.0.0.1:{port}"
    with pytest.raises(DetectionTimeout) as down:
        wait_for(url, "vector(1)", timeout=0.5, interval=0.1)
    assert "cannot reach" in str(down.value) and down.value.last_error.retryable
    # the server starts only once a query has failed to connect
    refused = threading.Event()
    answers = []
    real_query = fleet_prometheus.query

    def watched(*args, **kwargs):
        try:
            answers.append(real_query(*args, **kwargs))
        except PrometheusError as exc:
            answers.append(exc)
            refused.set()
            raise
        return answers[-1]

    monkeypatch.setattr(fleet_prometheus, "query", watched)
    procs = []

    def start_when_refused():
        if refused.wait(60):
            procs.append(prometheus_server.launch(tmp_path, CONFIG, port))

    starter = threading.Thread(target=start_when_refused)
    starter.start()
    try:
        samples, _ = wait_for(url, "vector(1)", timeout=60, interval=0.2)
        assert samples[0].value == 1
        assert "cannot reach" in str(answers[0]) and answers[0].retryable
        assert answers[-1] == samples
    finally:
        refused.set()
        starter.join()
        for proc in procs:
            proc.terminate()
            proc.wait(timeout=30)
