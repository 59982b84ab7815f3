"""`tracehound health` as the real HealthCheckProgram of a real Slurm
cluster: real GPU error lines in this kernel's log, a real agent per node,
slurmctld's view of the nodes as the only judge. Each test starts from
every node idle and fit and leaves it so, but the last (the breaker's)."""
import os
import subprocess
import time

import pytest

from testbed.agents import FATAL_XID_WINDOW_S
from testbed.slurm import ClusterError
from tests.kernel.test_gpu_kmsg import driver_form, write_kmsg

REASON_PREFIX = "tracehound:"
WAIT_S = 60


def xid_line(bus_id: str, xid: int) -> str:
    return f"NVRM: Xid ({driver_form(bus_id)}): {xid}, pid=4242, name=python, Channel 00000010"


def ours(info: dict) -> bool:
    return "DRAIN" in info["Flags"] and info.get("Reason", "").startswith(REASON_PREFIX)


def health_log(cluster, node: str) -> str:
    try:
        with open(os.path.join(cluster.node_dir(node), "health.log")) as f:
            return f.read()
    except FileNotFoundError:
        return ""


def wait_health_runs(cluster, node: str, text: str, runs: int = 2) -> None:
    """Until `runs` more health runs of `node` logged a line holding `text`."""
    before = health_log(cluster, node).count(text)
    deadline = time.monotonic() + WAIT_S
    while health_log(cluster, node).count(text) < before + runs:
        if time.monotonic() > deadline:
            pytest.fail(f"{node}: no {runs} health runs saying {text!r}:\n"
                        f"{health_log(cluster, node)[-2000:]}")
        time.sleep(0.2)


@pytest.fixture
def cluster(slurm_cluster):
    """Every node idle and not drained, as each test begins."""
    slurm_cluster.wait_nodes(lambda n: n["State"] == "IDLE" and "DRAIN" not in n["Flags"],
                             WAIT_S, "idle and fit")
    return slurm_cluster


