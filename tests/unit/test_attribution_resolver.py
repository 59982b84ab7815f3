"""WorkloadResolver caching: per path, final answers kept, provisional ones re-checked."""
from tests.unit.fixtures.fakeproc import FakeClock
from tracehound.attribution.kubelet import PodRecord
from tracehound.attribution.resolver import WorkloadResolver
from tracehound.attribution.workload import WORKLOAD_LABELS, Workload

UID = "0b0e5a3e-1111-4222-8333-944445555666"
CID = "c" * 64
POD_PATH = f"/kubepods/besteffort/pod{UID}/{CID}"


class CountingPods:
    def __init__(self, answers):
        self.answers = answers
        self.calls = 0

    def __call__(self, uid, container_id):
        self.calls += 1
        return self.answers.pop(0) if self.answers else None


def test_final_answers_are_computed_once():
    pods = CountingPods([PodRecord(UID, "team", "web-0", {CID: "nginx"})])
    r = WorkloadResolver(pod_source=pods, job_id_source=None)
    expected = Workload(kind="kubernetes", namespace="team", pod="web-0", container="nginx")
    assert r.resolve(POD_PATH) == expected
    assert r.resolve(POD_PATH) == expected
    assert pods.calls == 1
    assert r.labels(POD_PATH) == ("kubernetes", "", "", "", "team", "web-0", "nginx", "", "")
    assert len(r.labels(POD_PATH)) == len(WORKLOAD_LABELS)


def test_provisional_answers_are_rechecked_and_then_kept():
    clock = FakeClock()
    pods = CountingPods([None, PodRecord(UID, "team", "web-0", {CID: "nginx"})])
    r = WorkloadResolver(pod_source=pods, job_id_source=None, recheck_seconds=30, clock=clock)
    assert r.resolve(POD_PATH) == Workload(kind="kubernetes", pod=UID, container=CID[:12])
    clock.advance(29)
    assert r.resolve(POD_PATH).pod == UID and pods.calls == 1
    clock.advance(1)
    assert r.resolve(POD_PATH).pod == "web-0" and pods.calls == 2
    clock.advance(3600)
    assert r.resolve(POD_PATH).container == "nginx" and pods.calls == 2


def test_forget_and_retain_drop_entries():
    pods = CountingPods([PodRecord(UID, "team", "web-0", {CID: "nginx"})] * 3)
    r = WorkloadResolver(pod_source=pods, job_id_source=None)
    r.resolve(POD_PATH)
    r.resolve("/system.slice/sshd.service")
    r.forget(POD_PATH)
    r.forget("/never/seen")
    assert r.cached_paths() == ["/system.slice/sshd.service"]
    r.resolve(POD_PATH)
    assert pods.calls == 2
    r.retain([POD_PATH, "/other"])
    assert r.cached_paths() == [POD_PATH]
    r.retain([])
    assert r.cached_paths() == []


def test_broken_pod_source_falls_back_to_the_uid():
    def broken(uid, container_id):
        raise ValueError("bad json")

    r = WorkloadResolver(pod_source=broken, job_id_source=None)
    assert r.resolve(POD_PATH) == Workload(kind="kubernetes", pod=UID, container=CID[:12])


def test_default_resolver_works_from_the_path_alone():
    r = WorkloadResolver()
    assert r.resolve("/system.slice/slurmstepd.scope/job_3/step_batch/user/task_0").job_id == "3"
    assert r.resolve("/system.slice/cron.service").unit == "cron.service"
