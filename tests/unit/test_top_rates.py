"""tracehound top: /metrics text -> rows, and rates between two scrapes."""
import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily

from tracehound.attribution.workload import WORKLOAD_LABELS
from tracehound.collectors.io import BUCKET_BOUNDS, LABELS, OPS
from tracehound.top.rates import counter_delta, parse_metrics, snapshot

TMP = ("/tmp", "tmpfs")
DISK = ("/", "ext4")


def io_series(cgroup, fs=TMP, read=0, write=0, reads=0, writes=0, errors=None,
              write_slots=None, read_slots=None, **workload):
    """One label set's counters; *_slots: {k: calls with latency in [2^(k-1), 2^k) ns}."""
    return dict(labels=[cgroup, *fs, *(workload.get(k, "") for k in WORKLOAD_LABELS)],
                read=read, write=write, reads=reads, writes=writes, errors=errors or {},
                hists={"read": read_slots or {}, "write": write_slots or {}})


class _Exposition:
    """Families shaped exactly like the agent's (same labels, bucket bounds)."""

    def __init__(self, series, extra=()):
        self.series, self.extra = series, extra

    def collect(self):
        def counter(name):
            return CounterMetricFamily(f"tracehound_io_{name}", "", labels=LABELS)
        rb, wb = counter("read_bytes"), counter("write_bytes")
        reqs = {op: counter(f"{op}_requests") for op in OPS}
        errs = {op: counter(f"{op}_errors") for op in OPS}
        hists = {h: HistogramMetricFamily(f"tracehound_io_{h}_latency_seconds", "", labels=LABELS)
                 for h in ("read", "write", "fsync")}
        for s in self.series:
            lv = s["labels"]
            rb.add_metric(lv, s["read"])
            wb.add_metric(lv, s["write"])
            for op in OPS:
                calls = {"read": s["reads"], "write": s["writes"]}.get(op, 0)
                reqs[op].add_metric(lv, calls)
                errs[op].add_metric(lv, s["errors"].get(op, 0))
            for h, fam in hists.items():
                slots = s["hists"].get(h, {})
                cum, buckets = 0, []
                for k, bound in BUCKET_BOUNDS:
                    cum += slots.get(k, 0)
                    buckets.append((repr(bound), cum))
                buckets.append(("+Inf", cum))
                fam.add_metric(lv, buckets, 0.0)
        yield from (rb, wb, *reqs.values(), *errs.values(), *hists.values(), *self.extra)


def exposition(series, extra=()) -> str:
    reg = CollectorRegistry()
    reg.register(_Exposition(series, extra))
    return generate_latest(reg).decode()


def two_scrapes(before, after, seconds=2.0, extra_before=(), extra_after=()):
    prev = parse_metrics(exposition(before, extra_before), 100.0)
    cur = parse_metrics(exposition(after, extra_after), 100.0 + seconds)
    return snapshot(prev, cur, "test")


def by_name(snap):
    return {(r.name, r.mountpoint): r for r in snap.io}


def test_counter_delta_handles_resets_and_new_series():
    assert counter_delta(150, 100) == 50
    assert counter_delta(30, 100) == 30     # reset: the counter restarted from zero
    assert counter_delta(30, None) == 30    # new series: counted from zero


def test_rates_and_totals_from_two_scrapes():
    snap = two_scrapes([io_series("/a", read=100, write=1000, reads=1, writes=10)],
                       [io_series("/a", read=300, write=5000, reads=5, writes=30)])
    (row,) = snap.io
    assert (row.kind, row.name, row.mountpoint, row.fstype) == ("cgroup", "/a", "/tmp", "tmpfs")
    assert row.read_bytes_per_second == 100 and row.write_bytes_per_second == 2000
    assert row.read_ops_per_second == 2 and row.write_ops_per_second == 10
    assert row.ops_per_second == 12
    assert (row.read_bytes_total, row.write_bytes_total) == (300, 5000)
    assert snap.interval_seconds == 2.0


def test_counter_reset_counts_from_zero():
    snap = two_scrapes([io_series("/a", write=10_000, writes=100)],
                       [io_series("/a", write=400, writes=4)], seconds=4)
    (row,) = snap.io
    assert row.write_bytes_per_second == 100 and row.write_ops_per_second == 1


