"""The application's view (libibverbs) against the kernel's, per process:
which differences are anomalies, and when."""
import os

from tracehound.detect import rdma as d
from tracehound.detect.rdma_views import compare
from tracehound.probes.rdma_app import Candidate
from tracehound.probes.rdma_maps import (OBJ_F_SEEDED, OBJ_F_USER, AppObject, MirrorObject,
                                         RdmaSnapshot, app_key)

CTX = 0x1000
SINCE = 1_000


def app(kind, handle, ident=0, tgid=300, context=CTX, release_err=0):
    return AppObject(tgid, kind, handle, handle if kind == "ctx" else context, "rxe0", ident,
                     42, SINCE + 10, "trainer", release_err, SINCE + 20 if release_err else 0)


def kern(kind, oid, lkey=0, tgid=300, created=SINCE + 5, flags=OBJ_F_USER):
    return MirrorObject(0, kind, oid, tgid, 42, created, flags, "trainer", lkey)


def healthy():
    """ctx, pd, cq, qp 17, mr lkey 0x10 on both sides."""
    return ([app("ctx", CTX), app("pd", 0x2000, 1), app("cq", 0x3000, 2), app("qp", 0x4000, 17),
             app("mr", 0x5000, 0x10)],
            [kern("ctx", 1), kern("pd", 1), kern("cq", 1), kern("qp", 17), kern("mr", 3, 0x10)])


def snap(apps, kernel, closed=()):
    return RdmaSnapshot(objects=list(kernel), app_objects=list(apps), devices={0: "rxe0"},
                        app_closed=set(closed))


def detector(grace=5, alive=lambda pid: True):
    events = []
    det = d.RdmaDetector(d.RdmaDetectorConfig(grace_s=grace), emit=events.append, alive=alive,
                         cgroup_path=lambda cid: f"/job/{cid}",
                         workload=lambda path: {"workload": "slurm", "job_id": "42"})
    return det, events


def test_views_that_agree_are_no_disagreement():
    cmp = compare(snap(*healthy()), SINCE)
    assert cmp.disagreements == [] and cmp.covered == {300}


def test_a_destroy_the_kernel_refused_is_kernel_only_after_the_grace_period():
    apps, kernel = healthy()
    apps[2] = app("cq", 0x3000, 2, release_err=16)      # ibv_destroy_cq returned EBUSY
    det, events = detector(grace=5)
    assert det.check_views(snap(apps, kernel), now=0, since_ns=SINCE).disagreements
    assert events == []                                   # within the grace period
    det.check_views(snap(apps, kernel), now=5, since_ns=SINCE)
    assert [e["kind"] for e in events] == ["kernel_only_objects"]
    e = events[0]
    assert (e["pid"], e["comm"], e["cgroup"], e["job_id"], e["device"], e["type"]) == \
        (300, "trainer", "/job/42", "42", "rxe0", "cq")
    assert e["released_by_app"] == [{"handle": 2, "destroy_errno": "EBUSY"}]
    assert e["never_seen_by_app"] == 0 and e["disagreeing_for_s"] == 5
    det.check_views(snap(apps, kernel), now=60, since_ns=SINCE)
    assert len(events) == 1                               # once while it lasts
    # the process retried and the kernel let it go: agreement clears the state
    kernel.remove(next(k for k in kernel if k.type == "cq"))
    apps.pop(2)
    det.check_views(snap(apps, kernel), now=61, since_ns=SINCE)
    assert det._views.since == {}


def test_objects_matched_one_by_one_where_both_views_know_them():
    apps, kernel = healthy()
    apps.append(app("qp", 0x6000, 18))                    # the kernel has no QP 18
    kernel.append(kern("qp", 19))                         # and the process never saw QP 19
    kernel.append(kern("mr", 4, lkey=0x20))               # nor this MR
    det, events = detector(grace=0)
    det.check_views(snap(apps, kernel), now=0, since_ns=SINCE)
    by = {(e["kind"], e["type"]): e for e in events}
    assert by[("app_only_objects", "qp")]["qpns"] == [18]
    assert by[("kernel_only_objects", "qp")]["never_seen_by_app"] == [19]
    assert by[("kernel_only_objects", "mr")]["never_seen_by_app"] == [0x20]
    assert len(events) == 3


def test_objects_without_an_identity_are_compared_by_count():
    apps, kernel = healthy()
    kernel.append(kern("pd", 2))
    cmp = compare(snap(apps, kernel), SINCE)
    [one] = cmp.disagreements
    assert (one.type, one.unseen_count, one.app_only_count) == ("pd", 1, 0)


