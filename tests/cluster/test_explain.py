"""`tracehound explain JOB` against the real Slurm cluster: three node agents
scraped by a real Prometheus, a real three-node job, and a fault the chaos
engine injects on one of its nodes through Slurm.

- before the fault the job is found on its three nodes with nothing abnormal;
- after one of its processes is killed on one node, the kill is the first
  finding, on that node, with its evidence and since when; the other nodes
  have none; a GPU error on a second node ranks below it, and a rank stopped
  for a while on the third between them (as bad as the kill, but later);
  each node's own agent, asked on the node, names its own;
- a job whose ranks all write: one rank's writes throttled on its disk
  (v1 blkio, as Slurm's cgroup/v1 plugin leaves the job no cgroup v2 of
  its own) makes that node the job's slow one, and the throttle's rollback
  puts the rank back where it was.
"""
import json
import shutil
import subprocess
import tempfile
import time

from tests.cluster.test_fleet_chaos import cluster, jobs  # noqa: F401  (fixtures)
from tests.cluster.test_fleet_chaos import fleet_argv, fleet_report, run_fleet
from tests.cluster.test_job_io import poll
from tests.conftest import tracehound_cmd
from tracehound.attribution.procs import proc_cgroups
from tracehound.chaos.faults.io import mount_of

# a rank that checkpoints: says its pid, then a direct 256 KiB write every
# 0.2 s into a 4 MiB file of its own under the directory it is given
WRITER = ("import mmap, os, sys, time\n"
          "node = os.uname().nodename\n"
          "fd = os.open(os.path.join(sys.argv[2], node), os.O_WRONLY | os.O_CREAT | os.O_DIRECT, "
          "0o600)\n"
          "block = mmap.mmap(-1, 1 << 18)\n"
          "block.write(b'x' * (1 << 18))\n"
          "open(os.path.join(sys.argv[1], node), 'w').write(str(os.getpid()))\n"
          "i = 0\n"
          "while True:\n"
          "    os.pwrite(fd, block, (i % 16) << 18)\n"
          "    i += 1\n"
          "    time.sleep(0.2)\n")


