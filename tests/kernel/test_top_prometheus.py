"""`tracehound top --prometheus` against a real Prometheus server scraping the
real agent, in both histogram forms: its rows and panels, and a Slurm job's
CPU counted once across its cgroup levels."""
import json
import math
import os
import subprocess
import sys
import urllib.parse
import urllib.request
import uuid

import pytest

from testbed import prometheus as prometheus_server
from tests.conftest import tracehound_cmd
from tests.kernel.conftest import mount_of, remove_cgroup, run_in_cgroup, series
from tests.kernel.test_pressure import wait_for as wait_until
from tests.kernel.test_top import scraped_total, top_once_around
from tracehound.clients.prometheus import query, wait_for


@pytest.fixture(params=["classic", "native"])
def prometheus(agent, tmp_path, request):
    """A real Prometheus scraping the agent every second, keeping the latency
    histograms classic (_bucket series) or native (it asks for protobuf and
    keeps no _bucket series); yields its URL."""
    target = urllib.parse.urlsplit(agent.url).netloc
    config = {"global": {"scrape_interval": "1s"},
              "scrape_configs": [{"job_name": "tracehound",
                                  "static_configs": [{"targets": [target]}]}]}
    flags = ["--enable-feature=native-histograms"] if request.param == "native" else []
    with prometheus_server.serving(tmp_path, config, flags=flags) as url:
        yield url


def test_prometheus_source_against_a_real_server(prometheus, cgroup_root, cgroup, tmpfs,
                                                 request):
    form = request.node.callspec.params["prometheus"]
    path = os.path.join(tmpfs, f"top-prom-{uuid.uuid4().hex[:8]}")
    total = f'sum(tracehound_io_write_bytes_total{{cgroup="{cgroup}"}})'
    try:
        # rate() needs an increase between two samples, so write twice
        run_in_cgroup(cgroup_root, cgroup, [["write", path, 100_000, 65536]])
        wait_for(prometheus, f"{total} == 100000", timeout=60)
        run_in_cgroup(cgroup_root, cgroup, [["write", path + ".2", 300_000, 65536]])
        wait_for(prometheus, f"{total} == 400000", timeout=60)
    finally:
        for p in (path, path + ".2"):
            if os.path.exists(p):
                os.unlink(p)
    res = subprocess.run(tracehound_cmd() + ["top", "--prometheus", prometheus, "--window", "1m",
                                             "--once", "--json", "--filter", cgroup],
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    doc = json.loads(res.stdout)
    (row,) = [r for r in doc["io"] if r["mountpoint"] == mount_of(tmpfs)]
    assert (row["name"], row["kind"], row["cgroups"]) == (cgroup, "cgroup", [cgroup])
    assert row["write_bytes_total"] == 400_000 and row["write_bytes_per_second"] > 0
    assert row["write_ops_per_second"] > 0 and row["errors_per_second"] == 0
    p50, p99 = row["latency_p50_seconds"], row["write_latency_p99_seconds"]
    assert p50 is not None and 0 < p50 <= p99 < math.inf
    assert doc["window"] == "1m" and doc["interval_seconds"] is None
    # the form is the one asked for: a native Prometheus keeps no _bucket series
    buckets = query(prometheus, f'count(tracehound_io_write_latency_seconds_bucket'
                                f'{{cgroup="{cgroup}"}})')
    assert bool(buckets) == (form == "classic"), (form, buckets)


def test_a_slurm_jobs_row_counts_its_cpu_once_across_its_cgroup_levels(agent, cgroup_root,
                                                                        cgroup):
    """One busy process in a job's task cgroup: its CPU time is in the
    task's, user's, step's and job's cpu.stat alike; the job's row counts it
    once (the naive sum over the levels is four times that)."""
    job_id = str(900000 + int(uuid.uuid4().hex[:4], 16))
    job = f"{cgroup}/slurmstepd.scope/job_{job_id}"
    task = f"{job}/step_0/user/task_0"
    os.makedirs(cgroup_root + task)
    burner = subprocess.Popen(["sh", "-c", 'echo $$ > "$0" && exec "$@"',
                               f"{cgroup_root}{task}/cgroup.procs", sys.executable, "-c",
                               "while True: pass"])
    cpu = "tracehound_cgroup_cpu_seconds_total"
    try:
        # the agent reads the job's cgroups before top's first scrape
        wait_until(lambda: series(agent.scrape(), cpu, cgroup=job) > 0, "the job's CPU series")
        proxy, res = top_once_around(agent, job_id, f"{cgroup_root}{cgroup}/none", lambda: None)
        assert res.returncode == 0, res.stderr
        [row] = json.loads(res.stdout)["jobs"]
        assert (row["kind"], row["name"], row["processes"]) == ("slurm", job_id, 1), row
        before, after = (scraped_total(b, cpu, cgroup=job) for b in proxy.bodies)
        levels = sum(scraped_total(proxy.bodies[1], cpu, cgroup=c) -
                     scraped_total(proxy.bodies[0], cpu, cgroup=c)
                     for c in (job, f"{job}/step_0", f"{job}/step_0/user", task))
        seconds = json.loads(res.stdout)["interval_seconds"]
        # the job's own counter over the interval, and not its levels' sum
        assert row["cpu_cores"] * seconds == pytest.approx(after - before, rel=1e-9)
        assert after - before > 0 and levels == pytest.approx(4 * (after - before), rel=0.01)
        assert row["cpu_cores"] <= 1.0 + 1e-6       # one process: at most one CPU
    finally:
        burner.kill()
        burner.wait()
        for path in (task, f"{job}/step_0/user", f"{job}/step_0", job,
                     f"{cgroup}/slurmstepd.scope"):
            remove_cgroup(cgroup_root + path)
