"""The Grafana dashboard: structure, variables, and PromQL that Prometheus's
parser accepts. tests/kernel/test_dashboard.py checks its metric names against
a running agent."""
import json
import os
import re
import shutil
import subprocess

import pytest
import yaml

from tests.conftest import ROOT

DASHBOARD = os.path.join(ROOT, "deploy", "grafana", "tracehound.json")
RULES = os.path.join(ROOT, "deploy", "prometheus", "tracehound-rules.yml")
VARIABLES = {"datasource", "node", "job_id", "pod"}
GRAFANA_BUILTINS = {"__rate_interval", "__interval", "__range", "__all"}
# what Grafana puts in place of the variables, for a parser check
EXAMPLE_VALUES = {"$__rate_interval": "1m", "$node": ".*", "$job_id": ".*", "$pod": ".*"}
# a tracehound_ identifier not glued to a recording-rule name (a:b:c) or a function call
METRIC = re.compile(r"(?<![\w:])tracehound_\w+(?![\w:(])")


def load_dashboard():
    with open(DASHBOARD) as f:
        return json.load(f)


def dashboard_queries() -> list[tuple[str, str]]:
    """(where, PromQL) for every panel target and every variable query."""
    dash = load_dashboard()
    out = [(f"panel {p['id']} {p['title']!r} {t['refId']}", t["expr"])
           for p in dash["panels"] for t in p.get("targets", [])]
    for var in dash["templating"]["list"]:
        if var["type"] == "query":
            out.append((f"variable {var['name']}", var["query"]["query"]))
    return out


def rule_queries() -> list[tuple[str, str]]:
    """(where, text) for every rule expression and every annotation (they may query)."""
    with open(RULES) as f:
        doc = yaml.safe_load(f)
    out = []
    for group in doc["groups"]:
        for rule in group["rules"]:
            name = rule.get("alert") or rule.get("record")
            out.append((f"rule {name}", rule["expr"]))
            out += [(f"rule {name} {k}", v) for k, v in rule.get("annotations", {}).items()]
    return out


def metric_names(promql: str) -> set[str]:
    return set(METRIC.findall(promql))


def as_promql(expr: str) -> str:
    for var, value in EXAMPLE_VALUES.items():
        expr = expr.replace(var, value)
    return expr


def test_dashboard_identity():
    dash = load_dashboard()
    assert dash["uid"] == "tracehound-fleet" and dash["title"]
    assert isinstance(dash["schemaVersion"], int)
    assert {v["name"] for v in dash["templating"]["list"]} == VARIABLES


def test_panels_have_unique_ids_and_do_not_overlap():
    panels = load_dashboard()["panels"]
    ids = [p["id"] for p in panels]
    assert len(ids) == len(set(ids))
    cells = {}
    for p in panels:
        g = p["gridPos"]
        assert g["x"] >= 0 and g["w"] > 0 and g["x"] + g["w"] <= 24, p["title"]
        for x in range(g["x"], g["x"] + g["w"]):
            for y in range(g["y"], g["y"] + g["h"]):
                assert (x, y) not in cells, f"{p['title']!r} overlaps {cells[(x, y)]!r}"
                cells[(x, y)] = p["title"]


