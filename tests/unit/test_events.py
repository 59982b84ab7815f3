"""The agent's /events page and the chaos detection probe that reads it,
over real HTTP from a real Exporter: events logged on tracehound.events by
a detector come back by sequence number, and a probe matching their fields
detects a fault with the event that showed it."""
import json
import logging
import time
import urllib.error
import urllib.request

import pytest
from prometheus_client import CollectorRegistry

from tracehound.chaos import detection as detect
from tracehound.chaos.metrics import EventCounter, events_url
from tracehound.exporter.events import EVENTS_LOGGER, EventLog
from tracehound.exporter.server import Exporter

events_log = logging.getLogger(EVENTS_LOGGER)


def emit(**event):
    events_log.warning(json.dumps(event, sort_keys=True))


@pytest.fixture
def agent_http():
    """An exporter serving /metrics and /events, as the agent wires it."""
    log = EventLog(capacity=8)
    exporter = Exporter(CollectorRegistry(), "127.0.0.1:0", {"/events": log.wsgi}).start()
    exporter.set_ready(True)        # as the agent does once its probes are loaded
    log.attach()
    yield exporter, log
    log.detach()
    exporter.stop()


def get(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=5) as r:
        return json.loads(r.read())


def test_events_come_back_in_order_and_only_the_new_ones(agent_http):
    exporter, _ = agent_http
    url = events_url(exporter.url)
    assert url.endswith("/events") and get(url) == {"events": [], "next": 0, "dropped": False}
    emit(event="rdma_anomaly", kind="error_burst", op="reg_mr", errno="ENOMEM")
    emit(event="gpu_anomaly", kind="xid", gpu="0", xid=79)
    page = get(url)
    assert [e["kind"] for e in page["events"]] == ["error_burst", "xid"]
    assert [e["seq"] for e in page["events"]] == [1, 2] and page["next"] == 2
    emit(event="rdma_anomaly", kind="port_error", device="rxe0")
    newer = get(f"{url}?since={page['next']}")
    assert [e["kind"] for e in newer["events"]] == ["port_error"] and newer["next"] == 3


def test_metrics_are_still_served_beside_events(agent_http):
    exporter, _ = agent_http
    with urllib.request.urlopen(exporter.url, timeout=5) as r:
        assert r.status == 200 and r.headers["Content-Type"].startswith("text/plain")


def test_a_reader_that_fell_behind_the_ring_is_told(agent_http):
    exporter, _ = agent_http
    for i in range(12):                      # the ring holds 8
        emit(event="rdma_anomaly", kind="error_burst", n=i)
    page = get(f"{events_url(exporter.url)}?since=0")
    assert page["dropped"] is True and [e["n"] for e in page["events"]] == list(range(4, 12))
    assert get(f"{events_url(exporter.url)}?since=4")["dropped"] is False


def test_plain_messages_on_the_logger_are_not_events(agent_http):
    exporter, log = agent_http
    events_log.warning("not json")
    events_log.warning("[1, 2]")
    assert log.since(0)["events"] == []


def test_a_bad_since_is_a_400(agent_http):
    exporter, _ = agent_http
    with pytest.raises(urllib.error.HTTPError) as err:
        urllib.request.urlopen(f"{events_url(exporter.url)}?since=-1", timeout=5)
    assert err.value.code == 400 and b"since must be a sequence number" in err.value.read()


def test_the_counter_matches_every_field_and_reads_incrementally(agent_http):
    exporter, _ = agent_http
    emit(event="rdma_anomaly", kind="error_burst", op="reg_mr")
    counter = EventCounter(exporter.url, {"kind": "error_burst", "op": "reg_mr"})
    assert counter() == 1.0
    emit(event="rdma_anomaly", kind="error_burst", op="create_qp")   # other op
    emit(event="rdma_anomaly", kind="error_burst", op="reg_mr", pid=7)
    assert counter() == 2.0 and counter.last_match["pid"] == 7 and counter.seq == 3


def test_detection_by_event_reports_the_event_and_the_mttd(agent_http):
    exporter, log = agent_http
    emit(event="rdma_anomaly", kind="error_burst", op="reg_mr", pid=1)     # before the fault
    spec = detect.with_defaults({"source": "events", "url": exporter.url, "timeout": 30,
                                 "interval": 0.1, "match": {"kind": "error_burst",
                                                            "op": "reg_mr"}}, None)
    assert spec["signal"] == "increase"
    # the fault shows once the probe has read the page without it: reads are
    # the baseline's, then the probe's first, then the one that finds it
    reads = []
    emitted = []
    page = log.since

    def since(seq, match=None):
        answer = page(seq, match)
        reads.append(seq)
        if len(reads) == 2:
            emitted.append(time.monotonic())
            emit(event="rdma_anomaly", kind="error_burst", op="reg_mr", pid=42)
        return answer
    log.since = since
    baseline = detect.take_baseline(spec)
    # the fault's time, however long before this probe begins (others may run
    # first): 5 s here
    applied = time.monotonic() - 5.0
    result = detect.run_detection(spec, applied, baseline, fault="rdma.memlock")
    returned = time.monotonic()
    assert result["detected"] is True and result["tracehound_signal"] is True
    assert len(reads) == 3 and result["event"]["pid"] == 42 and result["value"] == 1.0
    # from the fault's application (not the probe's start) to the reading that
    # showed it, rounded to the millisecond
    assert emitted[0] - applied - 0.001 <= result["mttd_seconds"] <= returned - applied + 0.001
    assert result["query"] == 'events{kind="error_burst",op="reg_mr"}'


