"""`tracehound explain JOB` against the real Slurm cluster: three node agents
scraped by a real Prometheus, a real three-node job, and a fault the chaos
engine injects on one of its nodes through Slurm.

- before the fault the job is found on its three nodes with nothing abnormal;
- after one of its processes is killed on one node, the kill is the first
  finding, on that node, with its evidence and since when; the other nodes
  have none.
"""
import json
import subprocess

from tests.cluster.test_fleet_chaos import cluster, jobs  # noqa: F401  (fixtures)
from tests.cluster.test_fleet_chaos import fleet_argv, fleet_report, run_fleet
from tests.cluster.test_job_io import poll
from tests.conftest import tracehound_cmd


def explain(cluster, url: str, job_id: str, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run([*tracehound_cmd(), "explain", job_id, "--prometheus", url,
                           "--node-label", "node", "--window", "5m", *extra],
                          env=cluster.env(), capture_output=True, text=True, timeout=60)


def answer(cluster, url: str, job_id: str) -> dict:
    done = explain(cluster, url, job_id, "--json")
    assert done.returncode == 0, done.stdout + done.stderr
    return json.loads(done.stdout)


def test_a_killed_rank_is_the_first_finding_on_its_node_and_before_it_nothing_is(
        cluster, fleet_prometheus, jobs, tmp_path):
    job = jobs(cluster.nodes, tmp_path, "thexplain")
    # each task wrote its pid file: the job shows on every node
    before = poll(lambda: (lambda a: a if a["nodes"] == cluster.nodes else None)(
        answer(cluster, fleet_prometheus, job.id)), "the job on its three nodes")
    assert before["findings"] == [], before["findings"]
    text = explain(cluster, fleet_prometheus, job.id).stdout
    assert text.splitlines()[-1] == "nothing abnormal", text
    assert f"job {job.id}: 3 node(s)" in text

    victim = cluster.nodes[1]
    done = run_fleet(cluster, fleet_argv("job-proc-kill.yaml", tmp_path, "--job", job.id,
                                         "--nodes", victim))
    assert done.returncode == 0, done.stdout + done.stderr
    report = fleet_report(tmp_path)
    assert report["landed"] == [victim], report["plan"]
    assert report["plan"]["skipped"] == {n: "not named by --nodes"
                                         for n in cluster.nodes if n != victim}
    [fault] = report["nodes"][victim]["faults"]
    [hit] = fault["targets"]
    assert hit.startswith(f"pid {job.pids[victim]} "), hit

    after = poll(lambda: (lambda a: a if a["findings"] else None)(
        answer(cluster, fleet_prometheus, job.id)), "a finding after the kill")
    first = after["findings"][0]
    assert (first["rule"], first["node"], first["labels"]) == \
        ("killed_by_signal", victim, {"signal": "KILL"}), after["findings"]
    assert first["value"] == 1 and first["since"] is not None and first["severity"] == 4
    assert "killed by SIGKILL" in first["says"]
    assert {f["node"] for f in after["findings"] if f["rule"] == "killed_by_signal"} == {victim}
    assert after["queries"] > 0
    text = explain(cluster, fleet_prometheus, job.id).stdout
    assert f"1. [4] {victim}: 1 process(es) of the job killed by SIGKILL" in text, text
