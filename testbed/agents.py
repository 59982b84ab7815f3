"""One tracehound agent per node of the Slurm cluster (testbed/slurm.py), each
started in its node's network namespace, as the cluster test tier and
bench/explain run them."""
import glob
import os
import secrets
import shutil
import signal
import subprocess
import time

import pytest

from testbed.cli import tracehound_cmd
from testbed.slurm import Cluster

# a fatal XID keeps its node unfit this long: long enough for a job to be
# placed while the node is drained, short enough to see it come back
FATAL_XID_WINDOW_S = 20
# each node's agent is instance <prefix><node>: its local channel is
# /run/tracehound/<prefix><node>.sock, where the node's health check asks
INSTANCE_PREFIX = "thtest-"


def stop(proc: subprocess.Popen) -> None:
    """TERM, then KILL after 20 s; a process already gone (or None) is left be."""
    if proc is None or proc.poll() is not None:
        return
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


class Agents:
    """One agent per node, started in the node's network namespace."""

    def __init__(self, cluster: Cluster, bus_ids: dict, extra: tuple = ()):
        self.cluster = cluster
        self.bus_ids = bus_ids
        self.extra = tuple(extra)       # more `tracehound run` flags for every agent
        self.procs: dict[str, subprocess.Popen] = {}

    @classmethod
    def with_unseen_gpus(cls, cluster: Cluster, extra: tuple = ()) -> "Agents":
        """Agents whose GPUs sit in a PCI domain no machine has, new for every
        run: no line an earlier run left in the kernel log names them (an
        XID 79 would keep a fixed bus id's GPU lost from the start)."""
        domain = 0x1000 + secrets.randbelow(0xe000)
        return cls(cluster, {n: f"{domain:04x}:{i:02x}:00.0"
                             for i, n in enumerate(cluster.nodes, 1)}, extra)

    def start_all(self, _cluster: Cluster | None = None) -> None:
        """Every node's agent, then wait for each (a Cluster.up hook)."""
        for node in self.cluster.nodes:
            self.start(node)
        for node in self.cluster.nodes:
            self.wait_started(node)

    def instance(self, node: str) -> str:
        return f"{INSTANCE_PREFIX}{node}"

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
                 "--cgroup-key", "freezer", "--cgroup-scope", f"/slurm_{node}", *self.extra],
                stdout=out, stderr=subprocess.STDOUT)

    def wait_started(self, node: str, since: int = 0, timeout: float = 90) -> None:
        deadline = time.monotonic() + timeout
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
        stop(self.procs.get(node))

    def stop_all(self) -> None:
        """Every agent at once: TERM to all, then wait for each."""
        running = [p for p in self.procs.values() if p.poll() is None]
        for proc in running:
            proc.send_signal(signal.SIGTERM)
        for proc in running:
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()

    def restart_all(self) -> None:
        since = {n: os.path.getsize(self.log(n)) for n in self.cluster.nodes}
        # a few at a time: twenty agents starting at once beside other work
        # take minutes on a 2-CPU host
        nodes = self.cluster.nodes
        for i in range(0, len(nodes), 5):
            for node in nodes[i:i + 5]:
                self.start(node)
            for node in nodes[i:i + 5]:
                self.wait_started(node, since[node], timeout=240)

    def forget(self) -> None:
        """Their lock files and state directories end with the session."""
        for node in self.bus_ids:
            name = self.instance(node)
            for path in glob.glob(f"/run/tracehound/{name}.lock"):
                os.unlink(path)
            shutil.rmtree(f"/var/lib/tracehound/instances/{name}", ignore_errors=True)
