"""A small fleet on one host: three agents, each in a network namespace of its
own (its "node"), scraped by a real Prometheus with deploy/prometheus's scrape
job and alerting rules, queried through tracehound.clients.prometheus. As
shipped, the job scrapes over TLS with a password: the agents serve a web
config with a certificate for "tracehound" from a CA made for the test.

All agents share this one kernel, so each of them counts every cgroup's I/O:
node N's workload shows up under every node label. What must hold is that the
series labelled node=N come from node N's agent, and that each workload's job
or pod labels carry its exact bytes.
"""
import glob
import json
import os
import shutil
import subprocess
import tempfile
import time
import urllib.request
import uuid
from contextlib import ExitStack
from dataclasses import dataclass

import pytest
import yaml

from testbed import prometheus as prometheus_server
from testbed.agents import stop
from tests import tls_files
from tests.conftest import ROOT, tracehound_cmd
from tests.kernel.conftest import require_tools, run_in_cgroup
from tracehound.chaos.scaffold import start_writer, stop_workload
from tracehound.clients.prometheus import (
    DetectionTimeout,
    PrometheusError,
    query,
    wait_for,
)

SCRAPE = os.path.join(ROOT, "deploy", "prometheus", "scrape.yml")
RULES = os.path.join(ROOT, "deploy", "prometheus", "tracehound-rules.yml")
MiB = 1 << 20
POD_UID = "5f0c7e1a-2b3d-4c5e-8f90-a1b2c3d4e5f6"
CONTAINER_ID = "c0ffee" * 10 + "beef"


@dataclass
class Node:
    name: str
    netns: str
    veth: str
    host_addr: str
    addr: str
    cgroup: str
    written: int
    proc: subprocess.Popen = None
    log: str = ""

    @property
    def target(self):
        return f"{self.addr}:9560"


@dataclass
class Fleet:
    nodes: list
    prometheus: str
    slurm_jobs: dict
    ghost_target: str


def sh(*argv):
    subprocess.run(argv, check=True, capture_output=True, text=True, timeout=30)


def web_config(tmp: str) -> tuple[str, tls_files.TLSFiles, str]:
    """The agents' web config (TLS for the name the scrape job checks, and a
    password), the TLS files, and the file with Prometheus's password."""
    tls = tls_files.make(tmp)
    tls_files.signed(tmp, "fleet", "/CN=tracehound",
                     "subjectAltName=DNS:tracehound\nextendedKeyUsage=serverAuth\n")
    config, password = tls.tls_with_password("fleet", "prometheus")
    return config, tls, password


