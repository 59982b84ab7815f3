"""The exit rules, fed with snapshots of a stub probe."""
import json
import logging
import signal

from prometheus_client import CollectorRegistry, generate_latest

from tracehound.detect import exits as d
from tracehound.detect.schedule import DetectorSchedule
from tracehound.probes.exits import ExitKey, ExitsSnapshot, LastExit

SEGV, KILL, TERM, BUS, QUIT = (int(s) for s in (signal.SIGSEGV, signal.SIGKILL, signal.SIGTERM,
                                                signal.SIGBUS, signal.SIGQUIT))


class StubProbe:
    def __init__(self):
        self.snap = ExitsSnapshot()

    def snapshot(self):
        return self.snap

    def set(self, counts, last=None):
        self.snap = ExitsSnapshot(dict(counts), dict(last or {}), {})


def detector(baseline=False):
    events = []
    probe = StubProbe()
    det = d.ExitsDetector(probe, emit=events.append, cgroup_path=lambda cid: f"/job/{cid}",
                          workload=lambda path: {"job_id": path.rsplit("/", 1)[1]},
                          baseline=baseline)
    return det, probe, events


def kinds(events):
    return [e["kind"] for e in events]


def test_oom_kill_and_crash_name_cgroup_workload_count_and_the_last_process():
    det, probe, events = detector()
    oom, segv = ExitKey(7, "oom", KILL), ExitKey(8, "signal", SEGV)
    probe.set({oom: 1, segv: 2}, {oom: LastExit(300, "trainer", 0, 1),
                                  segv: LastExit(301, "loader", 0, 1)})
    det.run_once(100.0)
    assert sorted(kinds(events)) == ["oom_kill", "process_crash"]
    by_kind = {e["kind"]: e for e in events}
    o, c = by_kind["oom_kill"], by_kind["process_crash"]
    assert (o["cgroup"], o["job_id"], o["count"], o["pid"], o["comm"], o["signal"]) == \
        ("/job/7", "7", 1, 300, "trainer", "KILL")
    assert (c["cgroup"], c["count"], c["total"], c["pid"], c["comm"], c["signal"]) == \
        ("/job/8", 2, 2, 301, "loader", "SEGV")
    assert c["event"] == "exits_anomaly" and c["core_dumped"] is False
    assert "time" in c and "exit_time" in c
    assert det.counts() == {"oom_kill": 1, "process_crash": 1}


def test_only_growth_fires_and_with_what_grew():
    det, probe, events = detector()
    bus = ExitKey(7, "signal", BUS)
    probe.set({bus: 1})
    det.run_once(1.0)
    det.run_once(2.0)
    assert len(events) == 1 and "pid" not in events[0]     # no last exit recorded
    probe.set({bus: 4})
    det.run_once(3.0)
    assert [(e["count"], e["total"]) for e in events] == [(1, 1), (3, 4)]


def test_deliberate_ends_and_errors_are_counted_not_reported():
    det, probe, events = detector()
    probe.set({ExitKey(7, "signal", KILL): 3, ExitKey(7, "signal", TERM): 1,
               ExitKey(7, "signal", int(signal.SIGPIPE)): 1, ExitKey(7, "error", 0): 9,
               ExitKey(7, "clean", 0): 40})
    det.run_once(1.0)
    assert events == []


def test_a_core_dump_is_a_crash_whatever_the_signal():
    det, probe, events = detector()
    probe.set({ExitKey(7, "signal", QUIT, core=True): 1, ExitKey(7, "signal", QUIT): 1})
    det.run_once(1.0)
    assert kinds(events) == ["process_crash"] and events[0]["core_dumped"] is True
    assert events[0]["signal"] == "QUIT"


def test_with_a_baseline_the_first_read_reports_nothing():
    det, probe, events = detector(baseline=True)
    segv = ExitKey(7, "signal", SEGV)
    probe.set({segv: 5})
    det.run_once(1.0)
    assert events == []
    probe.set({segv: 6, ExitKey(9, "oom", KILL): 1})     # a new key is all new
    det.run_once(2.0)
    assert sorted((e["kind"], e["count"]) for e in events) == [("oom_kill", 1),
                                                               ("process_crash", 1)]


def test_an_older_snapshot_never_fires_twice():
    det, probe, events = detector()
    segv = ExitKey(7, "signal", SEGV)
    old = ExitsSnapshot({segv: 1}, {}, {})
    probe.set({segv: 2})
    det.run_once(1.0)
    det.observe(old, 1.5)            # a scrape's read from before the look
    det.run_once(2.0)
    assert [e["count"] for e in events] == [2]


def test_retired_counters_are_not_taken_for_new_ones():
    det, probe, events = detector()
    segv = ExitKey(7, "signal", SEGV)
    stale = ExitsSnapshot({segv: 1}, {}, {})
    probe.set({segv: 1})
    det.run_once(1.0)
    det.forget({7}, now=1.2)          # the collector retired cgroup 7's counters
    det.observe(stale, 1.5)          # a look that read the map before the retire
    assert len(events) == 1
    # long after, the tombstone is gone (cgroup ids are not reused)
    det.observe(ExitsSnapshot(), 100.0)
    assert det._retired == {}


def test_events_go_to_the_events_logger_as_json(caplog):
    probe = StubProbe()
    det = d.ExitsDetector(probe)
    probe.set({ExitKey(1, "oom", KILL): 1})
    with caplog.at_level(logging.WARNING, logger="tracehound.events"):
        det.run_once(1.0)
    assert json.loads(caplog.records[-1].getMessage())["kind"] == "oom_kill"


def test_runs_on_the_schedule_and_exports_its_counter_from_zero():
    det, probe, events = detector()
    reg = CollectorRegistry(auto_describe=False)
    reg.register(det)
    text = generate_latest(reg).decode()
    assert 'tracehound_exits_anomalies_total{kind="oom_kill"} 0.0' in text
    assert 'tracehound_exits_anomalies_total{kind="process_crash"} 0.0' in text
    probe.set({ExitKey(7, "signal", SEGV): 1})
    schedule = DetectorSchedule([det])
    schedule.run_due(0.0)
    assert det.interval == 1.0 and kinds(events) == ["process_crash"]
    assert schedule.failures == {det.name: 0}


def test_kind_of():
    assert d.kind_of(ExitKey(1, "oom", 0)) == "oom_kill"      # marked, then exited itself
    assert d.kind_of(ExitKey(1, "signal", int(signal.SIGSYS))) == "process_crash"
    assert d.kind_of(ExitKey(1, "signal", int(signal.SIGHUP))) is None
    assert d.kind_of(ExitKey(1, "error", 0)) is None
