"""tracehound top against local HTTP servers: an agent's /metrics and a
Prometheus /api/v1/query answering canned JSON."""
import contextlib
import http.server
import io
import json
import re
import shutil
import subprocess
import threading
import urllib.parse

import pytest

from tracehound import cli
from tracehound.collectors.io import OPS
from tracehound.top.source import ERROR_OPS, MetricsSource, PrometheusSource, SourceError

from tests.unit.test_top_rates import exposition, io_series


@contextlib.contextmanager
def serve(answer):
    """answer(path, query or form params) -> (status, content type, body bytes)."""
    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            url = urllib.parse.urlsplit(self.path)
            self.reply(*answer(url.path, urllib.parse.parse_qs(url.query)))

        def do_POST(self):
            # the Prometheus client sends the query as a form body
            form = self.rfile.read(int(self.headers.get("Content-Length", 0))).decode()
            path = urllib.parse.urlsplit(self.path).path
            self.reply(*answer(path, urllib.parse.parse_qs(form)))

        def reply(self, status, ctype, body):
            self.send_response(status)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def vector(*results):
    return {"status": "success", "data": {"resultType": "vector", "result": [
        {"metric": m, "value": [1700000000.0, str(v)]} for m, v in results]}}


JOB = dict(cgroup="/slurm/job_9", mountpoint="/scratch", fstype="lustre",
           workload="slurm", job_id="9", step="0")
IDLE = dict(cgroup="/thtest/plain", mountpoint="/tmp", fstype="tmpfs")
GPU = dict(instance="node1:9560", gpu="0", uuid="GPU-a", model="H100")


class FakePrometheus:
    def __init__(self, rdma=True):
        self.queries = []
        self.rdma = rdma

    def result(self, q):
        if q.startswith("count by (__name__)"):
            names = ["tracehound_gpu_temperature_celsius", "tracehound_gpu_clock_event_active",
                     "tracehound_gpu_xid_errors_total"]
            names += ["tracehound_rdma_objects", "tracehound_rdma_verb_calls_total"] * self.rdma
            return vector(*(({"__name__": n}, 1) for n in names))
        if q.startswith("histogram_quantile"):
            value = {"0.5": 0.001, "0.99": 0.004}[q.split("(")[1].split(",")[0]]
            if "write_latency" not in q:
                return vector(({**JOB, "cgroup": ""}, 0.003), (IDLE, "NaN"))
            return vector(({**JOB, "cgroup": ""}, value))
        errors = re.search(r"tracehound_io_(\w+)_errors_total", q)
        if errors:
            return vector((JOB, 0.125 if errors.group(1) in ("read", "open") else 0.0), (IDLE, 0))
        rate = "rate(" in q
        table = {
            "tracehound_io_read_bytes_total": (1000.0 if rate else 5e6),
            "tracehound_io_write_bytes_total": (2000.0 if rate else 7e6),
            "tracehound_io_read_requests_total": 10.0,
            "tracehound_io_write_requests_total": 20.0,
        }
        for name, v in table.items():
            if name in q:
                return vector((JOB, v), (IDLE, 0.0))
        if "tracehound_rdma_objects" in q:
            return vector(({"cgroup": "/slurm/job_9", "device": "mlx5_0", "type": "QP"}, 4))
        if "tracehound_rdma_verb_errors_total" in q:
            return vector(({"op": "reg_mr", "errno": "ENOMEM"}, 0.5 if rate else 30))
        if "tracehound_gpu_temperature_celsius" in q:
            return vector(({**GPU, "sensor": "gpu"}, 83))
        if "tracehound_gpu_clock_event_active" in q:
            return vector(({**GPU, "reason": "sw_thermal_slowdown"}, 1))
        if "tracehound_gpu_xid_errors_total" in q:
            return vector(({**GPU, "xid": "48"}, 0.1 if rate else 2))
        return {"status": "error", "errorType": "bad_data", "error": f"unexpected query {q}"}

    def __call__(self, path, params):
        if path != "/api/v1/query":
            return 404, "text/plain", b"not found"
        q = params["query"][0]
        self.queries.append(q)
        doc = self.result(q)
        return (200 if doc["status"] == "success" else 400), "application/json", \
            json.dumps(doc).encode()


def test_prometheus_source_rows_and_panels():
    fake = FakePrometheus()
    with serve(fake) as url:
        snap = PrometheusSource(url, window="30s", selector='cluster="a"').poll()
    assert snap.window == "30s" and snap.interval_seconds is None
    rows = {r.name: r for r in snap.io}
    assert set(rows) == {"9.0", "/thtest/plain"}
    job = rows["9.0"]
    assert (job.kind, job.mountpoint, job.fstype, job.cgroups) == \
        ("slurm", "/scratch", "lustre", ["/slurm/job_9"])
    assert (job.read_bytes_per_second, job.write_bytes_per_second) == (1000, 2000)
    assert (job.read_ops_per_second, job.write_ops_per_second, job.ops_per_second) == (10, 20, 30)
    assert job.errors_per_second == 0.25
    assert (job.read_bytes_total, job.write_bytes_total) == (5e6, 7e6)
    assert (job.latency_p50_seconds, job.latency_p99_seconds) == (0.001, 0.004)
    assert (job.read_latency_p99_seconds, job.write_latency_p99_seconds) == (0.003, 0.004)
    # NaN (no calls in the window) is unknown, not a number
    assert rows["/thtest/plain"].read_latency_p99_seconds is None
    (obj,) = snap.rdma_objects
    assert (obj.device, obj.type, obj.count) == ("mlx5_0", "QP", 4)
    (err,) = snap.rdma_errors
    assert (err.errors_per_second, err.errors_total) == (0.5, 30)
    (gpu,) = snap.gpus
    assert (gpu.node, gpu.gpu, gpu.temperature_celsius) == ("node1:9560", "0", 83)
    assert gpu.throttle_reasons == ["sw_thermal_slowdown"] and gpu.xids == {"48": 2}
    # every query is scoped by the selector and uses the window for rates
    assert all('cluster="a"' in q for q in fake.queries)
    assert all("[30s]" in q for q in fake.queries if "rate(" in q)
    assert any(q.startswith("histogram_quantile(0.99,") for q in fake.queries)


