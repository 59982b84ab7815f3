"""Alerting rules and scrape configuration, checked by Prometheus's own promtool.

promtool comes with Debian's `prometheus` package, which `scripts/install --dev`
installs; without it these tests fail rather than skip.
"""
import glob
import os
import shutil
import subprocess

import pytest
import yaml

from tests.conftest import ROOT

PROM_DIR = os.path.join(ROOT, "deploy", "prometheus")
RULES = os.path.join(PROM_DIR, "tracehound-rules.yml")
RULE_TESTS = sorted(glob.glob(os.path.join(PROM_DIR, "tests", "*.yml")))
SCRAPE = os.path.join(PROM_DIR, "scrape.yml")
SCRAPE_KUBERNETES = os.path.join(PROM_DIR, "scrape-kubernetes.yml")
SEVERITIES = {"critical", "warning", "info"}


@pytest.fixture(scope="module")
def promtool():
    path = shutil.which("promtool")
    if path is None:
        pytest.fail("promtool is missing: apt-get install prometheus (scripts/install --dev does)")
    return path


def run_promtool(promtool, *args):
    res = subprocess.run([promtool, *args], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, f"promtool {' '.join(args)} failed:\n{res.stdout}{res.stderr}"
    return res.stdout


def load_rules():
    with open(RULES) as f:
        return [rule for group in yaml.safe_load(f)["groups"] for rule in group["rules"]]


def alerts():
    return {r["alert"]: r for r in load_rules() if "alert" in r}


def test_rules_pass_promtool_check(promtool):
    out = run_promtool(promtool, "check", "rules", RULES)
    assert f"{len(load_rules())} rules found" in out


def test_rule_unit_tests_pass(promtool):
    assert RULE_TESTS, "no promtool tests under deploy/prometheus/tests"
    run_promtool(promtool, "test", "rules", *RULE_TESTS)


def test_every_alert_is_tested_firing_and_quiet():
    firing, quiet = set(), set()
    for path in RULE_TESTS:
        with open(path) as f:
            doc = yaml.safe_load(f)
        assert doc["rule_files"] == ["../tracehound-rules.yml"], path
        for case in doc["tests"]:
            for check in case.get("alert_rule_test", []):
                (firing if check.get("exp_alerts") else quiet).add(check["alertname"])
    names = set(alerts())
    assert names - firing == set(), "alerts never tested firing"
    assert names - quiet == set(), "alerts never tested quiet"
    assert (firing | quiet) - names == set(), "tests name alerts that do not exist"


def test_every_alert_has_a_severity_and_says_where():
    for name, rule in alerts().items():
        assert rule["labels"]["severity"] in SEVERITIES, name
        notes = rule["annotations"]
        assert notes.get("summary") and notes.get("description"), name
        if not rule["expr"].startswith("absent("):
            # everything but "no agent at all" happens on a node
            assert "$labels.node" in notes["summary"], name


def test_alert_severities():
    rules = alerts()
    assert rules["TracehoundProbeDegraded"]["labels"]["severity"] == "info"
    assert 'mode=~"kprobe|tracepoint"' in rules["TracehoundProbeDegraded"]["expr"]
    for critical in ("TracehoundGpuLost", "TracehoundGpuEccUncorrectable",
                     "TracehoundGpuCriticalXid", "TracehoundRdmaPortError"):
        assert rules[critical]["labels"]["severity"] == "critical", critical
    for warning in ("TracehoundRdmaVerbErrorBurst", "TracehoundRdmaViewsDisagree",
                    "TracehoundRdmaLinkFlap", "TracehoundRdmaPortErrors",
                    "TracehoundRdmaTransportRetries"):
        assert rules[warning]["labels"]["severity"] == "warning", warning


def test_io_error_alert_names_the_workload():
    summary = alerts()["TracehoundIoErrors"]["annotations"]["summary"]
    for label in ("job_id", "pod", "namespace", "node"):
        assert f"$labels.{label}" in summary


def test_rdma_verb_error_alert_names_the_workload():
    recorded = {r["record"]: r for r in load_rules() if "record" in r}
    by = recorded["workload:tracehound_rdma_verb_errors:increase5m"]["expr"]
    for label in ("job_id", "namespace", "pod"):
        assert label in by.split("(", 2)[1]
    summary = alerts()["TracehoundRdmaVerbErrorBurst"]["annotations"]["summary"]
    for label in ("job_id", "pod", "namespace", "node"):
        assert f"$labels.{label}" in summary


def test_rdma_views_alert_says_how_to_look():
    rule = alerts()["TracehoundRdmaViewsDisagree"]
    assert "app_only_objects|kernel_only_objects" in rule["expr"]
    notes = rule["annotations"]["description"]
    assert "tracehound rdma show --pid" in notes and "/events" in notes


def kubernetes_sd_supported(promtool, tmp_path) -> bool:
    """Debian builds Prometheus without some service discoveries, Kubernetes's among them."""
    probe = tmp_path / "k8s-probe.yml"
    probe.write_text("scrape_configs:\n  - job_name: probe\n    kubernetes_sd_configs:\n"
                     "      - role: pod\n")
    res = subprocess.run([promtool, "check", "config", str(probe)], capture_output=True,
                         text=True, timeout=60)
    return "kubernetes_sd_configs not found" not in res.stdout + res.stderr


def test_the_bare_metal_scrape_config_passes_promtool_as_shipped(promtool):
    with open(SCRAPE) as f:
        jobs = [job["job_name"] for job in yaml.safe_load(f)["scrape_configs"]]
    assert jobs == ["tracehound"]
    # run where it sits: its rule_files entry is relative to it
    out = run_promtool(promtool, "check", "config", SCRAPE)
    assert "1 rule files found" in out and "SUCCESS" in out


def test_the_kubernetes_scrape_config_is_valid(promtool, tmp_path):
    with open(SCRAPE_KUBERNETES) as f:
        config = yaml.safe_load(f)
    jobs = {job["job_name"]: job for job in config["scrape_configs"]}
    assert list(jobs) == ["tracehound-kubernetes"]
    assert "kubernetes_sd_configs" in jobs["tracehound-kubernetes"]
    if kubernetes_sd_supported(promtool, tmp_path):
        run_promtool(promtool, "check", "config", SCRAPE_KUBERNETES)
        return
    # Debian's promtool has no Kubernetes discovery: the rest of the file,
    # its relabelling included, is still checked with it
    job = jobs["tracehound-kubernetes"]
    del job["kubernetes_sd_configs"]
    job["static_configs"] = [{"targets": ["placeholder:9560"]}]
    config["rule_files"] = [RULES]
    checked = tmp_path / "scrape-kubernetes.yml"
    checked.write_text(yaml.safe_dump(config))
    out = run_promtool(promtool, "check", "config", str(checked))
    assert "1 rule files found" in out


def test_every_target_gets_a_node_label():
    jobs = []
    for path in (SCRAPE, SCRAPE_KUBERNETES):
        with open(path) as f:
            jobs += yaml.safe_load(f)["scrape_configs"]
    for job in jobs:
        relabels = job.get("relabel_configs", [])
        assert any(r.get("target_label") == "node" for r in relabels), job["job_name"]


def test_every_alert_is_in_the_deployment_guide():
    with open(os.path.join(ROOT, "docs", "deployment.md")) as f:
        guide = f.read()
    assert [a for a in alerts() if f"| `{a}` |" not in guide] == []


def test_alerts_are_grouped_by_subsystem():
    with open(RULES) as f:
        groups = {g["name"]: {r.get("alert") for r in g["rules"]}
                  for g in yaml.safe_load(f)["groups"]}
    # what happens to jobs has its own group, whichever subsystem saw it
    assert {"TracehoundJobStalled", "TracehoundOomKill", "TracehoundTcpRetransmits",
            "TracehoundNodeTcpRetransmits"} <= groups["tracehound-jobs"]
    assert all(not (a or "").startswith(("TracehoundJob", "TracehoundOom"))
               for name, rules in groups.items() if name != "tracehound-jobs" for a in rules)
