"""Fleet chaos through the real Slurm cluster: `tracehound chaos run … --slurm`
launches the ordinary local run on the chosen nodes with srun, each node's
agent (scoped to its slurmd) judges, and a real Prometheus scraping the
three agents answers per instance in the fleet report.

- a share of the partition (--percent, seeded) lands on exactly the nodes
  drawn, each node's agent and Prometheus see each node's kill, the node
  not drawn shows nothing of it;
- --job hits only that job's processes on its nodes; a second job on the
  same nodes keeps running;
- --abort-when stops the fleet: no new node starts, the running one rolls
  back; so does Ctrl-C;
- a launcher and its nodes' runs killed mid-fault: `chaos recover --slurm`
  reaches exactly the nodes the fleet journal names and undoes the fault.
"""
import glob
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.cluster.test_job_io import poll
from tests.conftest import tracehound_cmd
from tracehound.clients import prometheus

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "fleet"
WAIT_S = 60
# a process of a job: says its pid, then waits for a signal
# the pid is written under another name and renamed: a reader never sees a
# file that is there but not yet (or not all) written
HOLD = ("import os, signal, sys\n"
        "path = os.path.join(sys.argv[1], os.uname().nodename)\n"
        "open(path + '.tmp', 'w').write(str(os.getpid()))\n"
        "os.rename(path + '.tmp', path)\n"
        "signal.pause()\n")


@pytest.fixture
def cluster(slurm_cluster):
    slurm_cluster.wait_nodes(lambda n: n["State"] == "IDLE" and "DRAIN" not in n["Flags"],
                             WAIT_S, "idle and fit")
    return slurm_cluster


def fleet_argv(experiment: str, tmp_path, *extra: str) -> list[str]:
    return [*tracehound_cmd(), "chaos", "run", str(EXAMPLES / experiment), "--slurm",
            "--journal", str(tmp_path / "journal"), "--report", str(tmp_path / "reports"),
            "--no-plot", "--max-share", "100", "--yes", *extra]


