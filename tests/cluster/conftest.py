"""Cluster tier: a real Slurm cluster on this machine (tests/cluster/slurm.py),
one tracehound agent per simulated node, `tracehound health` as the nodes'
real HealthCheckProgram. Needs root (namespaces, slurmd's cgroups, BPF).

Every node's agent listens on port 9560 of every address of the node's
network namespace: 127.0.0.1:9560 is the default URL of `tracehound
health`, which slurmd runs there with its bare environment, and the node's
bridge address is what the fleet's Prometheus (on the host) scrapes. All nodes share this kernel and
its /dev/kmsg, so each agent serves one GPU bus id of its own
(--gpu-bus-ids): a GPU error line naming it is that node's alone.
"""
import glob
import os
import secrets
import shutil
import subprocess
import tempfile
import time

import pytest

from tests import prometheus_server
from tests.conftest import tracehound_cmd
from tests.cluster.slurm import Cluster
from tests.kernel.test_fleet import stop as stop_process

NODES = 3
HEALTH_INTERVAL_S = 2
# a fatal XID keeps its node unfit this long: long enough for a job to be
# placed while the node is drained, short enough to see it come back
FATAL_XID_WINDOW_S = 20


def pytest_collection_modifyitems(config, items):
    # test_health.py last of this tier: its breaker test leaves a node drained for good
    at = [i for i, item in enumerate(items) if "tests/cluster" in str(item.fspath)]
    ordered = sorted((items[i] for i in at),
                     key=lambda item: item.fspath.basename == "test_health.py")
    for i, item in zip(at, ordered):
        items[i] = item
    for item in items:
        if "tests/cluster" in str(item.fspath):
            item.add_marker(pytest.mark.root)
            if os.geteuid() != 0:
                item.add_marker(pytest.mark.skip(
                    reason="needs root: namespaces, slurmd's cgroups, BPF"))


class Agents:
    """One agent per node, started in the node's network namespace."""

    def __init__(self, cluster: Cluster, bus_ids: dict):
        self.cluster = cluster
        self.bus_ids = bus_ids
        self.procs: dict[str, subprocess.Popen] = {}

    def instance(self, node: str) -> str:
        return f"thtest-{node}"

    def log(self, node: str) -> str:
        return os.path.join(self.cluster.node_dir(node), "agent.log")

    def start(self, node: str) -> None:
        out = open(self.log(node), "a")
        with out:
            self.procs[node] = subprocess.Popen(
                ["nsenter", f"--net=/run/netns/{self.cluster.netns(node)}", "--",
                 *tracehound_cmd(), "run", "--listen", "0.0.0.0:9560",
                 "--instance", self.instance(node), "--gpu-bus-ids", self.bus_ids[node],
                 "--gpu-fatal-xid-window", str(FATAL_XID_WINDOW_S),
                 # the nodes share this kernel: each agent exports its slurmd's jobs only
                 "--cgroup-key", "freezer", "--cgroup-scope", f"/slurm_{node}"],
                stdout=out, stderr=subprocess.STDOUT)

    def wait_started(self, node: str, since: int = 0) -> None:
        deadline = time.monotonic() + 90
        text = ""
        while time.monotonic() < deadline:
            with open(self.log(node)) as f:
                text = f.read()[since:]
            if "tracehound: gpu:" in text:      # the last start-up line
                return
            if self.procs[node].poll() is not None:
                break
            time.sleep(0.2)
        pytest.fail(f"agent of {node} did not start:\n{text}")

    def restart(self, node: str) -> None:
        since = os.path.getsize(self.log(node))
        self.start(node)
        self.wait_started(node, since)

    def stop(self, node: str) -> None:
        stop_process(self.procs.get(node))

    def forget(self) -> None:
        """Their lock files and state directories end with the session."""
        for node in self.bus_ids:
            name = self.instance(node)
            for path in glob.glob(f"/run/tracehound/{name}.lock"):
                os.unlink(path)
            shutil.rmtree(f"/var/lib/tracehound/instances/{name}", ignore_errors=True)


def write_health_program(run_dir: str) -> str:
    """The nodes' HealthCheckProgram: absolute paths only, as slurmd gives
    it no PATH and no SLURM_CONF; per-node state, verdict and log."""
    path = os.path.join(run_dir, "healthcheck")
    node = f'{run_dir}/"$SLURMD_NODENAME"'
    with open(path, "w") as f:
        f.write("#!/bin/sh\n"
                f"exec {tracehound_cmd()[0]} health --slurm-conf {run_dir}/slurm.conf "
                f"--state-file {node}/health.json --textfile {node}/health.prom "
                f"--timeout 2 >>{node}/health.log 2>&1\n")
    os.chmod(path, 0o755)
    return path


@pytest.fixture(scope="session")
def slurm_cluster():
    for tool in ("ip", "nsenter", "unshare", "munged", "slurmctld", "slurmd", "srun"):
        if shutil.which(tool) is None:
            pytest.fail(f"{tool} not installed: scripts/install --dev installs it")
    run_dir = tempfile.mkdtemp(prefix="thtest-slurm-")
    token = secrets.token_hex(2)
    cluster = Cluster(run_dir, NODES, prefix=f"t{token}n",
                      health_program=write_health_program(run_dir),
                      health_interval=HEALTH_INTERVAL_S)
    # a PCI domain no machine has, new for every session: earlier lines in
    # the kernel log never name these GPUs
    domain = 0x1000 + secrets.randbelow(0xe000)
    agents = Agents(cluster, {n: f"{domain:04x}:{0x10 * i:02x}:00.0"
                              for i, n in enumerate(cluster.nodes, 1)})

    def start_agents(c):
        for node in c.nodes:
            agents.start(node)
        for node in c.nodes:
            agents.wait_started(node)
    try:
        cluster.start_seconds = cluster.up(before_slurmd=start_agents, timeout=90)
        cluster.agents = agents
        yield cluster
    finally:
        for node in list(agents.procs):
            agents.stop(node)
        cluster.down()
        agents.forget()
        shutil.rmtree(run_dir, ignore_errors=True)


@pytest.fixture(scope="session")
def fleet_prometheus(slurm_cluster):
    """A real Prometheus on the host scraping every node's agent at the
    node's bridge address each second, each target labelled node=<name>."""
    run_dir = tempfile.mkdtemp(prefix="thtest-fleetprom-")
    addr = slurm_cluster.state["addr_of"]
    config = {"global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
              "scrape_configs": [{
                  "job_name": "tracehound", "scrape_interval": "1s", "scrape_timeout": "1s",
                  "static_configs": [{"targets": [f"{addr[n]}:9560"], "labels": {"node": n}}
                                     for n in slurm_cluster.nodes]}]}
    try:
        with prometheus_server.serving(run_dir, config) as url:
            yield url
    finally:
        shutil.rmtree(run_dir, ignore_errors=True)
