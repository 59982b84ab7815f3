"""Fleet chaos rules: the node draw and its blast radius, the fleet journal's
reading, the per-instance detection query, the report's spread, the
Kubernetes Jobs and the command's usage errors. The launch itself runs
against the real Slurm cluster (tests/cluster/test_fleet_chaos.py)."""
import os
import types

import pytest
import yaml

from tracehound import cli
from tracehound.chaos.faults import targets
from tracehound.chaos.fleet import journal as fleet_journal
from tracehound.chaos.fleet import kubernetes, plan, report
from tracehound.chaos.fleet.slurm import Job, NodeState


def fake_cluster(states: dict, jobs: dict | None = None):
    """A Slurm client answering from a dict: the rules, not a daemon."""
    return types.SimpleNamespace(
        default_partition=lambda: "batch",
        partition_nodes=lambda p: [NodeState(n, s) for n, s in sorted(states.items())],
        hostnames=lambda text: text.split(","),
        job=lambda jid: (jobs or {})[jid])


def test_percent_rounds_down_and_takes_at_least_one_node():
    assert plan.how_many(3, None, 67) == 2
    assert plan.how_many(3, None, 66) == 1
    assert plan.how_many(3, None, 10) == 1
    assert plan.how_many(1000, None, 2.5) == 25
    assert plan.how_many(7, 4, None) == 4


def test_the_draw_is_the_same_for_a_seed_whatever_the_order():
    names = [f"n{i}" for i in range(20)]
    a = plan.draw(names, 5, 7)
    assert a == plan.draw(list(reversed(names)), 5, 7) and len(set(a)) == 5
    assert any(plan.draw(names, 5, s) != a for s in range(8, 12))


def test_only_idle_nodes_are_drawn_and_the_rest_say_why():
    cluster = fake_cluster({"n1": "idle", "n2": "drained", "n3": "idle", "n4": "allocated"})
    p = plan.choose(percent=100, seed=1, cluster=cluster)
    assert p.nodes == ["n1", "n3"] and p.partition_size == 4 and p.share == 0.5
    assert p.skipped == {"n2": "not idle (drained)", "n4": "not idle (allocated)"}
    with pytest.raises(plan.PlanError, match="has 2 idle node"):
        plan.choose(count=3, cluster=cluster)


def test_named_nodes_must_be_in_the_partition():
    cluster = fake_cluster({"n1": "idle", "n2": "idle"})
    assert plan.choose(nodes="n2,n1,n2", cluster=cluster).nodes == ["n2", "n1"]
    with pytest.raises(plan.PlanError, match="not in partition batch: x9"):
        plan.choose(nodes="n1,x9", cluster=cluster)


def test_a_job_plan_takes_the_jobs_nodes_and_its_partition():
    cluster = fake_cluster({f"n{i}": "mixed" for i in range(1, 5)},
                           {"42": Job("42", "RUNNING", "batch", ["n2", "n3"])})
    p = plan.choose(job_id="42", cluster=cluster)
    assert (p.how, p.nodes, p.job_id, p.share) == ("job", ["n2", "n3"], "42", 0.5)
    # --nodes narrows it to some of the job's nodes, and only to those
    p = plan.choose(job_id="42", nodes="n3", cluster=cluster)
    assert (p.nodes, p.skipped, p.share) == (["n3"], {"n2": "not named by --nodes"}, 0.25)
    with pytest.raises(plan.PlanError, match=r"job 42 does not run on n1 \(its nodes: n2, n3\)"):
        plan.choose(job_id="42", nodes="n3,n1", cluster=cluster)


def test_the_blast_radius_refuses_above_the_share_unless_allowed():
    p = plan.Plan("count", "batch", ["n1", "n2"], 10)
    plan.check_blast_radius(p, 0.2, allowed=False)
    with pytest.raises(plan.PlanError, match=r"2 of 10 nodes .*20%.*--max-share 10%"):
        plan.check_blast_radius(p, 0.1, allowed=False)
    plan.check_blast_radius(p, 0.1, allowed=True)
    assert p.waves(1) == [["n1"], ["n2"]] and p.waves(5) == [["n1", "n2"]]