def test_every_query_panel_uses_the_datasource_variable():
    for p in load_dashboard()["panels"]:
        if p["type"] == "row":
            continue
        assert p["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, p["title"]
        refs = [t["refId"] for t in p["targets"]]
        assert refs and len(refs) == len(set(refs)), p["title"]
        assert all(t["expr"].strip() for t in p["targets"]), p["title"]


def test_only_defined_variables_are_used():
    for where, expr in dashboard_queries():
        used = set(re.findall(r"\$\{?(\w+)", expr))
        assert used <= VARIABLES | GRAFANA_BUILTINS, where


def test_selected_jobs_filter_every_io_query():
    for where, expr in dashboard_queries():
        for selector in re.findall(r"tracehound_io_\w+\{([^}]*)\}", expr):
            assert 'job_id=~"$job_id"' in selector and 'pod=~"$pod"' in selector, where


def test_heatmaps_read_histograms_in_either_form():
    heatmaps = [p for p in load_dashboard()["panels"] if p["type"] == "heatmap"]
    assert {m for p in heatmaps for t in p["targets"] for m in metric_names(t["expr"])} == {
        f"tracehound_io_{op}_latency_seconds{suffix}" for op in ("read", "write", "fsync")
        for suffix in ("_bucket", "")}
    for p in heatmaps:
        classic, native = p["targets"]
        assert all(t["format"] == "heatmap" for t in (classic, native))
        # classic buckets by le; a native histogram is one series, its buckets inside
        assert "by (le)" in classic["expr"] and "_bucket" not in native["expr"]
        assert p["options"]["calculate"] is False


def test_dashboard_covers_io_rdma_gpu_and_agent_health():
    used = set().union(*(metric_names(e) for _, e in dashboard_queries()))
    assert {"tracehound_io_read_bytes_total", "tracehound_io_write_bytes_total",
            "tracehound_rdma_objects", "tracehound_rdma_verb_errors_total",
            "tracehound_rdma_async_events_total", "tracehound_rdma_anomalies_total",
            "tracehound_gpu_xid_errors_total", "tracehound_gpu_ecc_errors_total",
            "tracehound_gpu_clock_event_active", "tracehound_gpu_lost",
            "tracehound_probe_info", "tracehound_map_full_drops_total",
            "tracehound_series_overflow_total", "tracehound_build_info",
            "tracehound_workload_info", "tracehound_rdma_app_objects",
            "tracehound_rdma_app_verb_errors_total", "tracehound_rdma_port_counter_total",
            "tracehound_rdma_port_hw_counter_total", "tracehound_rdma_port_state_id"} <= used
    assert {"tracehound_gpu_nvlink_up", "tracehound_gpu_nvlink_bytes_total",
            "tracehound_gpu_process_sm_utilization_ratio", "tracehound_gpu_mig_memory_used_bytes",
            "tracehound_gpu_process_nic_misplaced"} <= used


def test_rdma_panels_of_the_selected_jobs_filter_by_job_and_pod():
    """RDMA queries of the selected jobs select them (directly, or by joining
    tracehound_workload_info); the application's view is always per workload."""
    checked = 0
    for where, expr in dashboard_queries():
        if "selected jobs" in where and "tracehound_rdma_" in expr:
            assert 'job_id=~"$job_id"' in expr and 'pod=~"$pod"' in expr, where
            checked += 1
        for selector in re.findall(r"tracehound_rdma_app_\w+\{([^}]*)\}", expr):
            assert 'job_id=~"$job_id"' in selector and 'pod=~"$pod"' in selector, where
    assert checked >= 5


def test_metric_name_extraction():
    assert metric_names('sum by (le) (rate(tracehound_io_read_latency_seconds_bucket'
                        '{job=~"tracehound.*"}[5m])) / workload:tracehound_io_errors:rate5m') == {
        "tracehound_io_read_latency_seconds_bucket"}


def test_every_query_parses(tmp_path):
    """Each panel query becomes a recording rule, so promtool parses it with
    Prometheus's own PromQL parser (label_values() is Grafana's: its selector is checked)."""
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.fail("promtool is missing: apt-get install prometheus (scripts/install --dev does)")
    rules = []
    for i, (where, expr) in enumerate(dashboard_queries()):
        m = re.fullmatch(r"label_values\((.*), (\w+)\)", expr)
        rules.append({"record": f"dashboard:query{i}", "expr": as_promql(m.group(1) if m else expr),
                      "labels": {"where": where}})
    path = tmp_path / "dashboard-queries.yml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}))
    res = subprocess.run([promtool, "check", "rules", str(path)], capture_output=True, text=True,
                         timeout=60)
    assert res.returncode == 0, res.stdout + res.stderr