def test_only_what_both_views_could_see_is_compared():
    apps, kernel = healthy()
    kernel.append(kern("qp", 30, created=SINCE - 1))            # before the probe attached
    kernel.append(kern("qp", 31, flags=OBJ_F_USER | OBJ_F_SEEDED, created=0))
    kernel.append(kern("qp", 40, tgid=301))                     # a process never seen opening
    assert compare(snap(apps, kernel), SINCE).disagreements == []
    # objects of a context the probe never saw open: the process is left out
    apps.append(app("pd", 0x7000, 5, context=0xdead))
    cmp = compare(snap(apps, kernel + [kern("pd", 9)]), SINCE)
    assert cmp.disagreements == [] and cmp.uncovered == {300} and cmp.covered == set()


def test_objects_of_a_closed_context_are_stale_not_a_disagreement():
    apps, kernel = healthy()
    apps.append(app("pd", 0x7000, 5, context=0x9000))
    cmp = compare(snap(apps, kernel, closed={(300, 0x9000)}), SINCE)
    assert cmp.disagreements == [] and [o.handle for o in cmp.stale] == [0x7000]
    assert cmp.covered == {300}


def test_a_process_that_exited_is_not_a_disagreement():
    """The kernel frees everything at exit; the process's own records stay
    until the agent drops them, which is no disagreement."""
    apps, _ = healthy()
    dead = {300}
    det, events = detector(grace=0, alive=lambda pid: pid not in dead)
    det.check_views(snap(apps, []), now=0, since_ns=SINCE)
    det.check_views(snap(apps, []), now=10, since_ns=SINCE)
    assert events == []
    dead.clear()                        # the same view for a live process is one
    det.check_views(snap(apps, []), now=11, since_ns=SINCE)
    assert {e["kind"] for e in events} == {"app_only_objects"}


class AppProbe:
    """A started probe with the application view, over fixed snapshots."""

    def __init__(self, snaps):
        self.snaps = snaps
        self.forgotten, self.asked = [], []
        self.unsettled = set()           # what the last attach left for later
        self.app_since_ns = SINCE

    def snapshot(self, objects=True):
        return self.snaps[0]

    def modes(self):
        return {"rdma.restrack": "fentry", "rdma.app": "uprobe"}

    def forget_app_objects(self, keys):
        self.forgotten += keys

    def attach_libraries(self, paths):
        self.asked.append(paths)
        return []

    def app_unsettled(self):
        return self.unsettled


def test_the_watcher_drops_records_of_closed_contexts_and_of_processes_gone_for_the_grace():
    apps, kernel = healthy()
    apps.append(app("pd", 0x7000, 5, context=0x9000))              # its context was closed
    apps.append(app("ctx", 0x8000, tgid=301))                      # a process that exited
    probe = AppProbe([snap(apps, kernel, closed={(300, 0x9000)})])
    det, events = detector(grace=5, alive=lambda pid: pid != 301)
    w = d.RdmaWatcher(probe, det, kernel_view=lambda: probe.snapshot().object_counts(),
                      object_interval=1.0)
    w.run_once(now=0)
    assert probe.forgotten == [app_key(apps[-2])]                  # the closed context's PD
    w.run_once(now=6)
    assert app_key(apps[-1]) in probe.forgotten                    # 301, gone for 6 s > 5
    assert events == []


def test_the_watcher_looks_for_the_library_of_a_process_it_never_saw_open():
    apps, kernel = healthy()
    kernel.append(kern("qp", 40, tgid=os.getpid()))                # created after the attach
    probe = AppProbe([snap(apps, kernel)])
    det, _ = detector()
    w = d.RdmaWatcher(probe, det, kernel_view=lambda: probe.snapshot().object_counts())
    w.run_once(now=0)
    w.run_once(now=2)
    assert len(probe.asked) == 1                                   # once per process


def test_the_watcher_looks_again_at_a_process_whose_library_was_left_for_later(monkeypatch):
    apps, kernel = healthy()
    kernel.append(kern("qp", 40, tgid=os.getpid()))
    probe = AppProbe([snap(apps, kernel)])
    det, _ = detector()
    w = d.RdmaWatcher(probe, det, kernel_view=lambda: probe.snapshot().object_counts())
    own = Candidate(f"/proc/{os.getpid()}/root", b"/opt/lib/libibverbs.so.1", 1, 2)
    monkeypatch.setattr(d, "mapped_by", lambda pid: {own} if pid == os.getpid() else set())
    probe.unsettled = {own}                                        # e.g. its parse over budget
    w.run_once(now=0)
    w.run_once(now=2)
    assert probe.asked == [{own}, {own}]
    probe.unsettled = set()                                        # attached, or refused
    w.run_once(now=4)
    w.run_once(now=6)
    assert probe.asked == [{own}] * 3