def test_series_new_in_second_scrape_counts_from_zero():
    snap = two_scrapes([], [io_series("/new", write=800)], seconds=2)
    assert by_name(snap)[("/new", "/tmp")].write_bytes_per_second == 400


def test_errors_summed_over_operations():
    snap = two_scrapes([io_series("/a", errors={"read": 1, "open": 2})],
                       [io_series("/a", errors={"read": 3, "open": 6, "unlink": 2})])
    assert snap.io[0].errors_per_second == (2 + 4 + 2) / 2


def test_one_row_per_workload_and_file_system():
    job = dict(workload="slurm", job_id="42", step="0")
    snap = two_scrapes(
        [io_series("/slurm/job_42/step_0/a", write=0, **job),
         io_series("/slurm/job_42/step_0/b", write=0, **job),
         io_series("/slurm/job_42/step_0/a", fs=DISK, read=0, **job)],
        [io_series("/slurm/job_42/step_0/a", write=100, **job),
         io_series("/slurm/job_42/step_0/b", write=300, **job),
         io_series("/slurm/job_42/step_0/a", fs=DISK, read=50, **job)], seconds=1)
    rows = by_name(snap)
    assert set(rows) == {("42.0", "/tmp"), ("42.0", "/")}
    tmp = rows[("42.0", "/tmp")]
    assert tmp.kind == "slurm" and tmp.write_bytes_per_second == 400
    assert sorted(tmp.cgroups) == ["/slurm/job_42/step_0/a", "/slurm/job_42/step_0/b"]
    assert tmp.workload["job_id"] == "42" and tmp.workload["step"] == "0"
    assert rows[("42.0", "/")].read_bytes_per_second == 50


def test_latency_quantiles_from_bucket_deltas():
    # before: 1000 old calls at ~1 ms must not count; in the interval: 100
    # writes, 90 in [2^19, 2^20) ns and 10 in [2^21, 2^22) ns
    before = [io_series("/a", writes=1000, write_slots={20: 1000})]
    after = [io_series("/a", writes=1100, write_slots={20: 1090, 22: 10})]
    snap = two_scrapes(before, after)
    row = snap.io[0]
    # the p50 rank (50 of 100) lies in bucket (2^19, 2^20] ns holding 90
    assert row.latency_p50_seconds == pytest.approx((2**19 + 2**19 * 50 / 90) / 1e9)
    # the p99 rank (99) lies in bucket (2^21, 2^22] ns: 9 of its 10 calls
    assert row.write_latency_p99_seconds == pytest.approx((2**21 + 2**21 * 9 / 10) / 1e9)
    assert row.latency_p99_seconds == row.write_latency_p99_seconds
    assert row.read_latency_p99_seconds is None


def test_read_and_write_histograms_merge_for_the_row_quantiles():
    snap = two_scrapes([io_series("/a")],
                       [io_series("/a", reads=50, writes=50, read_slots={11: 50},
                                  write_slots={21: 50})])
    row = snap.io[0]
    assert row.read_latency_p99_seconds < 2**11 / 1e9
    assert row.write_latency_p99_seconds > 2**20 / 1e9
    # half the calls are below 2^11 ns: the merged median is the top of that bucket
    assert row.latency_p50_seconds == pytest.approx(2**11 / 1e9)


def test_histogram_reset_takes_the_new_buckets_whole():
    before = [io_series("/a", write_slots={20: 500, 22: 500})]
    after = [io_series("/a", write_slots={20: 10, 22: 700})]   # slot 20 went backwards
    row = two_scrapes(before, after).io[0]
    # with per-bucket deltas slot 22 would show 200 calls and slot 20 none;
    # taken whole, 10 of 710 calls are fast: the median is in slot 22
    assert row.latency_p50_seconds > 2**21 / 1e9


