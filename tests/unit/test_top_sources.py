"""tracehound top against local HTTP servers: an agent's /metrics served by
the test, and a real Prometheus (Debian's) scraping an exporter the test
serves, whose counters grow at known rates."""
import contextlib
import http.server
import io
import json
import subprocess
import threading
import time
import urllib.parse

import pytest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from testbed import prometheus as prometheus_server
from tracehound import cli
from tracehound.collectors.io import OPS
from tracehound.clients import prometheus as promql
from tracehound.top.source import ERROR_OPS, MetricsSource, PrometheusSource, SourceError

from tests.unit.test_top_rates import exposition, io_series


@contextlib.contextmanager
def serve(answer):
    """answer(path, query or form params) -> (status, content type, body bytes)."""
    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            url = urllib.parse.urlsplit(self.path)
            self.reply(*answer(url.path, urllib.parse.parse_qs(url.query)))

        def reply(self, status, ctype, body):
            self.send_response(status)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05},
                              daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


# --- a real Prometheus ------------------------------------------------------
#
# The exporter stamps every sample with the time it computed it from, so each
# counter is exactly linear in its sample timestamps: base + slope * t. Then
# Prometheus' rate() over a window the samples cover is the slope, and less
# only where scrapes are missing at the window's edges (it never extrapolates
# past the samples it has): a rate lies in (slope / 2, slope] when at least
# half the window was scraped. A histogram_quantile is exact whatever the
# coverage: all buckets of one scrape share their timestamps, so their rates
# keep the buckets' proportions.

WINDOW = "3s"
HISTORY = "3500ms"          # scraped for longer than WINDOW
B = 5000.0                  # seconds of history every growing counter starts with
JOB = dict(cgroup="/slurm/job_9", mountpoint="/scratch", fstype="lustre",
           workload="slurm", job_id="9", step="0")
GPU = dict(instance="node1:9560", gpu="0", uuid="GPU-a", model="H100")
# per second: bytes, calls (reads in the (2^19, 2^20] ns bucket, writes in
# (2^21, 2^22] ns) and failed reads and opens
READ_BPS, WRITE_BPS, READS, WRITES, READ_ERRORS, OPEN_ERRORS = 1000, 2000, 10, 20, 0.125, 0.125
RDMA_ERRORS = 0.5
READ_SLOT, WRITE_SLOT = 20, 22


def bucket_quantile(q, counts):
    """histogram_quantile over {slot: calls}, slot k holding (2^(k-1), 2^k] ns."""
    rank = q * sum(counts.values())
    below = 0.0
    for slot in sorted(counts):
        if below + counts[slot] >= rank:
            low = 2 ** (slot - 1)
            return (low + low * (rank - below) / counts[slot]) / 1e9
        below += counts[slot]
    raise AssertionError("rank above the histogram")


def cluster_a(t):
    """The cluster's families `t` seconds after the exporter started."""
    grown = t + B
    job = io_series(JOB["cgroup"], fs=(JOB["mountpoint"], JOB["fstype"]),
                    read=READ_BPS * (t + 5000), write=WRITE_BPS * (t + 3500),
                    reads=READS * grown, writes=WRITES * grown,
                    errors={"read": READ_ERRORS * grown, "open": OPEN_ERRORS * grown},
                    read_slots={READ_SLOT: READS * grown},
                    write_slots={WRITE_SLOT: WRITES * grown},
                    **{k: v for k, v in JOB.items() if k not in ("cgroup", "mountpoint", "fstype")})
    idle = io_series("/thtest/plain")          # no I/O at all: no latency either
    objects = GaugeMetricFamily("tracehound_rdma_objects", "", labels=["cgroup", "device", "type"])
    objects.add_metric(["/slurm/job_9", "mlx5_0", "QP"], 4)
    calls = CounterMetricFamily("tracehound_rdma_verb_calls", "", labels=["op"])
    calls.add_metric(["reg_mr"], 100 * grown)
    errors = CounterMetricFamily("tracehound_rdma_verb_errors", "", labels=["op", "errno"])
    errors.add_metric(["reg_mr", "ENOMEM"], RDMA_ERRORS * (t + 60))      # 30 at the start
    return exposition([job, idle], extra=(objects, calls, errors, *gpu_families("node1:9560"),
                                          *job_families(grown)))


CPU_CORES = {"node1:9560": 0.5, "node2:9560": 0.25}     # job 9's, per node


def job_families(grown):
    """Job 9 on two nodes, its CPU time at job and step level alike (each
    cgroup's counter holds its descendants'), a stopped process on node1."""
    names = ["instance", "cgroup", "workload", "job_id", "step"]
    cpu = CounterMetricFamily("tracehound_cgroup_cpu_seconds", "", labels=names)
    procs = GaugeMetricFamily("tracehound_cgroup_processes", "", labels=[*names, "state"])
    rss = GaugeMetricFamily("tracehound_cgroup_memory_rss_bytes", "", labels=names)
    for node, cores in CPU_CORES.items():
        for cgroup, step in (("/slurm/job_9", ""), ("/slurm/job_9/step_0", "0")):
            cpu.add_metric([node, cgroup, "slurm", "9", step], cores * grown)
        step = [node, "/slurm/job_9/step_0", "slurm", "9", "0"]
        procs.add_metric([*step, "stopped" if node == "node1:9560" else "running"], 1)
        rss.add_metric(step, 1 << 20)
    return cpu, procs, rss


