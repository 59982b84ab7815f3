"""`tracehound explain JOB` against the real Slurm cluster: three node agents
scraped by a real Prometheus, a real three-node job, and a fault the chaos
engine injects on one of its nodes through Slurm.

- before the fault the job is found on its three nodes with nothing abnormal;
- after one of its processes is killed on one node, the kill is the first
  finding, on that node, with its evidence and since when; the other nodes
  have none; a GPU error on a second node ranks below it, and a rank stopped
  for a while on the third between them (as bad as the kill, but later);
  each node's own agent, asked on the node, names its own;
- a fatal XID on one of a job's nodes: the XID and the node's unfitness (the
  condition `tracehound health` drains on, which it does) on that node, in
  fleet and in node mode;
- a job whose ranks pass data round a ring over TCP: packets lost on one
  node's link make that node the job's retransmitting one (the node's own
  count: the job's sockets have no cgroup v2 of their own to count by);
- a job whose ranks all write: one rank's writes throttled on its disk
  (v1 blkio, as Slurm's cgroup/v1 plugin leaves the job no cgroup v2 of
  its own) makes that node the job's slow one, and the throttle's rollback
  puts the rank back where it was.
"""
import json
import secrets
import shutil
import subprocess
import tempfile
import time

import pytest

from testbed.agents import FATAL_XID_WINDOW_S
from tests.cluster.test_fleet_chaos import cluster, jobs  # noqa: F401  (fixtures)
from tests.cluster.test_fleet_chaos import fleet_argv, fleet_report, run_fleet
from tests.cluster.test_health import WAIT_S, ours, xid_line
from tests.cluster.test_job_io import poll
from tests.conftest import tracehound_cmd
from tests.kernel.test_gpu_kmsg import write_kmsg
from tracehound.clients import prometheus
from tracehound.host.procs import proc_cgroups
from tracehound.chaos.faults.io_space import mount_of

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

# a rank of a ring: listens on its node's address, connects to the next
# node's, says its pid once both are up, then sends 32 KiB every 0.02 s and
# drains what the previous rank sends. argv: dir, port, node=address...
RING = ("import os, socket, sys, threading, time\n"
        "me = os.uname().nodename\n"
        "addr = dict(a.split('=') for a in sys.argv[3:])\n"
        "order = [a.split('=')[0] for a in sys.argv[3:]]\n"
        "nxt = order[(order.index(me) + 1) % len(order)]\n"
        "port = int(sys.argv[2])\n"
        "server = socket.create_server((addr[me], port))\n"
        "def drain():\n"
        "    conn, _ = server.accept()\n"
        "    while conn.recv(1 << 16):\n"
        "        pass\n"
        "threading.Thread(target=drain, daemon=True).start()\n"
        "while True:\n"
        "    try:\n"
        "        out = socket.create_connection((addr[nxt], port), timeout=5)\n"
        "        break\n"
        "    except OSError:\n"
        "        time.sleep(0.1)\n"
        "out.settimeout(None)\n"
        "open(os.path.join(sys.argv[1], me), 'w').write(str(os.getpid()))\n"
        "block = b'x' * (1 << 15)\n"
        "while True:\n"
        "    out.sendall(block)\n"
        "    time.sleep(0.02)\n")


def explain(cluster, url: str, job_id: str, *extra: str, env=None) -> subprocess.CompletedProcess:
    """Over the job's life, as Slurm says (the default: no --window)."""
    return subprocess.run([*tracehound_cmd(), "explain", job_id, "--prometheus", url, *extra],
                          env=env or cluster.env(), capture_output=True, text=True, timeout=60)


def own(answer: dict) -> list:
    """The findings of the job's own series: a GPU's XID is its node's, and
    an earlier test's XID on a node this job also runs on is rightly shown."""
    return [f for f in answer["findings"] if f["rule"] != "gpu_xid"]