def test_the_fleet_journal_names_the_nodes_left_to_recover():
    records = [{"event": "fleet-start"},
               {"event": "launch", "node": "n1", "job_id": None},
               {"event": "launch", "node": "n2", "job_id": "7"},
               {"event": "launch", "node": "n3", "job_id": "7; rm -rf /"},
               {"event": "launch", "node": "../etc", "job_id": None},
               {"event": "node-end", "node": "n1", "status": "completed"},
               {"event": "node-end", "node": "n3", "status": "completed (rollback failed)"},
               {"event": "recovered", "node": "n2", "ok": False}]
    assert fleet_journal.touched(records) == {"n2": "7", "n3": None}
    records.append({"event": "recovered", "node": "n2", "ok": True})
    assert fleet_journal.touched(records) == {"n3": None}


def test_a_live_launchers_journal_is_left_alone_and_a_dead_ones_recovered(tmp_path):
    base = str(tmp_path / "journal")
    live = fleet_journal.FleetJournal(base, "20261127T100000-0000aaaa")
    live.launch("n1", None)
    dead = fleet_journal.FleetJournal(base, "20261127T100001-0000bbbb")
    dead.start("t", "/x.yaml", {})
    dead.launch("n2", "5")
    os.close(dead._fd)          # its launcher died: the lock goes with it
    runs = fleet_journal.dead_runs(base, print)
    assert [(r.run_id, r.nodes) for r in runs] == [("20261127T100001-0000bbbb", {"n2": "5"})]
    assert fleet_journal.node_journal(base, runs[0].run_id, "n2").endswith(
        "fleet/20261127T100001-0000bbbb/n2")
    with pytest.raises(Exception):
        fleet_journal.node_journal(base, runs[0].run_id, "../n2")
    live.close("completed")


def test_the_detection_query_is_scoped_to_one_instance():
    assert report.with_matcher('m{a="b"}', 'node=~"n1"') == 'm{a="b",node=~"n1"}'
    assert report.with_matcher("m", 'node=~"n1"') == 'm{node=~"n1"}'
    assert report.with_matcher("sum(m)", "x") is None
    assert report.node_matcher("instance", "gpu-1") == 'instance=~"gpu\\\\-1([.:].*)?"'
    fault = {"fault": "proc.kill", "arguments": {"cgroup": "/x", "signal": "KILL"},
             "state": {"procs": [[9, 1, "p", "/"]], "job_id": "12"}}
    promql, predicate = report.instance_promql(fault, "node", "n2")
    assert predicate == "> 0"
    assert 'tracehound_process_exits_total{job_id="12",reason="signal",signal="KILL",' \
           'node=~"n2([.:].*)?"}' in promql
    assert "cgroup" not in promql


def test_first_held_is_the_first_point_after_the_fault_that_meets_the_predicate():
    pts = [(9.0, 5.0), (10.0, 0.0), (11.0, float("nan")), (12.0, 1.0)]
    assert report.first_held(pts, 10.0, "> 0") == 12.0
    assert report.first_held(pts, 13.0, "> 0") is None


def test_the_summary_counts_a_missed_node_as_a_gap_not_an_average():
    def node(agent, prom):
        return {"faults": [{"fault": "proc.kill", "action": "k", "applied_wall": 1.0}],
                "detections": [{"action": "k", "detected": agent is not None,
                                "mttd_seconds": agent, "tracehound_signal": True}],
                "prometheus": [{"action": "k", "detected": prom is not None,
                                "mttd_seconds": prom}]}
    [row] = report.summarize({"a": node(0.1, 1.0), "b": node(0.3, 2.0), "c": node(None, None)})
    assert row["landed"] == 3
    assert row["agent"] == {"asked": 3, "detected": 2, "rate": 0.667, "mttd_p50": 0.1,
                            "mttd_p95": 0.3, "mttd_max": 0.3}
    assert row["prometheus"]["detected"] == 2 and row["prometheus"]["mttd_max"] == 2.0


def test_kubernetes_gets_one_pinned_privileged_job_per_node():
    docs = kubernetes.manifests("title: x\n", "x.yaml", ["gpu-1", "gpu-2"], "img:1",
                                "20261127T100000-0000aaaa", allow_code=True)
    config, *jobs = docs
    assert config["kind"] == "ConfigMap" and config["data"] == {"x.yaml": "title: x\n"}
    assert [j["metadata"]["labels"]["tracehound.io/node"] for j in jobs] == ["gpu-1", "gpu-2"]
    pod = jobs[0]["spec"]["template"]["spec"]
    term = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert term["nodeSelectorTerms"][0]["matchExpressions"][0]["values"] == ["gpu-1"]
    assert pod["hostPID"] and pod["hostNetwork"] and pod["restartPolicy"] == "Never"
    [c] = pod["containers"]
    assert c["securityContext"]["privileged"] and "--allow-code" in c["command"]
    assert "/var/lib/tracehound/chaos/fleet/20261127T100000-0000aaaa/gpu-1" in c["command"]
    assert yaml.safe_load(yaml.safe_dump_all(docs).split("---")[1])["kind"] == "Job"
    with pytest.raises(ValueError, match="not a node name"):
        kubernetes.manifests("", "x.yaml", ["a b"], "img", "r", False)