def cluster_b(t):
    """No RDMA metrics at all; a GPU and a quiet cgroup."""
    return exposition([io_series("/thtest/b")], extra=gpu_families("node2:9560"))


def gpu_families(node):
    gpu = [node, GPU["gpu"], GPU["uuid"], GPU["model"]]
    names = ["instance", "gpu", "uuid", "model"]
    temperature = GaugeMetricFamily("tracehound_gpu_temperature_celsius", "",
                                    labels=names + ["sensor"])
    temperature.add_metric(gpu + ["gpu"], 83)
    clocks = GaugeMetricFamily("tracehound_gpu_clock_event_active", "", labels=names + ["reason"])
    clocks.add_metric(gpu + ["sw_thermal_slowdown"], 1)
    clocks.add_metric(gpu + ["hw_slowdown"], 0)
    xids = CounterMetricFamily("tracehound_gpu_xid_errors", "", labels=names + ["xid"])
    xids.add_metric(gpu + ["48"], 2)
    return clocks, temperature, xids


def now_ms() -> int:
    return time.time_ns() // 1_000_000


class Exporter:
    """/a and /b: the two clusters, every sample stamped with its time."""

    def __init__(self):
        self.started_ms = now_ms()

    def __call__(self, path, params):
        page = {"/a": cluster_a, "/b": cluster_b}.get(path)
        if page is None:
            return 404, "text/plain", b"not found"
        ms = now_ms()
        # from whole milliseconds: a difference of two Unix times in seconds
        # would lose 1e-7 s to rounding, and the rates their exactness
        text = page((ms - self.started_ms) / 1000)
        stamped = "".join(line + (f" {ms}\n" if line and not line.startswith("#") else "\n")
                          for line in text.splitlines())
        return 200, "text/plain; version=0.0.4", stamped.encode()


@pytest.fixture(scope="module")
def exporter():
    ex = Exporter()
    with serve(ex) as url:
        ex.url = url
        yield ex


@pytest.fixture(scope="module")
def prometheus(exporter, tmp_path_factory):
    address = exporter.url.removeprefix("http://")
    config = {"global": {"scrape_interval": "200ms", "scrape_timeout": "200ms"},
              "scrape_configs": [
                  {"job_name": f"top-{c}", "metrics_path": f"/{c}", "honor_labels": True,
                   "static_configs": [{"targets": [address], "labels": {"cluster": c}}]}
                  for c in ("a", "b")]}
    with prometheus_server.serving(tmp_path_factory.mktemp("prometheus"), config) as url:
        for c in ("a", "b"):
            # scraped since before the rate window starts
            promql.wait_for(url, f'up{{job="top-{c}"}} offset {HISTORY}', timeout=120)
        yield url


@pytest.fixture(scope="module")
def polled(prometheus, exporter):
    """One poll of cluster a, with every PromQL query it sent."""
    asked = []
    real = promql.query

    def recording(url, expr, *args, **kwargs):
        asked.append(expr)
        return real(url, expr, *args, **kwargs)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(promql, "query", recording)
        snap = PrometheusSource(prometheus, window=WINDOW, selector='cluster="a"').poll()
    return snap, asked, (now_ms() - exporter.started_ms) / 1000


def assert_rate(got, slope):
    assert slope / 2 < got <= slope * (1 + 1e-9), (got, slope)