def test_panels_absent_are_none_present_are_rows():
    snap = two_scrapes([], [])
    assert snap.io == [] and snap.rdma_objects is None and snap.rdma_errors is None
    assert snap.gpus is None

    def extra(xid_count, qps):
        objects = GaugeMetricFamily("tracehound_rdma_objects", "",
                                    labels=["device", "type", "cgroup"])
        objects.add_metric(["rxe0", "QP", "/job"], qps)
        errors = CounterMetricFamily("tracehound_rdma_verb_errors", "", labels=["op", "errno"])
        errors.add_metric(["reg_mr", "ENOMEM"], xid_count * 2)
        labels = ["gpu", "uuid", "model"]
        temp = GaugeMetricFamily("tracehound_gpu_temperature_celsius", "",
                                 labels=[*labels, "sensor"])
        temp.add_metric(["0", "GPU-1", "H100", "gpu"], 71)
        temp.add_metric(["0", "GPU-1", "H100", "memory"], 80)
        ev = GaugeMetricFamily("tracehound_gpu_clock_event_active", "", labels=[*labels, "reason"])
        ev.add_metric(["0", "GPU-1", "H100", "hw_thermal_slowdown"], 1)
        ev.add_metric(["0", "GPU-1", "H100", "gpu_idle"], 0)
        xid = CounterMetricFamily("tracehound_gpu_xid_errors", "", labels=[*labels, "xid"])
        xid.add_metric(["0", "GPU-1", "H100", "79"], xid_count)
        return [objects, errors, temp, ev, xid]

    snap = two_scrapes([], [], extra_before=extra(1, 2), extra_after=extra(3, 5), seconds=2)
    (obj,) = snap.rdma_objects
    assert (obj.cgroup, obj.device, obj.type, obj.count) == ("/job", "rxe0", "QP", 5)
    (err,) = snap.rdma_errors
    assert (err.op, err.errno, err.errors_total, err.errors_per_second) == \
        ("reg_mr", "ENOMEM", 6, 2)
    (gpu,) = snap.gpus
    assert (gpu.gpu, gpu.model, gpu.temperature_celsius, gpu.memory_temperature_celsius) == \
        ("0", "H100", 71, 80)
    assert gpu.throttle_reasons == ["hw_thermal_slowdown"]
    assert gpu.xids == {"79": 3} and gpu.xid_errors_per_second == 1


def test_xids_from_the_kernel_log_alone():
    def xids(n):
        fam = CounterMetricFamily("tracehound_gpu_xid_errors", "",
                                  labels=["gpu", "uuid", "model", "pci_bus_id", "xid"])
        if n:
            fam.add_metric(["", "", "", "0000:ff:00.0", "48"], n)
        return [fam]

    # every agent exports the family; none counted is no GPU panel
    assert two_scrapes([], [], extra_before=xids(0), extra_after=xids(0)).gpus is None
    snap = two_scrapes([], [], extra_before=xids(1), extra_after=xids(2), seconds=1)
    (gpu,) = snap.gpus
    assert gpu.gpu == "0000:ff:00.0" and gpu.xids == {"48": 2}


def test_scrapes_must_be_in_order():
    prev = parse_metrics(exposition([]), 10.0)
    with pytest.raises(ValueError):
        snapshot(prev, prev, "test")


def test_parser_agrees_with_prometheus_client_and_skips_other_metrics():
    from prometheus_client.parser import text_string_to_metric_families

    text = exposition([io_series('/we"ird\\path}x', read=5, reads=1, read_slots={12: 1})])
    text += "# TYPE other_metric gauge\nother_metric{a=\"b\"} 1\n"
    ours = parse_metrics(text, 0.0)
    theirs = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            theirs.setdefault(s.name, {})[tuple(sorted(s.labels.items()))] = s.value
    assert "other_metric" not in ours.samples
    assert "tracehound_io_fsync_latency_seconds_bucket" not in ours.samples
    for name, values in ours.samples.items():
        assert values == theirs[name], name
    (key,) = ours.series("tracehound_io_read_bytes_total")
    assert dict(key)["cgroup"] == '/we"ird\\path}x'
    # counters are known by both their family and their sample name
    assert ours.has("tracehound_io_read_bytes") and ours.has("tracehound_io_read_bytes_total")
    assert ours.has("other_metric")


def test_parser_rejects_garbage():
    with pytest.raises(ValueError):
        parse_metrics("tracehound_io_read_bytes_total{cgroup=\"/\"}\n", 0.0)