def start_agent(node: Node, hook_mode: str, pod_logs: str, config: str) -> None:
    # nsenter, not `ip netns exec`: that would also unshare the mount namespace,
    # and the agent would see other mount ids than the workloads' (mnt:<id> labels).
    with open(node.log, "w") as out:
        node.proc = subprocess.Popen(
            ["nsenter", f"--net=/run/netns/{node.netns}", "--", *tracehound_cmd(), "run",
             "--listen", node.target, "--hook-mode", hook_mode, "--pod-logs-dir", pod_logs,
             "--web.config.file", config,
             # one agent per simulated node on this host: each its own instance
             "--instance", f"thtest-{node.name}",
             # the nodes' cgroups are made in the v2 tree (this host may be hybrid)
             "--cgroup-key", "v2"],
            stdout=out, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        with open(node.log) as f:
            text = f.read()
        if "tracehound: gpu:" in text:   # the last start-up line
            return
        if node.proc.poll() is not None:
            break
        time.sleep(0.2)
    pytest.fail(f"agent of {node.name} did not start:\n{text}")


def write_pod_logs(base: str) -> str:
    """The kubelet's log layout for pod ml/trainer-0, container worker."""
    pods = os.path.join(base, "pods")
    log = os.path.join(pods, f"ml_trainer-0_{POD_UID}", "worker", "0.log")
    os.makedirs(os.path.dirname(log))
    open(log, "w").close()
    containers = os.path.join(base, "containers")
    os.makedirs(containers)
    os.symlink(log, os.path.join(containers, f"trainer-0_ml_worker-{CONTAINER_ID}.log"))
    return pods


def prometheus_config(nodes, ghost_target: str, ca: str, password: str) -> dict:
    """deploy/prometheus/scrape.yml's bare-metal job, pointed at this fleet
    and at the test's CA and password."""
    with open(SCRAPE) as f:
        job = next(j for j in yaml.safe_load(f)["scrape_configs"] if j["job_name"] == "tracehound")
    assert job["scheme"] == "https"
    job["tls_config"]["ca_file"] = ca
    job["basic_auth"]["password_file"] = password
    job["scrape_interval"] = job["scrape_timeout"] = "1s"
    job["static_configs"] = [{"targets": [n.target], "labels": {"node": n.name}} for n in nodes]
    # no node label: the job's relabelling names it after the host
    job["static_configs"].append({"targets": [ghost_target]})
    return {"global": {"evaluation_interval": "1s"}, "rule_files": [RULES],
            "scrape_configs": [job]}


@pytest.fixture(scope="module")
def fleet(cgroup_root, tmpfs, hook_mode):
    require_tools("ip", "nsenter")
    prometheus_server.require()
    token = uuid.uuid4().hex[:6]
    tmp = tempfile.mkdtemp(prefix="thtest-fleet-")
    subnet = f"10.231.{int(token[:2], 16)}"
    base = f"/thtest/fleet-{token}"
    jobs = {"node1": str(700000 + int(token[2:4], 16)), "node3": str(800000 + int(token[4:], 16))}
    slurm = "slurmstepd.scope/job_{}/step_0/user/task_0"
    nodes = [
        Node("node1", f"thtest-node1-{token}", f"thv1{token}", f"{subnet}.1", f"{subnet}.2",
             f"{base}/node1/" + slurm.format(jobs["node1"]), 1 * MiB + 101),
        Node("node2", f"thtest-node2-{token}", f"thv2{token}", f"{subnet}.5", f"{subnet}.6",
             f"{base}/node2/kubepods/besteffort/pod{POD_UID}/{CONTAINER_ID}", 2 * MiB + 202),
        Node("node3", f"thtest-node3-{token}", f"thv3{token}", f"{subnet}.9", f"{subnet}.10",
             f"{base}/node3/" + slurm.format(jobs["node3"]), 3 * MiB + 303),
    ]
    prom = ExitStack()
    try:
        pod_logs = write_pod_logs(tmp)
        config, tls, password = web_config(tmp)
        for n in nodes:
            n.log = os.path.join(tmp, f"{n.name}.log")
            sh("ip", "netns", "add", n.netns)
            sh("ip", "link", "add", n.veth, "type", "veth", "peer", "name", "eth0",
               "netns", n.netns)
            sh("ip", "addr", "add", f"{n.host_addr}/30", "dev", n.veth)
            sh("ip", "link", "set", n.veth, "up")
            sh("ip", "-n", n.netns, "addr", "add", f"{n.addr}/30", "dev", "eth0")
            sh("ip", "-n", n.netns, "link", "set", "eth0", "up")
            sh("ip", "-n", n.netns, "link", "set", "lo", "up")
            os.makedirs(cgroup_root + n.cgroup)
        for n in nodes:
            start_agent(n, hook_mode, pod_logs, config)
        ghost = f"127.0.0.1:{prometheus_server.free_port()}"     # nothing listens there
        scrape = prometheus_config(nodes, ghost, tls.ca, password)
        url = prom.enter_context(prometheus_server.serving(tmp, scrape))
        for n in nodes:
            f = os.path.join(tmpfs, f"fleet-{token}-{n.name}")
            assert run_in_cgroup(cgroup_root, n.cgroup, [["write", f, n.written, 65536],
                                                         ["read", f, 65536]]) == [n.written] * 2
            os.unlink(f)
        yield Fleet(nodes, url, jobs, ghost)
    finally:
        prom.close()
        for n in nodes:
            stop(n.proc)
            # deleting the namespace deletes both ends of its veth pair
            subprocess.run(["ip", "netns", "del", n.netns], capture_output=True)
            subprocess.run(["ip", "link", "del", n.veth], capture_output=True)
        for path in sorted((cgroup_root + base + p for p in _ancestors(nodes, base)),
                           key=len, reverse=True):
            try:
                os.rmdir(path)
            except OSError:
                pass
        shutil.rmtree(tmp, ignore_errors=True)


def _ancestors(nodes, base):
    """Every directory from base down to each node's cgroup, relative to base."""
    out = {""}
    for n in nodes:
        parts = n.cgroup[len(base):].strip("/").split("/")
        out.update("/" + "/".join(parts[:i]) for i in range(1, len(parts) + 1))
    return out


def one_value(url, promql) -> float:
    samples = query(url, promql)
    assert len(samples) == 1, (promql, samples)
    return samples[0].value


def test_every_node_is_scraped_under_its_own_name(fleet):
    expected = {n.name: n.target for n in fleet.nodes}
    samples, _ = wait_for(fleet.prometheus, 'up{job="tracehound"} == 1',
                          lambda s: len(s) == len(expected), timeout=30)
    assert {s.labels["node"]: s.labels["instance"] for s in samples} == expected
    # a target without a node label is named by the scrape job's relabelling
    host = fleet.ghost_target.split(":")[0]
    ghost, _ = wait_for(fleet.prometheus, f'up{{job="tracehound", node="{host}"}} == 0',
                        timeout=30)
    assert ghost[0].labels["instance"] == fleet.ghost_target


def test_each_node_reports_its_workload_with_exact_bytes(fleet):
    url = fleet.prometheus
    for n in fleet.nodes:
        # every agent sees every cgroup; wait until all nodes have scraped this one's bytes
        per_node, _ = wait_for(
            url, f'sum by (node) (tracehound_io_write_bytes_total{{cgroup="{n.cgroup}"}})',
            lambda s: len(s) == 3 and all(x.value == n.written for x in s), timeout=30)
        assert {s.labels["node"] for s in per_node} == {"node1", "node2", "node3"}
    for name in ("node1", "node3"):
        n = next(x for x in fleet.nodes if x.name == name)
        job = fleet.slurm_jobs[name]
        labels = f'node="{name}", workload="slurm", job_id="{job}", step="0", task="0"'
        assert one_value(url, f"sum(tracehound_io_write_bytes_total{{{labels}}})") == n.written
        assert one_value(url, f"sum(tracehound_io_read_bytes_total{{{labels}}})") == n.written
        info = query(url, f'tracehound_workload_info{{node="{name}", job_id="{job}"}}')
        assert [s.labels["cgroup"] for s in info] == [n.cgroup]
    pod = next(x for x in fleet.nodes if x.name == "node2")
    labels = ('node="node2", workload="kubernetes", namespace="ml", pod="trainer-0", '
              'container="worker"')
    assert one_value(url, f"sum(tracehound_io_write_bytes_total{{{labels}}})") == pod.written
    assert one_value(url, f"sum(tracehound_io_read_bytes_total{{{labels}}})") == pod.written
    # the agents share the host's mount namespace: the tmpfs is named, not mnt:<id>
    mounts = query(url, f'count by (mountpoint) (tracehound_io_write_bytes_total{{{labels}}})')
    assert [s.labels["mountpoint"] for s in mounts] != [] and not any(
        s.labels["mountpoint"].startswith("mnt:") for s in mounts)


def alert_rule(prometheus: str, name: str) -> dict:
    """The loaded alerting rule `name`, as Prometheus reports it."""
    with urllib.request.urlopen(f"{prometheus}/api/v1/rules?type=alert", timeout=10) as r:
        groups = json.load(r)["data"]["groups"]
    rules = [x for g in groups for x in g["rules"] if x["name"] == name]
    assert len(rules) == 1, groups
    return rules[0]


def test_rules_load_and_see_probe_modes(fleet):
    url, names = fleet.prometheus, {n.name for n in fleet.nodes}
    # every node's probe modes are scraped before the rule's answer counts
    wait_for(url, "count by (node) (tracehound_probe_info)",
             lambda s: {x.labels["node"] for x in s} >= names, timeout=30)
    with open(RULES) as f:
        (expr,) = [r["expr"] for g in yaml.safe_load(f)["groups"] for r in g["rules"]
                   if r.get("alert") == "TracehoundProbeDegraded"]
    want = {s.labels["node"] for s in query(url, expr)}
    assert want <= names, want
    # the rule loaded and is evaluated cleanly: two evaluations after those
    # scrapes (the one under way when they were confirmed may predate them)
    rule = alert_rule(url, "TracehoundProbeDegraded")
    evaluations = {rule["lastEvaluation"]}
    deadline = time.monotonic() + 30
    while len(evaluations) < 3:
        assert time.monotonic() < deadline, f"the rule is not being evaluated: {rule}"
        time.sleep(0.5)
        rule = alert_rule(url, "TracehoundProbeDegraded")
        evaluations.add(rule["lastEvaluation"])
    assert rule["health"] == "ok" and rule["labels"]["severity"] == "info", rule
    # the nodes with a degraded probe have the alert pending (for: 15m), no other node
    assert {x["labels"]["node"] for x in rule["alerts"]} == want, rule
    assert {x["state"] for x in rule["alerts"]} <= {"pending"}, rule
    if want:
        alerts = query(url, 'ALERTS{alertname="TracehoundProbeDegraded", severity="info"}')
        assert {x.labels["node"] for x in alerts} == want, alerts


def test_query_errors_are_reported(fleet):
    with pytest.raises(PrometheusError) as bad:
        query(fleet.prometheus, "sum(")
    assert not bad.value.retryable and "bad_data" in str(bad.value)
    with pytest.raises(DetectionTimeout) as late:
        wait_for(fleet.prometheus, 'up{node="node-that-does-not-exist"}', timeout=1)
    assert late.value.last == [] and late.value.seconds >= 1


def test_chaos_detection_through_prometheus(fleet, cgroup_root, tmpfs):
    """A chaos experiment freezes a writer of node1's Slurm job; its
    detection probe asks Prometheus, by node and job, for the job's write
    rate, and must see it fall to zero."""
    job = fleet.slurm_jobs["node1"]
    step = fleet.nodes[0].cgroup.replace("/step_0/", "/step_1/")
    selector = f'node="node1", job_id="{job}", step="1"'
    experiment = {
        "title": "A frozen job step is seen through Prometheus",
        "description": "proc.stop on a writer; detection by PromQL on the node and job labels",
        "steady-state-hypothesis": {"title": "Prometheus is up", "probes": [
            {"type": "probe", "name": "prometheus-ready", "tolerance": 200,
             "provider": {"type": "http", "url": f"{fleet.prometheus}/-/ready", "timeout": 5}}]},
        "method": [
            {"type": "action", "name": "freeze-writer",
             "provider": {"type": "tracehound", "fault": "proc.stop",
                          "arguments": {"cgroup": step, "max_targets": 1}}},
            {"type": "probe", "name": "prometheus-sees-job-stop",
             "provider": {"type": "tracehound", "detect": {
                 "source": "prometheus", "url": fleet.prometheus, "timeout": 30,
                 "query": f"sum(rate(tracehound_io_write_bytes_total{{{selector}}}[3s]))",
                 "predicate": "== 0"}}},
            {"type": "action", "name": "thaw-writer",
             "provider": {"type": "tracehound", "rollback": "freeze-writer"}},
        ],
        "rollbacks": [],
    }
    rate = f"sum(rate(tracehound_io_write_bytes_total{{{selector}}}[3s]))"
    tmp = tempfile.mkdtemp(prefix="thtest-fleet-chaos-")
    try:
        start_writer(step, tmpfs, block_size=65536, direct=False)
        wait_for(fleet.prometheus, rate + " > 0", timeout=30)   # the job really writes
        path = os.path.join(tmp, "experiment.json")
        with open(path, "w") as f:
            json.dump(experiment, f)
        run = subprocess.run(tracehound_cmd() + ["chaos", "run", path, "--yes",
                                                 "--journal", f"{tmp}/journal",
                                                 "--report", f"{tmp}/report"],
                             capture_output=True, text=True, timeout=180)
        reports = glob.glob(f"{tmp}/report/*-journal.json")
        assert run.returncode == 0 and reports, f"{run.stdout}\n{run.stderr}"
        with open(reports[0]) as f:
            record = json.load(f)
        (stop,) = [d for d in record["detections"] if d["probe"] == "prometheus-sees-job-stop"]
        assert stop["detected"] and stop["tracehound_signal"], stop
        # asked of Prometheus by node and job, and seen after the fault went in
        assert stop["source"] == "prometheus" and selector in stop["query"], stop
        # rolled back: the writer runs again and Prometheus sees it
        wait_for(fleet.prometheus, rate + " > 0", timeout=30)
    finally:
        stop_workload(step, tmpfs)
        shutil.rmtree(tmp, ignore_errors=True)
        for d in (step, step.rsplit("/", 1)[0], step.rsplit("/", 2)[0]):
            try:
                os.rmdir(cgroup_root + d)
            except OSError:
                pass


def test_stopped_agent_raises_agent_down(fleet):
    """Last in this module: it stops node3's agent."""
    node3 = fleet.nodes[2]
    stop(node3.proc)
    alerts, _ = wait_for(
        fleet.prometheus, 'ALERTS{alertname="TracehoundAgentDown", node="node3"}', timeout=60)
    (alert,) = alerts
    assert alert.labels["alertstate"] == "pending"     # it fires after for: 5m
    assert alert.labels["instance"] == node3.target and alert.labels["severity"] == "warning"
    assert one_value(fleet.prometheus, 'up{node="node1"}') == 1