def test_prometheus_source_rows_and_panels(polled):
    snap, asked, elapsed = polled
    assert snap.window == WINDOW and snap.interval_seconds is None
    rows = {r.name: r for r in snap.io}
    assert set(rows) == {"9.0", "/thtest/plain"}
    job = rows["9.0"]
    assert (job.kind, job.mountpoint, job.fstype, job.cgroups) == \
        ("slurm", "/scratch", "lustre", ["/slurm/job_9"])
    assert_rate(job.read_bytes_per_second, READ_BPS)
    assert_rate(job.write_bytes_per_second, WRITE_BPS)
    assert_rate(job.read_ops_per_second, READS)
    assert_rate(job.write_ops_per_second, WRITES)
    assert job.ops_per_second == job.read_ops_per_second + job.write_ops_per_second
    # the failed calls of every operation add up
    assert_rate(job.errors_per_second, READ_ERRORS + OPEN_ERRORS)
    # a counter's value at its last scrape: what it started from, and at
    # most what it grew to by the end of the poll
    assert 5e6 <= job.read_bytes_total <= 5e6 + READ_BPS * elapsed
    assert 7e6 <= job.write_bytes_total <= 7e6 + WRITE_BPS * elapsed
    # quantiles of the calls in the window: reads and writes merged, and apart
    both = {READ_SLOT: READS, WRITE_SLOT: WRITES}
    assert job.latency_p50_seconds == pytest.approx(bucket_quantile(0.5, both), rel=1e-9)
    assert job.latency_p99_seconds == pytest.approx(bucket_quantile(0.99, both), rel=1e-9)
    assert job.read_latency_p99_seconds == \
        pytest.approx(bucket_quantile(0.99, {READ_SLOT: READS}), rel=1e-9)
    assert job.write_latency_p99_seconds == \
        pytest.approx(bucket_quantile(0.99, {WRITE_SLOT: WRITES}), rel=1e-9)
    # NaN (no calls in the window) is unknown, not a number
    idle = rows["/thtest/plain"]
    assert idle.read_latency_p99_seconds is None and idle.latency_p50_seconds is None
    assert (idle.read_bytes_per_second, idle.write_bytes_total) == (0, 0)
    (obj,) = snap.rdma_objects
    assert (obj.cgroup, obj.device, obj.type, obj.count) == ("/slurm/job_9", "mlx5_0", "QP", 4)
    (err,) = snap.rdma_errors
    assert (err.op, err.errno) == ("reg_mr", "ENOMEM")
    assert_rate(err.errors_per_second, RDMA_ERRORS)
    assert 30 <= err.errors_total <= 30 + RDMA_ERRORS * elapsed
    # one job row over both nodes: the step's CPU is inside the job's, once
    (row,) = snap.jobs
    assert (row.kind, row.name, row.nodes, row.cgroups) == \
        ("slurm", "9", ["node1:9560", "node2:9560"], 2)
    assert_rate(row.cpu_cores, sum(CPU_CORES.values()))
    assert (row.processes, row.stopped_processes, row.memory_rss_bytes) == (2, 1, 2 << 20)
    assert_rate(row.read_bytes_per_second, READ_BPS)
    (gpu,) = snap.gpus
    assert (gpu.node, gpu.gpu, gpu.uuid, gpu.model, gpu.temperature_celsius) == \
        ("node1:9560", "0", "GPU-a", "H100", 83)
    assert gpu.throttle_reasons == ["sw_thermal_slowdown"] and gpu.xids == {"48": 2}
    # every query is scoped by the selector and uses the window for rates
    assert asked and all('cluster="a"' in q for q in asked)
    assert all(f"[{WINDOW}]" in q for q in asked if "rate(" in q)
    assert any(q.startswith("histogram_quantile(0.99,") for q in asked)


def test_error_counters_queried_are_the_ones_exported():
    assert ERROR_OPS == OPS


def test_prometheus_without_rdma_metrics_says_no_data(prometheus):
    snap = PrometheusSource(prometheus, selector='cluster="b"').poll()
    assert snap.rdma_objects is None and snap.rdma_errors is None
    (gpu,) = snap.gpus
    assert gpu.node == "node2:9560"
    assert [r.name for r in snap.io] == ["/thtest/b"]


def test_prometheus_query_error_is_one_clear_error(prometheus):
    # a selector that is not PromQL: Prometheus refuses the first query
    with pytest.raises(SourceError, match="parse error"):
        PrometheusSource(prometheus, selector="cluster=").poll()
    with pytest.raises(SourceError, match="not a PromQL duration"):
        PrometheusSource("http://127.0.0.1:1", window="1 minute")


def test_queries_are_valid_promql(polled, tmp_path):
    """Valid as recording rules too, as promtool (Debian: prometheus) checks them."""
    _, asked, _ = polled
    rules = {"groups": [{"name": "top", "rules": [
        {"record": f"top:q{i}", "expr": q} for i, q in enumerate(asked)]}]}
    path = tmp_path / "rules.json"
    path.write_text(json.dumps(rules))       # JSON is YAML
    res = subprocess.run(["promtool", "check", "rules", str(path)], capture_output=True,
                         text=True)
    assert res.returncode == 0, res.stdout + res.stderr
    assert f"SUCCESS: {len(asked)} rules found" in res.stdout


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
    assert doc["interval_seconds"] > 0
    (row,) = doc["io"]
    assert row["name"] == "/thtest/w" and row["write_bytes_total"] == 4096
    assert row["write_bytes_per_second"] * doc["interval_seconds"] == pytest.approx(4096)
    assert doc["rdma"] == {"objects": None, "verb_errors": None} and doc["gpu"] is None


def test_once_reads_the_agent_the_environment_names(monkeypatch):
    # the one variable every client honours: top, explain, health, chaos
    fake = FakeAgent()
    with serve(fake) as url:
        monkeypatch.setenv("TRACEHOUND_METRICS_URL", url + "/metrics")
        rc, out = run_cli("top", "--once", "--json", "--interval", "0.2")
    assert rc == 0 and fake.scrapes == 2
    assert json.loads(out)["source"] == url + "/metrics"


def test_once_table_from_prometheus(prometheus):
    rc, out = run_cli("top", "--prometheus", prometheus, "--once", "--sort", "read", "--all")
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