def test_the_cluster_runs_jobs_on_every_node(cluster):
    out = subprocess.run(["srun", f"-N{len(cluster.nodes)}", "hostname"], env=cluster.env(),
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    # each slurmd in its UTS namespace: the job sees its node's name
    assert sorted(out.stdout.split()) == sorted(cluster.nodes)
    # Debian's multiple-slurmd build: each node's steps under slurm_<node>
    for node in cluster.nodes:
        assert os.path.isdir(f"/sys/fs/cgroup/freezer/slurm_{node}")


def test_a_fatal_xid_drains_its_node_which_jobs_avoid_until_it_clears(cluster):
    n1, others = cluster.nodes[0], cluster.nodes[1:]
    bus_id = cluster.agents.bus_ids[n1]
    # A job asked for while the node is drained lands on the other two. The
    # drain lasts the fatal XID's window: where the host was too slow for the
    # job to end within it (the node was back by then), it is tried again.
    for _ in range(3):
        write_kmsg(xid_line(bus_id, 74))
        info = cluster.wait_nodes(lambda n: ours(n) == (n["NodeName"] == n1), WAIT_S,
                                  f"{n1} drained by tracehound alone")
        assert info[n1]["Reason"].startswith(f"tracehound: XID 74 NVLink error ({bus_id})"), \
            info[n1]
        out = subprocess.run(["srun", "-N2", "hostname"], env=cluster.env(),
                             capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, out.stderr
        if ours(cluster.node_info()[n1]):       # drained from before the job to after it
            assert sorted(out.stdout.split()) == sorted(others)
            break
        cluster.wait_nodes(lambda n: "DRAIN" not in n["Flags"], WAIT_S, "resumed")
    else:
        pytest.fail(f"the node came back before the job ended, three times in a row "
                    f"({FATAL_XID_WINDOW_S} s windows)")
    # the fatal XID's window passes: the node serves again, by itself
    cluster.wait_nodes(lambda n: "DRAIN" not in n["Flags"], WAIT_S, "resumed")
    assert f"{n1}: fit; resumed" in health_log(cluster, n1)


def test_an_admins_drain_is_left_alone(cluster):
    n2 = cluster.nodes[1]
    cluster.scontrol("update", f"nodename={n2}", "state=drain", "reason=disk swap, ticket 42")
    try:
        # the node is fit: a drain of tracehound's own would be resumed
        wait_health_runs(cluster, n2, "drained by someone else (disk swap, ticket 42)")
        info = cluster.node_info()[n2]
        assert "DRAIN" in info["Flags"] and info["Reason"].startswith("disk swap, ticket 42")
    finally:
        cluster.scontrol("update", f"nodename={n2}", "state=resume")


def test_a_stopped_agent_drains_its_node_only_after_two_runs(cluster):
    n3 = cluster.nodes[2]
    cluster.agents.stop(n3)
    sock = f"/run/tracehound/{cluster.agents.instance(n3)}.sock"
    try:
        info = cluster.wait_nodes(lambda n: ours(n) == (n["NodeName"] == n3), WAIT_S,
                                  f"{n3} drained by tracehound alone")
        assert info[n3]["Reason"].startswith(
            f"tracehound: agent not answering: no agent socket at {sock} (agent not "
            "running)"), info[n3]
        # the run before it said so and left the node in service
        assert f"run 1 of 2 before agent_down" in health_log(cluster, n3)
    finally:
        cluster.agents.restart(n3)
    cluster.wait_nodes(lambda n: "DRAIN" not in n["Flags"], WAIT_S, "resumed")


def test_the_breaker_bounds_drains_when_every_node_fails(cluster):
    """Last: XID 79 (fallen off the bus) keeps its GPU lost for good. 10 %
    of three nodes, at least one: at no sample more than one node drained;
    the others refused, by the breaker or as common mode, whichever saw
    the crowd first, and no drain given back."""
    for node in cluster.nodes:
        write_kmsg(xid_line(cluster.agents.bus_ids[node], 79))
    deadline = time.monotonic() + WAIT_S
    first = None
    while True:
        info = cluster.node_info()
        drained = sorted(n for n, i in info.items() if ours(i))
        assert len(drained) <= 1, drained
        if first is None and drained:
            first = drained
        assert first is None or drained == first, f"{first} then {drained}"
        refused = {n for n in cluster.nodes if "drain refused:" in health_log(cluster, n)}
        if refused >= set(cluster.nodes) - set(drained) and \
                all(health_log(cluster, n).count("drain refused:") >= 2 for n in refused):
            break
        if time.monotonic() > deadline:
            raise ClusterError(f"drained {drained}, refused {sorted(refused)}")
        time.sleep(0.5)
    for node in drained:
        assert "XID 79 GPU fell off the bus" in info[node]["Reason"]
    for node in set(cluster.nodes) - set(drained):
        log = health_log(cluster, node)
        assert ("drain refused: breaker: partition batch has 1 of 3" in log
                or "drain refused: common mode: " in log and "for recent_fatal_xid" in log), log
        with open(os.path.join(cluster.node_dir(node), "health.prom")) as f:
            prom = f.read()
        assert "tracehound_health_breaker_refused 1" in prom
        assert 'tracehound_health_condition{condition="gpu_lost"} 1' in prom


def test_a_cluster_leaves_nothing_behind(tmp_path):
    """Up and down a second, one-node cluster beside the session's."""
    from testbed import network
    from testbed.slurm import Cluster
    run_dir = str(tmp_path / "run")
    c = Cluster(run_dir, nodes=1, prefix=f"t{os.getpid() % 10000}x")
    c.up(timeout=60)
    made = dict(c.state)
    assert all(c.running().values()) and len(made["pids"]) == 3
    assert c.up() == 0.0           # up again: already up, nothing started
    c.down()
    c.down()                       # again: nothing to do
    assert not os.path.exists(run_dir)
    for pid, exe in made["pids"].values():
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                assert exe.encode() not in f.read(), f"{exe} (pid {pid}) still runs"
        except FileNotFoundError:
            pass
    netns = subprocess.run(["ip", "netns"], capture_output=True, text=True).stdout
    assert not any(n in netns for n in made["netns"])
    links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
    assert not any(f" {name}:" in links or f" {name}@" in links for name in made["links"])
    assert made["subnet"] not in network.ip("-4", "route", "show").stdout
    assert not [d for d in os.listdir("/sys/fs/cgroup")
                if os.path.exists(f"/sys/fs/cgroup/{d}/slurm_{made['nodes'][0]}")]