@pytest.mark.parametrize("extra, why", [
    ([], "give exactly one of --nodes, --count, --percent, --job"),
    (["--count", "2", "--percent", "50"], "(got --count, --percent)"),
    (["--job", "4", "--partition", "p"], "--job takes the job's own nodes"),
    (["--job", "4", "--nodes", "a", "--count", "1"], "(got --count, --job)"),
    (["--count", "1", "--abort-when", "up == 0"], "--abort-when needs --prometheus"),
    (["--count", "1", "--max-share", "0"], "--max-share is a percentage"),
    (["--nodes", "a", "--kubernetes", "--slurm"], "--slurm or --kubernetes, not both"),
])
def test_fleet_usage_errors_launch_nothing(extra, why, capsys, tmp_path):
    exp = os.path.join(os.path.dirname(__file__), "..", "..", "examples", "fleet",
                       "job-proc-stop.yaml")
    code = cli.main(["chaos", "run", exp, *(["--slurm"] if "--slurm" not in extra else []),
                     "--journal", str(tmp_path / "j"), *extra])
    assert code == 2 and why in capsys.readouterr().err
    assert not (tmp_path / "j").exists()


def test_kubernetes_without_kubectl_applies_nothing_and_says_so(capsys, monkeypatch):
    monkeypatch.setenv("PATH", "/nonexistent")
    exp = os.path.join(os.path.dirname(__file__), "..", "..", "examples", "fleet",
                       "job-proc-stop.yaml")
    assert cli.main(["chaos", "run", exp, "--kubernetes", "--yes", "--nodes", "a"]) == 1
    assert "kubectl not found: --dry-run prints the Jobs" in capsys.readouterr().err


def test_kubernetes_dry_run_prints_the_jobs(capsys):
    exp = os.path.join(os.path.dirname(__file__), "..", "..", "examples", "fleet",
                       "job-proc-stop.yaml")
    assert cli.main(["chaos", "run", exp, "--kubernetes", "--dry-run", "--nodes", "a,b"]) == 0
    text = capsys.readouterr().out
    assert text.startswith("# tracehound chaos: one Job per node; untested")
    kinds = [d["kind"] for d in yaml.safe_load_all(text) if d]
    assert kinds == ["ConfigMap", "Job", "Job"]


def test_a_job_target_is_this_nodes_processes_of_the_job_only(monkeypatch, tmp_path):
    paths = {10: {"freezer": "/slurm_n1/uid_0/job_5/step_0/task_0", "": "/"},
             11: {"freezer": "/slurm_n2/uid_0/job_5/step_0/task_0", "": "/"},   # other node
             12: {"freezer": "/slurm_n1/uid_0/job_5/step_1/task_0", "": "/"},   # our own step
             13: {"freezer": "/slurm_n1/uid_0/job_6/step_0/task_0", "": "/"},   # other job
             14: {"": "/system.slice/slurmstepd.scope/job_5/step_2/user/task_0"}}
    monkeypatch.setattr(targets, "proc_cgroups", lambda pid: paths.get(pid, {}))
    monkeypatch.setattr(targets, "all_pids", lambda: sorted(paths))
    # hierarchies whose directories are gone: nothing but the names decides
    monkeypatch.setattr(targets, "hierarchy_roots",
                        lambda: {"": str(tmp_path), "freezer": str(tmp_path)})
    monkeypatch.setattr(targets, "_stat_fields",
                        lambda pid: [str(pid), "python"] + ["0"] * 20)
    monkeypatch.setenv("SLURMD_NODENAME", "n1")
    monkeypatch.setenv("SLURM_JOB_ID", "5")
    monkeypatch.setenv("SLURM_STEP_ID", "1")
    assert targets.job_pids("5") == [10, 14]
    assert targets.slurm_job_of(11) == ("5", "0") and targets.slurm_job_of(11, "n1") is None