def on_node(cluster, job_id: str, node: str, *extra: str) -> dict:
    """`tracehound explain JOB` run on NODE inside the job's allocation:
    the node's own agent at its default address."""
    done = subprocess.run(["srun", f"--jobid={job_id}", "--overlap", f"--nodelist={node}",
                           "--nodes=1", "--ntasks=1", *tracehound_cmd(), "explain", job_id,
                           *extra],
                          env=cluster.env(), capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    return json.loads(done.stdout)


def answer(cluster, url: str, job_id: str, env=None) -> dict:
    done = explain(cluster, url, job_id, "--json", env=env)
    assert done.returncode in (0, 3), done.stdout + done.stderr
    got = json.loads(done.stdout)
    # 3: nothing judged yet (the job's first series not scraped yet)
    assert done.returncode == (0 if got["nodes"] else 3), done.stdout + done.stderr
    return got


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
    assert first["value"] == 1 and first["severity"] == 4
    # since: the kernel's time of the kill as the victim's agent stamped it,
    # not the scrape that counted it
    [stamp] = prometheus.query(fleet_prometheus, 'min(min_over_time(tracehound_process_last_'
                               f'exit_timestamp_seconds{{job_id="{job.id}",signal="KILL"}}[10m]))')
    assert first["since"] == stamp.value, (first["since"], stamp)
    assert "killed by SIGKILL" in first["says"]
    # the other nodes have no finding of any rule
    assert {f["node"] for f in after["findings"]} == {victim}, after["findings"]
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
        # nothing: an earlier test's XID on one of its nodes came before this job did
        assert writing["findings"] == [], writing["findings"]
        # each node's own agent counts the same writes the fleet's Prometheus has
        local = on_node(cluster, job.id, cluster.nodes[0], "--json")
        assert local["activity"][cluster.nodes[0]]["write_bytes"] > 0, local

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
        # range query's steps are a second apart over the job's short life)
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


def test_a_lossy_link_makes_its_node_the_jobs_retransmitting_one(
        cluster, fleet_prometheus, jobs, tmp_path):
    port = str(20000 + secrets.randbelow(20000))
    job = jobs(cluster.nodes, tmp_path, "thring", RING, port,
               *(f"{n}={cluster.state['addr_of'][n]}" for n in cluster.nodes))
    flowing = poll(lambda: (lambda a: a if a["nodes"] == cluster.nodes else None)(
        answer(cluster, fleet_prometheus, job.id)), "the ring on its three nodes")
    assert own(flowing) == [], flowing["findings"]

    victim = cluster.nodes[1]
    started = time.time()
    done = run_fleet(cluster, fleet_argv("node-net-loss.yaml", tmp_path, "--job", job.id,
                                         "--nodes", victim),
                     env={"CHAOS_HOLD_SECONDS": "8", "CHAOS_LOSS_PERCENT": "20"})
    assert done.returncode == 0, done.stdout + done.stderr
    report = fleet_report(tmp_path)
    assert report["landed"] == [victim], report["plan"]
    [fault] = report["nodes"][victim]["faults"]
    assert (fault["state"]["interface"], fault["state"]["netns"]) == ("eth0", None)
    [seen] = report["nodes"][victim]["detections"]
    assert seen["detected"], seen
    # the rollback left the node's interface as it found it
    qdiscs = subprocess.run(["nsenter", f"--net=/run/netns/{cluster.netns(victim)}", "tc",
                             "qdisc", "show", "dev", "eth0"],
                            capture_output=True, text=True, check=True).stdout
    assert "netem" not in qdiscs and "clsact" not in qdiscs, qdiscs

    after = poll(lambda: (lambda a: a if own(a) else None)(
        answer(cluster, fleet_prometheus, job.id)), "a finding after the loss")
    first = own(after)[0]
    assert (first["rule"], first["node"]) == ("node_tcp_retransmits", victim), after["findings"]
    assert first["outlier"] and first["since"] >= started - 2.5, (first, started)
    assert "TCP segments retransmitted by the node" in first["says"], first["says"]
    assert {f["node"] for f in own(after)} == {victim}, after["findings"]
    assert all(n in job.pids and job.state(n) in ("S", "R") for n in cluster.nodes)


def test_a_fatal_xid_makes_its_node_unfit_for_the_job_as_health_drains_it(
        cluster, fleet_prometheus, jobs, tmp_path):
    job = jobs(cluster.nodes, tmp_path, "thunfit")
    poll(lambda: answer(cluster, fleet_prometheus, job.id)["nodes"] == cluster.nodes or None,
         "the job on its three nodes")
    node = cluster.nodes[2]
    bus = cluster.agents.bus_ids[node]
    xid_after = time.time()
    done = run_fleet(cluster, fleet_argv("../gpu-xid.yaml", tmp_path, "--job", job.id,
                                         "--nodes", node),
                     env={"CHAOS_GPU_PCI": bus, "CHAOS_XID": "74"})
    assert done.returncode == 0, done.stdout + done.stderr
    # the node's own agent says so while the condition holds
    local = while_unfit(bus, xid_after, lambda: on_node(cluster, job.id, node, "--json"))
    assert [(f["rule"], f["labels"]) for f in local["findings"] if f["rule"] == "node_unfit"] \
        == [("node_unfit", {"pci_bus_id": bus, "condition": "recent_fatal_xid"})], local
    # and the same condition drains the node through Slurm (the job runs on)
    cluster.wait_nodes(lambda n: ours(n) == (n["NodeName"] == node), WAIT_S,
                       f"{node} drained by tracehound")

    def unfit(a):
        return [f for f in a["findings"] if f["rule"] == "node_unfit"]
    after = poll(lambda: (lambda a: a if unfit(a) else None)(
        answer(cluster, fleet_prometheus, job.id)), "the node unfit in the fleet's answer")
    [found] = unfit(after)
    assert (found["node"], found["labels"], found["severity"]) == \
        (node, {"pci_bus_id": bus, "condition": "recent_fatal_xid"}, 5), found
    assert found["says"] == f"GPU {bus}: fatal XID within the agent's window"
    xid = next(f for f in after["findings"] if f["rule"] == "gpu_xid"
               and f["labels"]["xid"] == "74")
    assert (xid["node"], xid["severity"]) == (node, 5)
    # both outrank whatever earlier tests left on the job's other nodes
    assert {(f["rule"], f["node"]) for f in after["findings"][:2]} == \
        {("node_unfit", node), ("gpu_xid", node)}, after["findings"]
    # the fatal XID's window passes: the node serves again, by itself
    cluster.wait_nodes(lambda n: "DRAIN" not in n["Flags"], WAIT_S, "resumed")


def while_unfit(bus: str, xid_after: float, ask):
    """ask(), answered while the GPU's fatal-XID condition surely held: an
    XID written after XID_AFTER holds it FATAL_XID_WINDOW_S. An answer that
    came later than that (a slow host) is asked again after a fresh XID."""
    for _ in range(3):
        got = ask()
        if time.time() < xid_after + FATAL_XID_WINDOW_S:
            return got
        xid_after = time.time()
        write_kmsg(xid_line(bus, 74))
    pytest.fail(f"no answer within a {FATAL_XID_WINDOW_S} s fatal-XID window, three times")


def xid_count(url: str, node: str, xid: int) -> float:
    got = prometheus.query(url, f'sum(tracehound_gpu_xid_errors_total{{node="{node}",'
                                f'xid="{xid}"}})')
    return got[0].value if got else 0.0


def logged_xid(cluster, url: str, node: str, xid: int) -> float:
    """An XID in NODE's GPU's kernel log, once Prometheus counted it; when."""
    before, at = xid_count(url, node, xid), time.time()
    write_kmsg(xid_line(cluster.agents.bus_ids[node], xid))
    poll(lambda: xid_count(url, node, xid) > before, f"XID {xid} on {node} in Prometheus")
    return at


def test_a_nodes_xid_before_the_job_came_or_after_it_left_is_not_the_jobs(
        cluster, fleet_prometheus, jobs, tmp_path):
    # before: an XID on one node (and, after the test above, a fatal one
    # that drained another node, which has served again since)
    first, second, third = cluster.nodes
    logged_xid(cluster, fleet_prometheus, first, 94)
    job = jobs(cluster.nodes, tmp_path, "thclean")
    running = poll(lambda: (lambda a: a if a["nodes"] == cluster.nodes else None)(
        answer(cluster, fleet_prometheus, job.id)), "the job on its three nodes")
    assert running["findings"] == [] and (running["span_source"], running["running"]) == \
        ("slurm", True), running
    text = explain(cluster, fleet_prometheus, job.id).stdout
    assert "to now (as Slurm says)" in text.splitlines()[0] and \
        text.splitlines()[-1] == "nothing abnormal", text

    # after: the job ended; scancel's TERM to every rank is how it ended, not
    # what went wrong (once every node's exits are scraped: an agent exports
    # them as it retires the job's cgroups)
    job.end()
    ended = poll(lambda: (lambda a: a if a["ended_by"] else None)(
        answer(cluster, fleet_prometheus, job.id)), "the job's end on every node")
    assert (ended["span_source"], ended["running"], ended["nodes"]) == \
        ("slurm", False, cluster.nodes), ended
    assert ended["ended_by"] == "SIGTERM to its processes in its last moments (Slurm: " \
        "CANCELLED)", ended
    # then an XID on another of its nodes, past the scrape that holds the
    # job's last moments (Slurm's whole-second end, one 1 s scrape after it)
    poll(lambda: time.time() > ended["end"] + 2, "a scrape past the job's end")
    logged_xid(cluster, fleet_prometheus, second, 94)
    ended = answer(cluster, fleet_prometheus, job.id)
    assert ended["findings"] == [], ended["findings"]

    # where Slurm cannot say (no squeue or sacct here: the job is read from
    # its series), once its series say it ended (the agents export a removed
    # cgroup's counters once more at their retirement: the last of them, not
    # the first gap, is the end)
    blind_to_slurm = {**cluster.env(), "PATH": str(tmp_path / "no-slurm")}
    poll(lambda: (lambda a: a if not a["running"] else None)(
        answer(cluster, fleet_prometheus, job.id, env=blind_to_slurm)), "the job's series ended")
    late = logged_xid(cluster, fleet_prometheus, third, 94)
    series = answer(cluster, fleet_prometheus, job.id, env=blind_to_slurm)
    assert (series["span_source"], series["nodes"]) == ("series", cluster.nodes), series
    assert series["end"] <= late, (series, late)
    assert abs(series["start"] - ended["start"]) < 60, series
    assert [f for f in series["findings"] if f["rule"] in ("gpu_xid", "node_unfit")
            and f["node"] == third] == [], series["findings"]