def explain(cluster, url: str, job_id: str, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run([*tracehound_cmd(), "explain", job_id, "--prometheus", url,
                           "--node-label", "node", "--window", "5m", *extra],
                          env=cluster.env(), capture_output=True, text=True, timeout=60)


def own(answer: dict) -> list:
    """The findings of the job's own series: a GPU's XID is its node's, and
    an earlier test's XID on a node this job also runs on is rightly shown."""
    return [f for f in answer["findings"] if f["rule"] != "gpu_xid"]


def on_node(cluster, job_id: str, node: str, *extra: str) -> dict:
    """`tracehound explain JOB` run on NODE inside the job's allocation:
    the node's own agent at its default address."""
    done = subprocess.run(["srun", f"--jobid={job_id}", "--overlap", f"--nodelist={node}",
                           "--nodes=1", "--ntasks=1", *tracehound_cmd(), "explain", job_id,
                           "--window", "5m", *extra],
                          env=cluster.env(), capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    return json.loads(done.stdout)


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

    # then a GPU error on another of its nodes: the node's, so the job's too,
    # ranked below the kill (an XID the catalog calls an application error)
    gpu_node = cluster.nodes[0]
    bus_id = cluster.agents.bus_ids[gpu_node]
    done = run_fleet(cluster, fleet_argv("../gpu-xid.yaml", tmp_path / "xid", "--job", job.id,
                                         "--nodes", gpu_node),
                     env={"CHAOS_GPU_PCI": bus_id, "CHAOS_XID": "94"})
    assert done.returncode == 0, done.stdout + done.stderr
    both = poll(lambda: (lambda a: a if len(a["findings"]) > 1 else None)(
        answer(cluster, fleet_prometheus, job.id)), "a second finding after the XID")
    assert [(f["rule"], f["node"]) for f in both["findings"]] == \
        [("killed_by_signal", victim), ("gpu_xid", gpu_node)], both["findings"]
    xid = both["findings"][1]
    assert xid["labels"] == {"pci_bus_id": bus_id, "xid": "94"} and xid["severity"] == 3
    assert xid["action"].startswith("XID 94 (contained memory error): restart"), xid["action"]

    # node mode: each node's own agent, asked on the node inside the job's
    # allocation, without Prometheus; the third node has nothing
    quiet = next(n for n in cluster.nodes if n not in (victim, gpu_node))
    for node, rules in ((victim, ["killed_by_signal"]), (gpu_node, ["gpu_xid"]), (quiet, [])):
        local = on_node(cluster, job.id, node, "--json")
        assert local["mode"] == "node" and local["nodes"] == [node], local
        assert [f["rule"] for f in local["findings"]] == rules, (node, local["findings"])
        assert all(f["node"] == node for f in local["findings"])

    # then the third node's rank stopped for a while and resumed: the job's
    # processes are read in its v1 cgroups (the v2 tree has them at the root)
    done = run_fleet(cluster, fleet_argv("job-proc-stop.yaml", tmp_path / "stop", "--job",
                                         job.id, "--nodes", quiet),
                     env={"CHAOS_HOLD_SECONDS": "3"})
    assert done.returncode == 0, done.stdout + done.stderr
    three = poll(lambda: (lambda a: a if len(a["findings"]) > 2 else None)(
        answer(cluster, fleet_prometheus, job.id)), "a third finding after the stop")
    assert [(f["rule"], f["node"]) for f in three["findings"]] == \
        [("killed_by_signal", victim), ("stopped_processes", quiet), ("gpu_xid", gpu_node)]
    assert three["findings"][1]["value"] == 1
    assert job.state(quiet) in ("S", "R")       # resumed by the rollback


def test_a_throttled_rank_is_the_jobs_slow_node_and_gets_its_cgroup_back(
        cluster, fleet_prometheus, jobs, tmp_path):
    data = tempfile.mkdtemp(prefix="thexplain-", dir="/var/tmp")     # a disk, not tmpfs
    try:
        job = jobs(cluster.nodes, tmp_path, "thslow", WRITER, data)
        writing = poll(lambda: (lambda a: a if all(
            a["activity"].get(n, {}).get("write_bytes", 0) > 0 for n in cluster.nodes)
            else None)(answer(cluster, fleet_prometheus, job.id)), "the job writing on 3 nodes")
        assert own(writing) == [], writing["findings"]

        victim = cluster.nodes[2]
        blkio_before = proc_cgroups(job.pids[victim])["blkio"]
        started = time.time()
        done = run_fleet(cluster, fleet_argv("job-io-throttle.yaml", tmp_path, "--job", job.id,
                                             "--nodes", victim),
                         env={"CHAOS_DATA_DIR": data, "CHAOS_HOLD_SECONDS": "5"})
        assert done.returncode == 0, done.stdout + done.stderr
        report = fleet_report(tmp_path)
        assert report["landed"] == [victim], report["plan"]
        [fault] = report["nodes"][victim]["faults"]
        assert fault["state"]["mode"] == "v1" and fault["state"]["job_id"] == job.id
        assert list(fault["state"]["moved"]) == [str(job.pids[victim])], fault["state"]
        # the rollback put the rank back in the blkio cgroup it came from
        assert proc_cgroups(job.pids[victim])["blkio"] == blkio_before
        assert job.state(victim) in ("S", "D", "R")

        after = poll(lambda: (lambda a: a if own(a) else None)(
            answer(cluster, fleet_prometheus, job.id)), "a finding after the throttle")
        first = own(after)[0]
        assert (first["rule"], first["node"], first["labels"]) == \
            ("slow_writes", victim, {"mountpoint": mount_of(data)}), after["findings"]
        # since it parted from the other nodes, not since it first wrote (the
        # range query's steps are 2.5 s apart over a 5 min window)
        assert first["outlier"] and first["since"] >= started - 2.5, (first, started)
        assert "the job's other nodes" in first["says"], first["says"]
        assert {f["node"] for f in own(after)} == {victim}, after["findings"]
        # the timeline: one scale for the three nodes' write latency, where
        # only the throttled rank reaches the top
        picture = tmp_path / "job.png"
        drawn = explain(cluster, fleet_prometheus, job.id, "--timeline", "--plot",
                        str(picture)).stdout.splitlines()
        assert picture.read_bytes()[:4] == b"\x89PNG"
        at = next(i for i, ln in enumerate(drawn) if ln.startswith("  write latency (top "))
        rows = {ln.split()[0]: ln.split("|")[1] for ln in drawn[at + 1:at + 4]}
        assert sorted(rows) == cluster.nodes, drawn
        assert [n for n, row in rows.items() if "█" in row] == [victim], drawn
    finally:
        shutil.rmtree(data, ignore_errors=True)