def test_error_counters_queried_are_the_ones_exported():
    assert ERROR_OPS == OPS


def test_prometheus_without_rdma_metrics_says_no_data():
    with serve(FakePrometheus(rdma=False)) as url:
        snap = PrometheusSource(url).poll()
    assert snap.rdma_objects is None and snap.rdma_errors is None and snap.gpus


def test_prometheus_query_error_is_one_clear_error():
    with serve(lambda path, params: (400, "application/json", json.dumps(
            {"status": "error", "errorType": "bad_data", "error": "parse error"}).encode())) as url:
        with pytest.raises(SourceError, match="parse error"):
            PrometheusSource(url).poll()
    with pytest.raises(SourceError, match="not a PromQL duration"):
        PrometheusSource("http://127.0.0.1:1", window="1 minute")


@pytest.mark.skipif(shutil.which("promtool") is None,
                    reason="promtool (Debian: prometheus) not installed")
def test_queries_are_valid_promql(tmp_path):
    fake = FakePrometheus()
    with serve(fake) as url:
        PrometheusSource(url, selector='instance="n1:9560"').poll()
    rules = {"groups": [{"name": "top", "rules": [
        {"record": f"top:q{i}", "expr": q} for i, q in enumerate(fake.queries)]}]}
    path = tmp_path / "rules.json"
    path.write_text(json.dumps(rules))       # JSON is YAML
    res = subprocess.run(["promtool", "check", "rules", str(path)], capture_output=True, text=True)
    assert res.returncode == 0, res.stdout + res.stderr


class FakeAgent:
    """Serves successive /metrics bodies: 4 KiB more writes on each scrape."""

    def __init__(self):
        self.scrapes = 0

    def __call__(self, path, params):
        body = exposition([io_series("/thtest/w", write=4096 * self.scrapes,
                                     writes=self.scrapes, write_slots={12: self.scrapes})])
        self.scrapes += 1
        return 200, "text/plain; version=0.0.4", body.encode()


def test_metrics_source_needs_two_scrapes():
    with serve(FakeAgent()) as url:
        src = MetricsSource(url + "/metrics")
        assert src.poll() is None
        snap = src.poll()
    (row,) = snap.io
    assert row.write_bytes_per_second * snap.interval_seconds == pytest.approx(4096)
    assert row.write_bytes_total == 4096


def test_metrics_source_unreachable():
    with pytest.raises(SourceError, match="cannot reach"):
        MetricsSource("http://127.0.0.1:1/metrics").poll()


def run_cli(*argv):
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        rc = cli.main(list(argv))
    return rc, out.getvalue()


def test_once_json_from_an_agent():
    fake = FakeAgent()
    with serve(fake) as url:
        rc, out = run_cli("top", "--url", url + "/metrics", "--once", "--json", "--interval", "0.2")
    assert rc == 0 and fake.scrapes == 2
    doc = json.loads(out)
    assert doc["source"] == url + "/metrics" and doc["sort"] == "write"
    assert doc["filter"] == "" and doc["include_idle"] is False
    assert 0.1 < doc["interval_seconds"] < 1
    (row,) = doc["io"]
    assert row["name"] == "/thtest/w" and row["write_bytes_total"] == 4096
    assert row["write_bytes_per_second"] * doc["interval_seconds"] == pytest.approx(4096)
    assert doc["rdma"] == {"objects": None, "verb_errors": None} and doc["gpu"] is None


def test_once_table_from_prometheus():
    with serve(FakePrometheus()) as url:
        rc, out = run_cli("top", "--prometheus", url, "--once", "--sort", "read", "--all")
    assert rc == 0
    assert "READ/s ▼" in out and "9.0" in out and "/scratch (lustre)" in out
    assert "/thtest/plain" in out                # idle, shown because of --all
    assert "mlx5_0" in out and "sw_thermal_slowdown" in out


def test_live_view_refuses_without_a_terminal(capsys, monkeypatch):
    monkeypatch.setattr("sys.stdin", io.StringIO(""))
    rc = cli.main(["top", "--url", "http://127.0.0.1:1/metrics"])
    assert rc == 1 and "--once" in capsys.readouterr().err


def test_json_needs_once(capsys):
    assert cli.main(["top", "--json"]) == 1
    assert "--json needs --once" in capsys.readouterr().err
