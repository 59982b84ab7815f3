"""tracehound.fleet.prometheus against a real Prometheus server (no agent, no
root): result types, errors, and waiting through a server that is still starting."""
import shutil
import threading
import time

import pytest

from tests import prometheus_server
from tracehound.fleet.prometheus import (
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
    (sample,) = query(prometheus, 'label_replace(vector(3), "node", "n1", "", "")')
    assert sample.labels == {"node": "n1"} and sample.value == 3.0 and sample.name == ""
    assert abs(sample.timestamp - time.time()) < 60
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
    started = time.monotonic() - 2.0
    samples, seconds = wait_for(prometheus, "vector(1)", started=started)
    assert samples[0].value == 1 and 2.0 <= seconds < 10
    seen = []
    samples, _ = wait_for(prometheus, "vector(time())",
                          lambda s: seen.append(s[0].value) or len(seen) >= 3, interval=0.1)
    assert len(seen) == 3


def test_timeout_keeps_the_last_result(prometheus):
    t0 = time.monotonic()
    with pytest.raises(DetectionTimeout) as late:
        wait_for(prometheus, "vector(7)", lambda s: s[0].value > 7, timeout=1, interval=0.2)
    assert isinstance(late.value, TimeoutError)
    assert [s.value for s in late.value.last] == [7] and late.value.last_error is None
    assert 1 <= time.monotonic() - t0 < 5 and late.value.seconds >= 1


def test_unreachable_server_is_retried_until_it_answers(tmp_path):
    prometheus_server.require()
    port = prometheus_server.free_port()
    url = f"http://127.0.0.1:{port}"
    with pytest.raises(DetectionTimeout) as down:
        wait_for(url, "vector(1)", timeout=0.5, interval=0.1)
    assert "cannot reach" in str(down.value) and down.value.last_error.retryable
    procs = []
    # start the server only after polling began: the first queries fail to connect
    timer = threading.Timer(1.0, lambda: procs.append(
        prometheus_server.launch(tmp_path, CONFIG, port)))
    timer.start()
    try:
        samples, seconds = wait_for(url, "vector(1)", timeout=60, interval=0.2)
        assert samples[0].value == 1 and seconds >= 1.0
    finally:
        timer.join()
        for proc in procs:
            proc.terminate()
            proc.wait(timeout=30)
