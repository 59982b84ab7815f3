"""RDMA anomaly rules, fed with divergent snapshots."""
import json
import logging

from tracehound.probes.rdma_maps import OBJ_F_USER, MirrorObject, RdmaSnapshot
from tracehound.detect import rdma as d


def detector(alive=lambda pid: True, **cfg):
    events = []
    det = d.RdmaDetector(d.RdmaDetectorConfig(**cfg), emit=events.append, alive=alive,
                         cgroup_path=lambda cid: f"/job/{cid}")
    return det, events


def user_obj(tgid, kind="qp", oid=1, dev=0):
    return MirrorObject(dev, kind, oid, tgid, 7, 1, OBJ_F_USER, "trainer")


def snap(objects=(), verbs=None, events=None, qp_events=None):
    return RdmaSnapshot(objects=list(objects), verbs=dict(verbs or {}), events=dict(events or {}),
                        qp_events=dict(qp_events or {}), devices={0: "rxe0"})


def kinds(events):
    return [e["kind"] for e in events]


def test_objects_of_an_exited_owner_are_a_leak_after_the_grace_period_once():
    dead = {300}
    det, events = detector(alive=lambda pid: pid not in dead, grace_s=10)
    objs = [user_obj(300, "qp"), user_obj(300, "mr"), user_obj(300, "mr", 2), user_obj(301, "pd")]
    assert det.check_objects(snap(objs), now=100) == []          # dead, but within grace
    assert det.check_objects(snap(objs), now=109.9) == []
    fired = det.check_objects(snap(objs), now=110)
    assert kinds(fired) == ["leaked_objects"]
    assert fired[0]["pid"] == 300 and fired[0]["objects"] == {"qp": 1, "mr": 2}
    assert fired[0]["cgroup"] == "/job/7" and fired[0]["devices"] == ["rxe0"]
    assert det.check_objects(snap(objs), now=200) == []           # still leaked: no repeat
    assert det.counts()["leaked_objects"] == 1
    # objects gone, then a new process under the reused pid leaks again: a new transition
    det.check_objects(snap([user_obj(301, "pd")]), now=201)
    det.check_objects(snap([user_obj(300, "cq")]), now=202)
    assert kinds(det.check_objects(snap([user_obj(300, "cq")]), now=213)) == ["leaked_objects"]
    assert len(events) == 2


def test_teardown_within_the_grace_period_is_not_a_leak():
    dead = set()
    det, events = detector(alive=lambda pid: pid not in dead, grace_s=2)
    objs = [user_obj(300), user_obj(300, "cq")]
    det.check_objects(snap(objs), now=0)
    dead.add(300)                                                   # killed
    det.check_objects(snap(objs), now=1)
    det.check_objects(snap([]), now=1.5)                            # kernel freed them
    det.check_objects(snap([]), now=10)
    assert events == []


def test_kernel_owned_and_seeded_kernel_objects_never_leak():
    det, events = detector(alive=lambda pid: False, grace_s=0)
    kernel = MirrorObject(0, "qp", 1 | 1 << 24, 0, 0, 0, 2, "ib_core")
    det.check_objects(snap([kernel]), now=0)
    det.check_objects(snap([kernel]), now=100)
    assert events == []


def test_failed_destroys_fire_for_every_new_failure():
    det, _ = detector()
    assert det.check_counters(snap(verbs={("destroy_qp", 0, 7): 5}), now=0) == []
    fired = det.check_counters(snap(verbs={("destroy_qp", 0, 7): 5, ("destroy_qp", 16, 7): 1}), now=1)
    assert kinds(fired) == ["destroy_failed"]
    assert fired[0]["op"] == "destroy_qp" and fired[0]["errno"] == "EBUSY"
    assert fired[0]["cgroup"] == "/job/7"                      # the caller's cgroup
    assert det.check_counters(snap(verbs={("destroy_qp", 16, 7): 1}), now=2) == []
    fired = det.check_counters(snap(verbs={("destroy_qp", 16, 7): 3}), now=3)
    assert fired[0]["failures"] == 2 and fired[0]["total"] == 3
    # destroy failures are not also reported as a burst
    assert det.counts()["error_burst"] == 0


def test_error_burst_fires_once_per_burst_and_rearms_after_a_quiet_window():
    det, _ = detector(burst_window_s=10, burst_threshold=3)
    enomem = ("reg_mr", 12, 7)
    assert det.check_counters(snap(verbs={enomem: 1}), now=0) == []
    assert det.check_counters(snap(verbs={enomem: 2}), now=1) == []
    fired = det.check_counters(snap(verbs={enomem: 3}), now=2)
    assert kinds(fired) == ["error_burst"] and fired[0]["errno"] == "ENOMEM" and fired[0]["errors"] == 3
    assert det.check_counters(snap(verbs={enomem: 6}), now=3) == []      # same burst
    assert det.check_counters(snap(verbs={enomem: 6}), now=14) == []     # quiet window: re-armed
    assert det.check_counters(snap(verbs={enomem: 7}), now=15) == []     # 1 < 3
    assert det.check_counters(snap(verbs={enomem: 8}), now=16) == []
    assert kinds(det.check_counters(snap(verbs={enomem: 9}), now=17)) == ["error_burst"]


def test_slow_trickle_of_errors_is_not_a_burst():
    det, _ = detector(burst_window_s=10, burst_threshold=3)
    for i in range(1, 8):
        assert det.check_counters(snap(verbs={("create_qp", 11, 7): i}), now=i * 6) == []


