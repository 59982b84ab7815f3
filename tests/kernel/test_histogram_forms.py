"""Latency asked of a real Prometheus in both histogram forms: classic (the
`_bucket`, `_sum` and `_count` series) and native (Prometheus with
--enable-feature=native-histograms asks the agent for protobuf and keeps no
`_bucket` series). The dashboard's latency panels and explain's mean write
latency answer from either, after real writes seen by the real agent."""
import os
import uuid

from tests.kernel.conftest import mount_of, run_in_cgroup
from tests.kernel.test_top_prometheus import prometheus  # noqa: F401  (the fixture, in both forms)
from tests.unit.test_deploy_dashboard import load_dashboard
from tracehound.explain.rules import RULES, fill
from tracehound.clients.prometheus import query, wait_for

# Grafana's variables, as a dashboard with every node, job and pod selected fills them
GRAFANA = {'"$node"': '".*"', '"$job_id"': '".*"', '"$pod"': '".*"', "$__rate_interval": "1m"}
LATENCY_PANELS = ("Read latency", "Write latency", "Mean latency per file system",
                  "p99 latency per file system")


def grafana_filled(expr: str) -> str:
    for var, value in GRAFANA.items():
        expr = expr.replace(var, value)
    return expr


def test_latency_answers_from_either_histogram_form(prometheus, cgroup_root,  # noqa: F811
                                                    cgroup, tmpfs, request):
    form = request.node.callspec.params["prometheus"]
    path = os.path.join(tmpfs, f"forms-{uuid.uuid4().hex[:8]}")
    total = f'sum(tracehound_io_write_bytes_total{{cgroup="{cgroup}"}})'
    try:
        # a rate needs an increase between two samples: write twice
        run_in_cgroup(cgroup_root, cgroup, [["write", path, 100_000, 65536],
                                            ["read", path, 65536]])
        wait_for(prometheus, f"{total} == 100000", timeout=60)
        run_in_cgroup(cgroup_root, cgroup, [["write", path + ".2", 300_000, 65536],
                                            ["read", path + ".2", 65536]])
        wait_for(prometheus, f"{total} == 400000", timeout=60)
    finally:
        for p in (path, path + ".2"):
            if os.path.exists(p):
                os.unlink(p)
    # the form is the one asked for: a native Prometheus keeps no _bucket series
    buckets = query(prometheus, f'count(tracehound_io_write_latency_seconds_bucket'
                                f'{{cgroup="{cgroup}"}})')
    assert bool(buckets) == (form == "classic"), (form, buckets)
    # explain's slow_writes: the mean write latency of the cgroup on the mount
    rule = next(r for r in RULES if r.name == "slow_writes")
    rows = query(prometheus, fill(rule.expr, job=f'cgroup="{cgroup}"', window="1m", at="",
                                  by="cgroup, mountpoint"))
    means = {s.labels.get("mountpoint"): s.value for s in rows}
    # (answered in this form: how long the writes took is not this test's)
    assert means.get(mount_of(tmpfs), 0) > 0, means
    # every latency panel of the dashboard: one of its targets has data
    panels = {p["title"]: p for p in load_dashboard()["panels"] if p["title"] in LATENCY_PANELS}
    assert sorted(panels) == sorted(LATENCY_PANELS)
    for title, panel in panels.items():
        answered = [t["refId"] for t in panel["targets"]
                    if query(prometheus, f"count({grafana_filled(t['expr'])})")]
        assert answered, f"{title}: no target answered"