def test_detection_by_event_times_out_when_none_matches(agent_http):
    exporter, _ = agent_http
    spec = detect.with_defaults({"source": "events", "url": exporter.url, "timeout": 0.6,
                                 "interval": 0.1, "match": {"kind": "leaked_objects"}}, None)
    emit(event="rdma_anomaly", kind="error_burst")
    result = detect.run_detection(spec, time.monotonic(), detect.take_baseline(spec))
    assert result["detected"] is False and result["mttd_seconds"] is None


@pytest.mark.parametrize("spec,fragment", [
    ({"source": "events"}, "needs match"),
    ({"source": "events", "match": {}}, "needs match"),
    ({"source": "events", "match": {"kind": ["a"]}}, "needs match"),
    ({"source": "events", "match": {"kind": "x"}, "signal": "rate"}, "counts matching events"),
])
def test_bad_event_probes_are_explained(spec, fragment):
    problems = detect.check_spec(spec)
    assert any(fragment in msg for _, msg in problems), problems


def test_the_report_names_the_event_that_showed_the_fault():
    from tracehound.chaos import report
    event = {"time": "2026-11-22T10:00:01.250+00:00", "event": "rdma_anomaly",
             "kind": "error_burst", "op": "reg_mr", "errno": "ENOMEM", "seq": 9}
    record = {"title": "t", "status": "completed", "run_id": "r", "start": "s",
              "duration": 1, "source": "f", "journal": "j", "steady_states": {},
              "faults": [], "runs": [], "rollbacks": [],
              "detections": [{"probe": "p", "fault": "rdma.memlock", "source": "events",
                              "query": 'events{kind="error_burst"}', "signal": "increase",
                              "predicate": "> 0", "detected": True, "tracehound_signal": True,
                              "mttd_seconds": 1.25, "value": 1.0, "note": "",
                              "event": event}]}
    text = report.markdown(record, None, "")
    row = next(line for line in text.splitlines() if line.startswith("| p |"))
    assert "**yes** | yes | 1.25 s" in row
    assert "event: time=2026-11-22T10:00:01.250+00:00" in row and "errno=ENOMEM" in row
    assert "seq=" not in row


def test_events_of_one_job_pod_or_kind_only(agent_http):
    exporter, _ = agent_http
    url = events_url(exporter.url)
    emit(event="job_anomaly", kind="job_stalled", job_id="1234", workload="slurm")
    emit(event="job_anomaly", kind="job_stalled", job_id="99", workload="slurm")
    emit(event="exit_anomaly", kind="oom_kill", job_id="1234")
    emit(event="job_anomaly", kind="job_stalled", pod="trainer-0", namespace="ml")
    assert [e["seq"] for e in get(f"{url}?job_id=1234")["events"]] == [1, 3]
    page = get(f"{url}?job_id=1234&kind=job_stalled&since=0")
    assert [e["seq"] for e in page["events"]] == [1] and page["next"] == 4
    assert get(f"{url}?job_id=1234&since=3")["events"] == []
    assert [e["seq"] for e in get(f"{url}?namespace=ml&pod=trainer-0")["events"]] == [4]


@pytest.mark.parametrize("query, why", [
    ("user=root", "unknown parameter 'user'"),
    ("job_id=1&job_id=2", "job_id: one printable value"),
    ("job_id=%0a1", "job_id: one printable value"),
    ("pod=" + "x" * 600, "pod: one printable value of at most 512"),
])
def test_a_bad_filter_is_a_400_that_says_why(agent_http, query, why):
    exporter, _ = agent_http
    with pytest.raises(urllib.error.HTTPError) as err:
        urllib.request.urlopen(f"{events_url(exporter.url)}?{query}", timeout=5)
    assert err.value.code == 400 and why.encode() in err.value.read()


def test_another_nodes_events_are_dropped_and_a_gpus_kept_under_a_cgroup_scope():
    log = EventLog(capacity=8, in_scope=lambda path: path == "/n1" or path.startswith("/n1/"))
    log.attach()
    try:
        emit(event="stall", kind="job_stalled", cgroup="/n2/job_5")
        emit(event="stall", kind="job_stalled", cgroup="/n1/job_5")
        emit(event="gpu", kind="xid", xid=79)
    finally:
        log.detach()
    emit(event="stall", kind="job_stalled", cgroup="/n2/job_6")      # detached: not kept
    assert [(e["kind"], e.get("cgroup")) for e in log.since(0)["events"]] == \
        [("job_stalled", "/n1/job_5"), ("xid", None)]
    assert events_log.filters == []