def test_a_dry_run_prints_the_plan_and_each_nodes_srun_line(monkeypatch, capsys, tmp_path):
    from tracehound.chaos.fleet import slurm
    monkeypatch.setattr(plan, "slurm", fake_cluster({"n1": "idle", "n2": "idle", "n3": "down"}))
    monkeypatch.setattr(slurm, "tool", lambda name: f"/usr/bin/{name}")
    exp = os.path.join(os.path.dirname(__file__), "..", "..", "examples", "fleet",
                       "proc-kill.yaml")
    code = cli.main(["chaos", "run", exp, "--slurm", "--count", "1", "--seed", "3",
                     "--max-share", "50", "--journal", str(tmp_path / "j"), "--dry-run"])
    text, errors = capsys.readouterr()
    assert code == 0, errors
    drawn = plan.draw(["n1", "n2"], 1, 3)[0]
    assert f"1 idle node(s) drawn with seed 3: {drawn} (1 of 3 in partition batch, 33%)" in text
    assert "dry run, nothing launched; each node runs:" in text
    assert "--exclusive --immediate=60 --partition=batch -- " in text
    assert "chaos run " in text and " --yes --journal " in text and "--allow-code" not in text
    assert not (tmp_path / "j").exists()



def test_a_step_is_found_by_its_own_exact_name_never_by_its_jobs(monkeypatch):
    # inside --jobid, squeue --name matches the *job's* name, so every step of
    # the user's job came back; the run's step is told apart by its own name
    from tracehound.chaos.fleet import slurm
    listing = ("18.0|user-training\n18.1|tracehound-chaos-R-n1\n18.2|tracehound-chaos-R-n1x\n"
               "18.extern|extern\n19.0|tracehound-chaos-R-n1\n")
    calls = []
    monkeypatch.setattr(slurm, "run", lambda argv: calls.append(argv) or listing)
    assert slurm.step_name("R", "n1") == "tracehound-chaos-R-n1"
    assert slurm.find_steps("tracehound-chaos-R-n1") == ["18.1", "19.0"]
    assert calls[-1] == ["squeue", "-h", "-s", "-o", "%i|%j"]
    slurm.signal_step("18.1")
    assert calls[-1] == ["scancel", "--signal=TERM", "--quiet", "18.1"]
    for bad in ("18", "18.extern", "18.1,18.0", "-1.0"):
        with pytest.raises(slurm.SlurmError, match="not a step id"):
            slurm.signal_step(bad)


def test_the_fleet_journal_keeps_each_launchs_step(tmp_path):
    records = [{"event": "launch", "node": "n1", "job_id": "18"},
               {"event": "step", "node": "n1", "step": "18.1"},
               {"event": "step", "node": "n2", "step": "18.0;rm"},
               {"event": "launch", "node": "n3", "job_id": "18"},
               {"event": "step", "node": "n3", "step": "18.2"},
               {"event": "launch", "node": "n3", "job_id": "18"}]   # relaunched: step unknown
    assert fleet_journal.steps(records) == {"n1": "18.1"}


def test_the_fleet_question_is_scoped_to_the_node_in_every_selector_and_spans_four_scrapes():
    fault = {"fault": "io.throttle", "arguments": {"cgroup": "/x", "wbps": 1000},
             "state": {"job_id": "16"}}
    promql, predicate = report.instance_promql(fault, "node", "n3")
    # the histogram's _sum and _count each carry the node: no other node averages in
    assert promql.count('node=~"n3([.:].*)?"') == 2 and predicate == "> 0.005"
    assert "[30s]" in promql
    assert report.widen(promql, 4 * 30.0).count("[120s]") == 2
    assert report.widen("rate(x[5m])", 120) == "rate(x[5m])"        # long enough already
    intervals = [({"node": "n3"}, 30.0), ({"node": "n30"}, 60.0), ({"node": "n3.lab:9560"}, 15.0)]
    assert report.node_interval(intervals, "node", "n3") == 30.0
    assert report.node_interval(intervals, "node", "n4") == 0.0


def test_prometheus_durations():
    from tracehound.clients.prometheus import duration_seconds
    assert [duration_seconds(t) for t in ("30s", "1m30s", "500ms", "2h", "", "30", "1x")] == \
        [30, 90, 0.5, 7200, None, None, None]
