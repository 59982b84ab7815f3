"""Kubernetes pod sources: kubelet's /pods over HTTP and the node's log directories."""
import json
import os
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from tests.unit.fixtures.fakeproc import FakeClock, add_cgroup, add_process
from tracehound.attribution.kubelet import (
    KubeletPodsSource,
    LogDirPodSource,
    PodRecord,
    first_of,
    parse_pod_list,
    pod_source,
)
from tracehound.attribution.resolver import WorkloadResolver
from tracehound.attribution.workload import Workload

FIXTURE = os.path.join(os.path.dirname(__file__), "fixtures", "kubelet_pods.json")
TRAINER_UID = "6f1c9a52-2d8e-4b7a-9c3e-0a1b2c3d4e5f"
INGEST_UID = "b3a7c1d2-8e9f-4a5b-9c6d-7e8f9a0b1c2d"
PYTORCH = "9f8e7d6c5b4a39281706f5e4d3c2b1a09f8e7d6c5b4a39281706f5e4d3c2b1a0"
SHIPPER = "1234567890abcdef1234567890abcdef1234567890abcdef1234567890abcdef"
FETCH = "0d6e1f2a3b4c5d6e7f8091a2b3c4d5e6f708192a3b4c5d6e7f8091a2b3c4d5e6"
INGEST = "aabbccddeeff00112233445566778899aabbccddeeff00112233445566778899"
SANDBOX = "5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a"


def trainer_path(cid):
    uid = TRAINER_UID.replace("-", "_")
    return (f"/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{uid}.slice/"
            f"cri-containerd-{cid}.scope")


def ingest_path(cid):
    return f"/kubepods/pod{INGEST_UID}/crio-{cid}"


@pytest.fixture
def kubelet():
    """A local HTTP server answering /pods with the PodList fixture."""
    with open(FIXTURE, "rb") as f:
        body = f.read()
    seen = []

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):
            seen.append((self.path, self.headers.get("Authorization")))
            if self.path != "/pods":
                self.send_error(404)
                return
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", seen
    finally:
        server.shutdown()
        server.server_close()


def test_parse_pod_list_fixture():
    with open(FIXTURE) as f:
        pods = parse_pod_list(json.load(f))
    assert set(pods) == {TRAINER_UID, INGEST_UID, "c0ffee00-0000-4000-8000-000000000001"}
    trainer = pods[TRAINER_UID]
    assert (trainer.namespace, trainer.name, trainer.complete) == ("ml-team", "trainer-0", True)
    assert trainer.containers == {PYTORCH: "pytorch", SHIPPER: "log-shipper", FETCH: "fetch-dataset"}
    assert pods[INGEST_UID].containers == {INGEST: "ingest"}        # cri-o:// scheme stripped
    assert pods["c0ffee00-0000-4000-8000-000000000001"].containers == {}


def test_kubelet_source_names_pods_and_containers(kubelet):
    url, seen = kubelet
    r = WorkloadResolver(pod_source=KubeletPodsSource(url + "/pods"), job_id_source=None)
    assert r.resolve(trainer_path(PYTORCH)) == Workload(
        kind="kubernetes", namespace="ml-team", pod="trainer-0", container="pytorch")
    assert r.resolve(trainer_path(FETCH)).container == "fetch-dataset"         # init container
    assert r.resolve(ingest_path(INGEST)) == Workload(
        kind="kubernetes", namespace="data", pod="ingest-7d9f8c-x2k4q", container="ingest")
    # pod level and CRI-O's monitor: the pod, no container
    assert r.resolve(trainer_path(PYTORCH).rsplit("/", 1)[0]) == Workload(
        kind="kubernetes", namespace="ml-team", pod="trainer-0")
    assert r.resolve(f"/kubepods/pod{INGEST_UID}/crio-conmon-{INGEST}").container == ""
    assert all(path == "/pods" for path, _auth in seen)


def test_kubelet_source_reports_the_sandbox(kubelet):
    url, seen = kubelet
    source = KubeletPodsSource(url + "/pods", min_interval=0)
    r = WorkloadResolver(pod_source=source, job_id_source=None)
    assert r.resolve(trainer_path(PYTORCH)).container == "pytorch"
    assert len(seen) == 1
    assert r.resolve(trainer_path(SANDBOX)) == Workload(
        kind="kubernetes", namespace="ml-team", pod="trainer-0", container="POD")
    # the unknown id made the source re-read before calling it the sandbox
    assert len(seen) == 2


def test_container_newer_than_the_last_read_is_not_called_the_sandbox(kubelet):
    url, seen = kubelet
    clock = FakeClock()
    source = KubeletPodsSource(url + "/pods", min_interval=10, clock=clock)
    r = WorkloadResolver(pod_source=source, job_id_source=None, recheck_seconds=30, clock=clock)
    assert r.resolve(trainer_path(PYTORCH)).container == "pytorch"
    assert r.resolve(trainer_path(SANDBOX)).container == SANDBOX[:12]     # no re-read allowed yet
    assert len(seen) == 1
    clock.advance(30)
    assert r.resolve(trainer_path(SANDBOX)).container == "POD"            # re-read, still unknown
    assert len(seen) == 2


def test_kubelet_source_refresh_is_rate_limited(kubelet):
    url, seen = kubelet
    clock = FakeClock()
    source = KubeletPodsSource(url + "/pods", min_interval=10, clock=clock)
    assert source("not-a-pod", "") is None
    assert source("also-not-a-pod", "") is None
    assert len(seen) == 1
    clock.advance(10)
    assert source(TRAINER_UID, PYTORCH).name == "trainer-0"      # known from the last read
    assert len(seen) == 1
    assert source("not-a-pod", "") is None
    assert len(seen) == 2