def test_a_single_error_is_a_burst_at_the_default_threshold():
    det, _ = detector()
    fired = det.check_counters(snap(verbs={("reg_mr", 12, 7): 1}), now=0.25)
    assert kinds(fired) == ["error_burst"] and fired[0]["op"] == "reg_mr"


def test_async_events_port_error_device_fatal_qp_error():
    det, _ = detector()
    det.check_counters(snap(events={(0, 1, "PORT_ACTIVE"): 1}), now=0)
    fired = det.check_counters(snap(events={(0, 1, "PORT_ACTIVE"): 1, (0, 1, "PORT_ERR"): 1,
                                            (0, 0, "DEVICE_FATAL"): 1, (0, 1, "QP_FATAL"): 2,
                                            (0, 1, "GID_CHANGE"): 4}), now=1)
    assert sorted(kinds(fired)) == ["device_fatal", "port_error", "qp_error"]
    port = next(e for e in fired if e["kind"] == "port_error")
    assert port["device"] == "rxe0" and port["port"] == 1
    assert det.check_counters(snap(events={(0, 1, "PORT_ERR"): 1}), now=2) == []
    assert kinds(det.check_counters(snap(events={(0, 1, "PORT_ERR"): 2}), now=3)) == ["port_error"]


def test_mirror_mismatch_needs_to_persist_beyond_the_grace_period():
    det, _ = detector(grace_s=3)
    agree = {(0, "qp"): 2, (0, "mr"): 1}
    assert det.check_kernel_view(agree, agree, agree, now=0) == []
    missed_del = {(0, "qp"): 3, (0, "mr"): 1}
    assert det.check_kernel_view(missed_del, agree, missed_del, now=5) == []
    fired = det.check_kernel_view(missed_del, agree, missed_del, now=8, device_name={0: "rxe0"}.get)
    assert kinds(fired) == ["mirror_mismatch"]
    assert fired[0] == {**fired[0], "device": "rxe0", "type": "qp", "mirror": 3, "kernel": 2}
    assert det.check_kernel_view(missed_del, agree, missed_del, now=20) == []   # once
    assert det.check_kernel_view(agree, agree, agree, now=21) == []             # healed
    # a type only the kernel knows (the mirror missed an add) is a divergence too
    det.check_kernel_view(agree, {**agree, (0, "srq"): 1}, agree, now=30)
    assert kinds(det.check_kernel_view(agree, {**agree, (0, "srq"): 1}, agree, now=33)) == \
        ["mirror_mismatch"]


def test_kernel_count_between_two_mirror_readings_is_not_a_divergence():
    det, _ = detector(grace_s=0)
    # an object was created while the kernel was being asked
    assert det.check_kernel_view({(0, "qp"): 2}, {(0, "qp"): 3}, {(0, "qp"): 3}, now=0) == []
    assert det.check_kernel_view({(0, "qp"): 3}, {(0, "qp"): 2}, {(0, "qp"): 2}, now=1) == []


def test_anomaly_metric_exports_every_kind_from_zero():
    det, _ = detector()
    samples = {s.labels["kind"]: s.value for s in det.metric().samples}
    assert samples == dict.fromkeys(d.KINDS, 0)


def test_events_are_json_lines_on_the_events_logger(caplog):
    det = d.RdmaDetector(alive=lambda pid: False)
    with caplog.at_level(logging.WARNING, logger="tracehound.events"):
        det.check_counters(snap(verbs={("reg_mr", 12, 7): 1}), now=0)
    event = json.loads(caplog.records[0].getMessage())
    assert event["event"] == "rdma_anomaly" and event["kind"] == "error_burst"
    assert event["op"] == "reg_mr" and event["errno"] == "ENOMEM" and "time" in event
    assert event["cgroup"] == "7"        # the default cgroup_path: the id as text


class FakeProbe:
    def __init__(self, snaps):
        self.snaps = snaps
        self.taken = []

    def snapshot(self, objects=True):
        self.taken.append(objects)
        return self.snaps.pop(0) if len(self.snaps) > 1 else self.snaps[0]

    def modes(self):
        return {"rdma.restrack": "fentry"}


def test_watcher_reads_objects_and_the_kernel_less_often_than_counters():
    probe = FakeProbe([snap([user_obj(1)])])
    asked = []
    det, _ = detector()
    w = d.RdmaWatcher(probe, det, kernel_view=lambda: asked.append(1) or {(0, "qp"): 1},
                      interval=0.25, object_interval=1.0, kernel_interval=5.0)
    for i in range(9):
        w.run_once(now=i * 0.25)
    # objects at t=0, 1 and 2, plus the re-read around the one kernel check (t=0)
    assert probe.taken.count(True) == 4 and probe.taken.count(False) == 6 and len(asked) == 1


def test_watcher_drops_the_kernel_check_when_the_tool_is_missing(caplog):
    def broken():
        raise RuntimeError("the rdma tool (iproute2) is not installed")
    probe = FakeProbe([snap()])
    det, _ = detector()
    w = d.RdmaWatcher(probe, det, kernel_view=broken)
    w.run_once(0)
    w.run_once(10)
    assert "mirror check off" in caplog.text and caplog.text.count("mirror check off") == 1


def test_a_qp_event_names_the_qps_owner():
    det, _ = detector()
    det.check_counters(snap(), now=0)
    fired = det.check_counters(snap(qp_events={(0, 1, "QP_FATAL", 4242, 7): 1}), now=1)
    assert kinds(fired) == ["qp_error"]
    assert (fired[0]["pid"], fired[0]["cgroup"], fired[0]["async_event"]) == (4242, "/job/7",
                                                                               "QP_FATAL")
