"""Cluster tier: a real Slurm cluster on this machine (testbed/slurm.py),
one tracehound agent per simulated node, `tracehound health` as the nodes'
real HealthCheckProgram. Needs root (namespaces, slurmd's cgroups, BPF).

Every node's agent listens on port 9560 of every address of the node's
network namespace, the node's bridge address being what the fleet's
Prometheus (on the host) scrapes, and serves its root-only local channel at
/run/tracehound/thtest-<node>.sock, which `tracehound health` (run by
slurmd with its bare environment) asks. All nodes share this kernel and
its /dev/kmsg, so each agent serves one GPU bus id of its own
(--gpu-bus-ids): a GPU error line naming it is that node's alone.
"""
import os
import secrets
import shutil
import tempfile

import pytest

from testbed import prometheus as prometheus_server
from testbed.agents import INSTANCE_PREFIX, Agents
from testbed.cli import tracehound_cmd
from testbed.slurm import Cluster

NODES = 3
HEALTH_INTERVAL_S = 2


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


def write_health_program(run_dir: str, extra: str = "") -> str:
    """The nodes' HealthCheckProgram: absolute paths only, as slurmd gives
    it no PATH and no SLURM_CONF; per-node state, verdict and log."""
    path = os.path.join(run_dir, "healthcheck")
    node = f'{run_dir}/"$SLURMD_NODENAME"'
    with open(path, "w") as f:
        f.write("#!/bin/sh\n"
                f"exec {tracehound_cmd()[0]} health --slurm-conf {run_dir}/slurm.conf "
                f"--instance {INSTANCE_PREFIX}\"$SLURMD_NODENAME\" "
                f"--state-file {node}/health.json --textfile {node}/health.prom "
                f"--timeout 2 {extra}>>{node}/health.log 2>&1\n")
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
    agents = Agents.with_unseen_gpus(cluster)
    try:
        cluster.start_seconds = cluster.up(before_slurmd=agents.start_all, timeout=90)
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