def test_kubelet_source_sends_the_token(kubelet, tmp_path):
    url, seen = kubelet
    token = tmp_path / "token"
    token.write_text("s3cr3t\n")
    assert KubeletPodsSource(url + "/pods", token_file=str(token))(TRAINER_UID, "").name == "trainer-0"
    assert seen[-1] == ("/pods", "Bearer s3cr3t")


def test_unreachable_kubelet_falls_back_to_the_uid(kubelet):
    url, _seen = kubelet
    for bad in (url + "/not-pods", "http://127.0.0.1:9/pods"):
        r = WorkloadResolver(pod_source=KubeletPodsSource(bad, timeout=1), job_id_source=None)
        assert r.resolve(trainer_path(PYTORCH)) == Workload(
            kind="kubernetes", pod=TRAINER_UID, container=PYTORCH[:12])


def make_log_dirs(root):
    """kubelet's /var/log/pods and /var/log/containers for two pods."""
    pods, containers = root / "pods", root / "containers"
    containers.mkdir(parents=True)
    layout = [("ml-team", "trainer-0", TRAINER_UID, "pytorch", PYTORCH),
              ("ml-team", "trainer-0", TRAINER_UID, "log-shipper", SHIPPER),
              ("data", "ingest-7d9f8c-x2k4q", INGEST_UID, "ingest", INGEST)]
    for ns, pod, uid, name, cid in layout:
        log_dir = pods / f"{ns}_{pod}_{uid}" / name
        log_dir.mkdir(parents=True, exist_ok=True)
        (log_dir / "0.log").write_text("")
        os.symlink(str(log_dir / "0.log"), str(containers / f"{pod}_{ns}_{name}-{cid}.log"))
    (pods / "kube-system_static-etcd_8b1a9953c4611296a827abf8c47804d7").mkdir()
    (pods / "not-a-pod-dir").mkdir()
    return str(pods), str(containers)


def test_log_dir_source(tmp_path):
    pods, containers = make_log_dirs(tmp_path)
    source = LogDirPodSource(pods, containers)
    trainer = source(TRAINER_UID, PYTORCH)
    assert (trainer.namespace, trainer.name, trainer.complete) == ("ml-team", "trainer-0", False)
    assert trainer.containers == {PYTORCH: "pytorch", SHIPPER: "log-shipper"}
    static = source("8b1a9953c4611296a827abf8c47804d7", "")
    assert (static.namespace, static.name, static.containers) == ("kube-system", "static-etcd", {})
    assert source("0000", "") is None

    r = WorkloadResolver(pod_source=source, job_id_source=None)
    assert r.resolve(ingest_path(INGEST)) == Workload(
        kind="kubernetes", namespace="data", pod="ingest-7d9f8c-x2k4q", container="ingest")
    # an id the log directories do not know: named pod, short id, asked again later
    assert r.resolve(trainer_path(SANDBOX)) == Workload(
        kind="kubernetes", namespace="ml-team", pod="trainer-0", container=SANDBOX[:12])


def test_log_dir_source_without_symlinks_matches_by_pod_name(tmp_path):
    pods, containers = make_log_dirs(tmp_path)
    for entry in os.listdir(containers):            # copied logs instead of links
        path = os.path.join(containers, entry)
        os.unlink(path)
        open(path, "w").close()
    assert LogDirPodSource(pods, containers)(INGEST_UID, INGEST).container_name(INGEST) == "ingest"


def test_log_dir_source_notices_new_pods(tmp_path):
    pods, containers = make_log_dirs(tmp_path)
    clock = FakeClock()
    source = LogDirPodSource(pods, containers, min_interval=5, clock=clock)
    assert source("11111111-2222-3333-4444-555555555555", "") is None
    os.mkdir(os.path.join(pods, "new_web-0_11111111-2222-3333-4444-555555555555"))
    assert source("11111111-2222-3333-4444-555555555555", "") is None       # within min_interval
    clock.advance(5)
    assert source("11111111-2222-3333-4444-555555555555", "").name == "web-0"


def test_sources_are_combined_and_complete_records_win(tmp_path, kubelet):
    url, _seen = kubelet
    pods, containers = make_log_dirs(tmp_path)
    combined = first_of(LogDirPodSource(pods, containers), KubeletPodsSource(url + "/pods", min_interval=0))
    assert combined(TRAINER_UID, FETCH).container_name(FETCH) == "fetch-dataset"  # only the kubelet knows it
    assert combined(TRAINER_UID, PYTORCH).complete is False                       # the log dirs answered
    assert combined(TRAINER_UID, SANDBOX).complete is True
    assert callable(pod_source(kubelet_url=url + "/pods"))


def test_pause_process_marks_the_sandbox_when_the_source_cannot(tmp_path):
    pods, containers = make_log_dirs(tmp_path)
    cg, proc = tmp_path / "cgroup", tmp_path / "proc"
    add_cgroup(cg, trainer_path(SANDBOX), [700])
    add_process(proc, 700, uid=65535, comm="pause")
    other = "7" * 64
    add_cgroup(cg, trainer_path(other), [701, 702])
    add_process(proc, 701, comm="pause")
    add_process(proc, 702, comm="python3")
    r = WorkloadResolver(str(cg), proc_root=str(proc), pod_source=LogDirPodSource(pods, containers),
                         job_id_source=None)
    assert r.resolve(trainer_path(SANDBOX)).container == "POD"
    assert r.resolve(trainer_path(other)).container == other[:12]


def test_pod_record_matches_a_truncated_id():
    record = PodRecord("u", "ns", "p", {PYTORCH[:40]: "pytorch"})
    assert record.container_name(PYTORCH) == "pytorch"
    assert record.container_name("9f8e") is None