def run_fleet(cluster, argv: list[str], env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(argv, env={**cluster.env(), **(env or {})}, capture_output=True,
                          text=True, timeout=300)


def fleet_report(tmp_path) -> dict:
    [path] = glob.glob(str(tmp_path / "reports" / "fleet-*" / "fleet.json"))
    with open(path) as f:
        return json.load(f)


def job_ids(report: dict) -> dict[str, str]:
    """node -> the job its fault's targets belonged to."""
    return {node: f["state"]["job_id"] for node, info in report["nodes"].items()
            for f in info["faults"]}


class Job:
    """A real job of one task per node, each task running `script` (by
    default holding until signalled) with the job's directory and `args`."""

    def __init__(self, cluster, nodes: list[str], tmp_path, name: str, script: str = HOLD,
                 *args: str):
        self.dir = tmp_path / name
        self.dir.mkdir()
        self.nodes, self.env = nodes, cluster.env()
        self.proc = subprocess.Popen(
            ["srun", f"--nodelist={','.join(nodes)}", f"--nodes={len(nodes)}",
             f"--ntasks={len(nodes)}", "--ntasks-per-node=1", f"--job-name={name}",
             sys.executable, "-I", "-c", script, str(self.dir), *args],
            env=cluster.env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
            start_new_session=True)
        self.pids = poll(lambda: self._pids(), f"{name}'s tasks started",
                         lambda: self.proc.stderr.read1().decode() if self.proc.poll() else "")
        out = subprocess.run(["squeue", "-h", "-n", name, "-o", "%i"], env=cluster.env(),
                             capture_output=True, text=True, check=True).stdout.split()
        assert len(out) == 1, out
        self.id = out[0]

    def _pids(self):
        """Each node's task pid once every task has written its own."""
        got = {n: (self.dir / n).read_text() for n in self.nodes if (self.dir / n).exists()}
        pids = {n: int(p) for n, p in got.items() if p.strip()}
        return pids if len(pids) == len(self.nodes) else None

    def state(self, node: str) -> str | None:
        try:
            with open(f"/proc/{self.pids[node]}/stat") as f:
                return f.read().rsplit(")", 1)[1].split()[0]
        except FileNotFoundError:
            return None

    def end(self) -> None:
        subprocess.run(["scancel", self.id], env=self.env, capture_output=True, timeout=30)
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()


@pytest.fixture
def jobs(cluster):
    made = []
    yield lambda *a: made.append(Job(cluster, *a)) or made[-1]
    for job in made:
        job.end()


def test_abort_when_stops_new_nodes_and_rolls_back_the_running_one(
        cluster, fleet_prometheus, tmp_path):
    # first in this tier, before any test here kills a job's process: the
    # condition holds only once the run's own kill is counted.
    # A process killed in a job, counted in a series younger than 5 s:
    kills = 'tracehound_process_exits_total{signal="KILL",job_id!=""}'
    fresh_kill = f"count({kills} unless {kills} offset 5s) > 0"
    poll(lambda: not prometheus.query(fleet_prometheus, fresh_kill),
         "no kill of a job in the last 5 s (before the run)")
    done = run_fleet(cluster, fleet_argv(
        "proc-kill.yaml", tmp_path, "--nodes", ",".join(cluster.nodes), "--allow-code",
        "--prometheus", fleet_prometheus, "--node-label", "node",
        "--abort-when", fresh_kill, "--abort-interval", "0.5"),
        env={"CHAOS_HOLD_SECONDS": "120"})
    assert done.returncode == 1, done.stdout + done.stderr
    report = fleet_report(tmp_path)
    first, *rest = cluster.nodes
    assert report["status"] == "aborted" and "--abort-when" in report["stop_reason"]
    assert report["landed"] == [first], report["stop_reason"]
    info = report["nodes"][first]
    assert info["stopped"] and info["status"] == "interrupted", info
    assert info["faults"][0]["rolled_back"] == "done"
    for node in rest:
        assert report["nodes"][node]["status"] == "not landed"
        assert "never launched" in report["nodes"][node]["why"]


def test_ctrl_c_stops_the_fleet_and_the_node_rolls_back(cluster, tmp_path):
    node = cluster.nodes[1]
    launcher = subprocess.Popen(
        fleet_argv("proc-kill.yaml", tmp_path, "--nodes", node, "--allow-code"),
        env={**cluster.env(), "CHAOS_HOLD_SECONDS": "120"}, stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, text=True)
    journals = str(tmp_path / "journal" / "fleet" / "*" / node / "*.jsonl")
    poll(lambda: any('"event": "applied"' in Path(p).read_text() for p in glob.glob(journals)),
         "the node's fault applied")
    launcher.send_signal(signal.SIGINT)
    output = launcher.communicate(timeout=120)[0]
    assert launcher.returncode == 130, output
    assert "SIGINT received: no new node starts, running nodes roll back" in output
    report = fleet_report(tmp_path)
    info = report["nodes"][node]
    assert report["status"] == "interrupted" and info["stopped"] and not info["killed"]
    assert info["status"] == "interrupted" and info["faults"][0]["rolled_back"] == "done", info


def test_a_share_of_the_partition_lands_on_exactly_the_nodes_drawn(
        cluster, fleet_prometheus, tmp_path):
    # Which 2 of 3 a seed draws, pinned here (not asked of the code under
    # test): 20261127 the first two by name, 5 the last two.
    seed = 20261127
    ordered = sorted(cluster.nodes)
    drawn, other = ordered[:2], ordered[2]
    dry = run_fleet(cluster, fleet_argv("proc-kill.yaml", tmp_path, "--percent", "67",
                                        "--seed", "5", "--dry-run"))
    assert dry.returncode == 0, dry.stdout + dry.stderr
    assert f"drawn with seed 5: {', '.join(ordered[1:])} (2 of 3" in dry.stdout, dry.stdout
    done = run_fleet(cluster, fleet_argv(
        "proc-kill.yaml", tmp_path, "--percent", "67", "--seed", str(seed), "--allow-code",
        "--max-parallel", "2", "--prometheus", fleet_prometheus, "--node-label", "node"))
    assert done.returncode == 0, done.stdout + done.stderr
    report = fleet_report(tmp_path)
    assert report["plan"]["nodes"] == drawn and report["landed"] == drawn, report["plan"]
    assert report["plan"]["skipped"] == {other: "not drawn"}
    jobs_of = job_ids(report)
    assert set(jobs_of) == set(drawn) and len(set(jobs_of.values())) == 2, jobs_of
    for node in drawn:
        info = report["nodes"][node]
        assert info["status"] == "completed", info
        [fault] = info["faults"]
        assert fault["fault"] == "proc.kill" and fault["rolled_back"] == "done"
        [agent] = info["detections"]
        assert agent["detected"] and agent["mttd_seconds"] >= 0, agent
        [seen] = info["prometheus"]
        assert seen["detected"] and seen["mttd_seconds"] >= 0, seen
        assert f'node=~"{node}' in seen["query"] and f'job_id="{jobs_of[node]}"' in seen["query"]
    [row] = report["summary"]
    assert row["landed"] == 2 and row["agent"]["detected"] == 2
    assert row["prometheus"]["detected"] == 2 and row["prometheus"]["mttd_max"] is not None
    # every node's agent counted its own job's kill, and no other node's (the
    # series end with their cgroups: asked over the run's last minutes)
    for node in cluster.nodes:
        got = prometheus.query(fleet_prometheus, 'last_over_time(tracehound_process_exits_total'
                               '{node="%s",job_id=~"%s",signal="KILL"}[5m])'
                               % (node, "|".join(jobs_of.values())))
        assert {s.labels["job_id"] for s in got} == ({jobs_of[node]} if node in drawn else set())
    assert "landed on 2 of 2 node(s)" in done.stdout


def test_job_run_hits_only_that_jobs_processes_on_its_nodes(cluster, jobs, tmp_path):
    two = cluster.nodes[:2]
    target, bystander = jobs(two, tmp_path, "thfleet-target"), jobs(two, tmp_path, "thfleet-other")
    launcher = subprocess.Popen(
        fleet_argv("job-proc-stop.yaml", tmp_path, "--job", target.id, "--max-parallel", "2"),
        env={**cluster.env(), "CHAOS_HOLD_SECONDS": "2", "CHAOS_DETECT_TIMEOUT": "2"},
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    # while the fault is in: every process of the target job on its two
    # nodes is stopped, the other job's beside them are not
    poll(lambda: all(target.state(n) == "T" for n in two), "the target job stopped",
         lambda: {n: target.state(n) for n in two})
    assert [bystander.state(n) for n in two] == ["S", "S"]
    output = launcher.communicate(timeout=120)[0]
    # every node completed, and each node's agent saw the job's stopped
    # processes in the job's v1 cgroup (cgroup/v1 Slurm leaves them at the v2 root)
    assert launcher.returncode == 0, output
    report = fleet_report(tmp_path)
    assert report["plan"]["how"] == "job" and report["landed"] == two, output
    for node in two:
        info = report["nodes"][node]
        [fault] = info["faults"]
        assert fault["state"]["job_id"] == target.id and fault["rolled_back"] == "done"
        # this node's task of the job, nothing of its other node (the nodes share a kernel)
        [hit] = fault["targets"]
        assert hit.startswith(f"pid {target.pids[node]} "), fault["targets"]
        [agent] = info["detections"]
        assert agent["detected"] is True and "job id " + target.id in agent["note"], agent
        assert target.state(node) == "S" and bystander.state(node) == "S"   # thawed; untouched
    assert cluster.nodes[2] not in report["nodes"]
    assert glob.glob(str(tmp_path / "reports" / "fleet-*" / "nodes" / two[0] / "srun.log"))


def test_recover_reaches_the_nodes_a_dead_launcher_left_faulted(cluster, jobs, tmp_path):
    two = cluster.nodes[1:]
    target = jobs(two, tmp_path, "thfleet-frozen")
    launcher = subprocess.Popen(
        fleet_argv("job-proc-stop.yaml", tmp_path, "--job", target.id, "--max-parallel", "2"),
        env={**cluster.env(), "CHAOS_HOLD_SECONDS": "300"}, stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, start_new_session=True)
    poll(lambda: all(target.state(n) == "T" for n in two), "the target job stopped on both nodes")
    # the launcher and every node's run die without a rollback
    node_runs = [p for p in os.listdir("/proc") if p.isdigit() and _is_node_run(p, target.id)]
    launcher.kill()
    launcher.wait()
    for pid in node_runs:
        os.kill(int(pid), signal.SIGKILL)
    poll(lambda: not any(_is_node_run(p, target.id) for p in node_runs), "node runs gone")
    assert all(target.state(n) == "T" for n in two)
    journal = str(tmp_path / "journal")
    done = subprocess.run([*tracehound_cmd(), "chaos", "recover", "--slurm", "--journal", journal],
                          env=cluster.env(), capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    for node in two:
        assert f": {node}: recovered" in done.stdout, done.stdout
        assert target.state(node) in ("S", "R")
    assert cluster.nodes[0] not in done.stdout
    again = subprocess.run([*tracehound_cmd(), "chaos", "recover", "--slurm", "--journal",
                            journal], env=cluster.env(), capture_output=True, text=True,
                           timeout=120)
    assert again.returncode == 0 and "nothing to recover" in again.stdout, again.stdout


def _is_node_run(pid: str, job_id: str) -> bool:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            cmd = f.read().split(b"\0")
        with open(f"/proc/{pid}/environ", "rb") as f:
            env = f.read().split(b"\0")
    except OSError:
        return False
    return b"chaos" in cmd and b"run" in cmd and b"--slurm" not in cmd and \
        f"SLURM_JOB_ID={job_id}".encode() in env