JOB_LEVELS = {                  # cgroup -> CPU seconds used in the interval (cpu.stat: own + below)
    "/system.slice/slurmstepd.scope/job_5": 1.9,
    "/system.slice/slurmstepd.scope/job_5/step_0": 1.9,
    "/system.slice/slurmstepd.scope/job_5/step_0/user": 1.9,
    "/system.slice/slurmstepd.scope/job_5/step_0/user/task_0": 1.9,
}


def cgroup_families(cpu: dict, processes: dict, rss: dict) -> list:
    """The pressure collector's families: {cgroup: seconds}, {(cgroup, state): n},
    {cgroup: bytes}; job 5's labels from its path."""
    owner = ["cgroup", *WORKLOAD_LABELS]

    def lv(cgroup):
        parts = cgroup.split("/")
        step = next((p[5:] for p in parts if p.startswith("step_")), "")
        task = next((p[5:] for p in parts if p.startswith("task_")), "")
        job = next((p[4:] for p in parts if p.startswith("job_")), "")
        w = {"workload": "slurm" if job else "", "job_id": job, "step": step, "task": task}
        return [cgroup, *(w.get(k, "") for k in WORKLOAD_LABELS)]
    c = CounterMetricFamily("tracehound_cgroup_cpu_seconds", "", labels=owner)
    for cg, v in cpu.items():
        c.add_metric(lv(cg), v)
    p = GaugeMetricFamily("tracehound_cgroup_processes", "", labels=[*owner, "state"])
    for (cg, state), n in processes.items():
        p.add_metric([*lv(cg), state], n)
    m = GaugeMetricFamily("tracehound_cgroup_memory_rss_bytes", "", labels=owner)
    for cg, v in rss.items():
        m.add_metric(lv(cg), v)
    return [c, p, m]


def test_a_jobs_cpu_is_counted_once_though_every_level_of_it_has_the_same_time():
    task = "/system.slice/slurmstepd.scope/job_5/step_0/user/task_0"
    prev = parse_metrics(exposition([], cgroup_families({cg: 10.0 for cg in JOB_LEVELS},
                                                         {}, {})), 100.0)
    io = io_series(task, write=4096, job_id="5", step="0", task="0", workload="slurm")
    cur = parse_metrics(exposition([io], cgroup_families(
        {cg: 10.0 + used for cg, used in JOB_LEVELS.items()},
        {(task, "running"): 1, (task, "stopped"): 1,
         ("/system.slice/slurmstepd.scope/job_5/step_0", "sleeping"): 1},
        {task: 3 << 20, "/system.slice/slurmstepd.scope/job_5/step_0": 1 << 20})), 102.0)
    [job] = snapshot(prev, cur, "t").jobs
    assert (job.kind, job.name) == ("slurm", "5")
    # 1.9 s in 2 s, not four times that (7.6 s: 3.8 cores on a 2-CPU machine)
    assert job.cpu_cores == pytest.approx(0.95)
    assert (job.processes, job.stopped_processes, job.memory_rss_bytes) == (3, 1, 4 << 20)
    assert job.write_bytes_per_second == 2048 and job.cgroups == 4


def test_a_cgroup_first_seen_brings_no_cpu_rate():
    task = "/system.slice/slurmstepd.scope/job_5/step_0/user/task_0"
    prev = parse_metrics(exposition([], []), 100.0)
    cur = parse_metrics(exposition([], cgroup_families({task: 500.0}, {}, {})), 102.0)
    [job] = snapshot(prev, cur, "t").jobs
    assert job.cpu_cores is None            # shown as "-": not known yet


def test_steps_side_by_side_add_up_and_a_bare_cgroup_is_no_job():
    base = "/system.slice/slurmstepd.scope/job_5"
    used = {f"{base}/step_0/user/task_0": 1.0, f"{base}/step_1/user/task_0": 0.5,
            "/thtest/bare": 1.0}
    prev = parse_metrics(exposition([], cgroup_families({c: 0.0 for c in used}, {}, {})), 0.0)
    cur = parse_metrics(exposition([], cgroup_families(used, {}, {})), 1.0)
    [job] = snapshot(prev, cur, "t").jobs
    assert job.name == "5" and job.cpu_cores == pytest.approx(1.5)
