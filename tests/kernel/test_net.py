"""The net subsystem on this kernel: real TCP between two network
namespaces joined by a veth, clients in fresh cgroups, packet loss from the
netfault classifier. The retransmits land on the lossy client's cgroup only,
a refused connect counts for its cgroup, and sock_diag finds the client's
socket under its cgroup id in the client's namespace."""
import json
import os
import signal
import subprocess
import sys
import time
import uuid

import pytest

from tracehound.attribution.cgroups import CgroupResolver
from tracehound.attribution.owners import Owners
from tracehound.attribution.resolver import WorkloadResolver
from tracehound.chaos.faults.tcbpf import NetfaultProgram
from tracehound.chaos.scaffold import delete_netns, make_netns_pair
from tracehound.collectors.net import NetCollector
from tracehound.config import AgentConfig
from tracehound.host import sockdiag
from tracehound.host.mounts import MountTable
from tracehound.errors import ProbeError
from tracehound.bpf import lifecycle
from tracehound.probes import net as net_mod
from tracehound.probes.net import NetProbe
from tracehound.subsystems.base import Context
from tracehound.subsystems.net import NetSubsystem

from .conftest import remove_cgroup

SERVER_ADDR, CLIENT_ADDR = "10.77.0.1", "10.77.0.2"
PORT, LOCAL_PORT, CLOSED_PORT = 5201, 5202, 5209
WAIT_S = 60          # a bound on waiting for the kernel, never a timing assert

SERVER = """
import socket, sys, threading
def drain(c):
    while c.recv(1 << 16):
        pass
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind((sys.argv[1], int(sys.argv[2])))
s.listen(16)
print("ready", flush=True)
while True:
    c, _ = s.accept()
    threading.Thread(target=drain, args=(c,), daemon=True).start()
"""

CLIENT = """
import socket, sys, time
c = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=60)
print("connected", flush=True)
chunk = b"x" * 16384
while True:
    c.sendall(chunk)
    time.sleep(0.005)
"""

CONNECT = """
import socket, sys
s = socket.socket()
try:
    s.connect((sys.argv[1], int(sys.argv[2])))
except ConnectionRefusedError:
    print("refused", flush=True)
"""


class Env:
    def __init__(self, cgroup_root):
        uid = uuid.uuid4().hex[:6]
        self.cgroup_root = cgroup_root
        self.server_ns, self.client_ns = f"thnet-{uid}-s", f"thnet-{uid}-c"
        self.server_if, self.client_if = f"thn{uid}s", f"thn{uid}c"
        self.cgroups: list[str] = []
        self.procs: list[subprocess.Popen] = []

    def cgroup(self) -> str:
        path = f"{self.cgroup_root}/thtest/net-{uuid.uuid4().hex[:10]}"
        os.makedirs(path)
        self.cgroups.append(path)
        return path

    def spawn(self, netns: str, cgroup: str | None, script: str, *args: str) -> subprocess.Popen:
        """A Python process in the namespace, and in the cgroup before it
        opens any socket; returns once it printed its first line. The cgroup
        is joined first: `ip netns exec` mounts a sysfs of the namespace's own,
        without the cgroup tree."""
        argv = ["ip", "netns", "exec", netns, sys.executable, "-c", script, *args]
        if cgroup:
            argv = ["sh", "-c", f'echo $$ > "{cgroup}/cgroup.procs" && exec "$@"', "sh", *argv]
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.procs.append(proc)
        line = proc.stdout.readline().strip()
        assert line, f"{script.split(chr(10))[1]}... exited: {proc.stderr.read()}"
        return proc

    def close(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGKILL)
            proc.wait(timeout=10)
        delete_netns([self.server_ns, self.client_ns])
        for path in self.cgroups:
            remove_cgroup(path)


def link_address(netns: str, ifname: str) -> str:
    out = subprocess.run(["ip", "-n", netns, "-j", "link", "show", "dev", ifname],
                         check=True, capture_output=True, text=True).stdout
    return json.loads(out)[0]["address"]


def link_neighbours(ns_a: str, if_a: str, addr_a: str, ns_b: str, if_b: str,
                    addr_b: str) -> None:
    """Each end knows the other's MAC address for good."""
    for ns, ifname, peer_addr, peer_ns, peer_if in ((ns_a, if_a, addr_b, ns_b, if_b),
                                                    (ns_b, if_b, addr_a, ns_a, if_a)):
        subprocess.run(["ip", "-n", ns, "neigh", "replace", peer_addr, "lladdr",
                        link_address(peer_ns, peer_if), "dev", ifname, "nud", "permanent"],
                       check=True)


@pytest.fixture
def env(cgroup_root):
    e = Env(cgroup_root)
    try:
        make_netns_pair(e.server_ns, e.client_ns, e.server_if, e.client_if,
                        f"{SERVER_ADDR}/24", f"{CLIENT_ADDR}/24")
        subprocess.run(["ip", "-n", e.client_ns, "link", "set", "lo", "up"], check=True)
        # fixed neighbours: the loss below drops ARP too, and a connect
        # whose three ARP requests were all lost fails with no route to host
        link_neighbours(e.server_ns, e.server_if, SERVER_ADDR, e.client_ns, e.client_if,
                        CLIENT_ADDR)
        yield e
    finally:
        e.close()


@pytest.fixture(params=net_mod.MODES)
def probe(request, monkeypatch):
    """The probe in each of its modes: tp_btf, and the raw_tp fallback."""
    monkeypatch.setattr(net_mod, "MODES", (request.param,))
    p = NetProbe().start()
    try:
        assert p.available, p.reason
        assert p.modes() == {f"net.{g}": request.param for g in net_mod.HOOKS}, p.missing()
        yield p
    finally:
        p.close()
    p.close()            # twice is fine


@pytest.fixture
def loss(env):
    """20 % of the client's outgoing packets lost on its veth."""
    prog = NetfaultProgram()
    try:
        prog.configure(20, 0)
        prog.attach(env.client_ns, env.client_if, "egress", 49100, 1)
        yield prog
    finally:
        prog.close()


def cgroup_id(path: str) -> int:
    return os.stat(path).st_ino


def wait_for(what: str, read, ok):
    deadline = time.monotonic() + WAIT_S
    while True:
        value = read()
        if ok(value):
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"{what}: still {value!r} after {WAIT_S} s")
        time.sleep(0.2)


def counter(probe, cgid: int, name: str) -> int:
    return probe.counters().get(cgid, {}).get(name, 0)


def test_retransmits_count_for_the_lossy_clients_cgroup_only(env, probe, loss):
    lossy, clean = env.cgroup(), env.cgroup()
    env.spawn(env.server_ns, None, SERVER, SERVER_ADDR, str(PORT))
    env.spawn(env.client_ns, None, SERVER, "127.0.0.1", str(LOCAL_PORT))
    env.spawn(env.client_ns, lossy, CLIENT, SERVER_ADDR, str(PORT))
    # the other cgroup sends as much, over the client namespace's loopback
    env.spawn(env.client_ns, clean, CLIENT, "127.0.0.1", str(LOCAL_PORT))
    first = wait_for("retransmits of the lossy cgroup",
                     lambda: counter(probe, cgroup_id(lossy), "retransmits"), lambda n: n > 0)
    wait_for("retransmits growing", lambda: counter(probe, cgroup_id(lossy), "retransmits"),
             lambda n: n > first)
    assert loss.counters()["packets_dropped"] > 0
    assert counter(probe, cgroup_id(clean), "retransmits") == 0
    assert counter(probe, cgroup_id(lossy), "connect_failures") == 0
    assert counter(probe, cgroup_id(clean), "connect_failures") == 0


def test_a_refused_connect_counts_a_failure_for_its_cgroup(env, probe, cgroup_root):
    refused, other = env.cgroup(), env.cgroup()
    env.spawn(env.server_ns, None, SERVER, SERVER_ADDR, str(PORT))
    env.spawn(env.client_ns, other, CLIENT, SERVER_ADDR, str(PORT))
    proc = env.spawn(env.client_ns, refused, CONNECT, SERVER_ADDR, str(CLOSED_PORT))
    proc.wait(timeout=30)
    cgid = cgroup_id(refused)
    assert wait_for("connect failures", lambda: counter(probe, cgid, "connect_failures"),
                    lambda n: n > 0) == 1
    # the refusal is a reset received in SYN_SENT
    assert counter(probe, cgid, "resets_received") == 1
    assert counter(probe, cgroup_id(other), "connect_failures") == 0
    # once the cgroup is gone, the agent's retirement takes the entry out of
    # the kernel table and the next scrape exports it once more, named
    owners = Owners(CgroupResolver(cgroup_root),
                    WorkloadResolver(job_id_source=None, pod_source=None))
    collector = NetCollector(probe, sockdiag.SockDiag(100000, reuse_s=0), owners)
    collector.retire_removed()
    assert cgid in probe.counters()             # alive: nothing retired
    owners.path(cgid)                           # named while it exists
    remove_cgroup(refused)
    assert collector.retire_removed() == 1
    assert cgid not in probe.counters()
    families = {f.name: f for f in collector.collect()}
    assert [s.value for s in families["tracehound_net_tcp_connect_failures"].samples
            if s.labels["cgroup"] == refused[len(cgroup_root):]] == [1]


def test_sockdiag_finds_the_clients_socket_in_its_cgroup_and_namespace(env, probe, cgroup_root):
    client = env.cgroup()
    env.spawn(env.server_ns, None, SERVER, SERVER_ADDR, str(PORT))
    env.spawn(env.client_ns, client, CLIENT, SERVER_ADDR, str(PORT))
    cgid = cgroup_id(client)

    def mine():
        scan = sockdiag.scan(100000, all_netns=True)
        assert not scan.truncated
        return scan.cgroups.get(cgid)
    first = wait_for("the client's socket", mine, lambda c: c is not None and c.bytes_acked > 0)
    assert first.sockets == 1 and first.rtt_sockets == 1 and first.rtt_max_us > 0
    wait_for("bytes acknowledged growing", mine,
             lambda c: c is not None and c.bytes_acked > first.bytes_acked)
    # the agent's own namespace does not hold it
    assert cgid not in sockdiag.scan(100000, all_netns=False).cgroups
    # the collector puts it under the cgroup's path
    owners = Owners(CgroupResolver(cgroup_root),
                    WorkloadResolver(job_id_source=None, pod_source=None))
    collector = NetCollector(probe, sockdiag.SockDiag(100000, reuse_s=0), owners)
    families = {f.name: f for f in collector.collect()}
    rel = client[len(cgroup_root):]
    socks = [s for s in families["tracehound_net_tcp_sockets"].samples
             if s.labels["cgroup"] == rel]
    assert [s.value for s in socks] == [1]
    rtt = {s.labels["stat"]: s.value for s in families["tracehound_net_tcp_rtt_seconds"].samples
           if s.labels["cgroup"] == rel}
    assert rtt["mean"] > 0 and rtt["max"] >= rtt["mean"]
    # the subsystem publishes the socket's bytes as the cgroup's progress
    ctx = Context(AgentConfig(), MountTable(), owners)
    subsystem = NetSubsystem(ctx)
    subsystem.start()
    try:
        assert subsystem.reason is None
        moved = wait_for("progress", lambda: ctx.progress.read()["net"].get(cgid, 0),
                         lambda n: n > 0)
        wait_for("progress moving", lambda: ctx.progress.read()["net"].get(cgid, 0),
                 lambda n: n != moved)
    finally:
        subsystem.close()
    assert "net" not in ctx.progress.names()


def test_a_hook_the_kernel_lacks_or_refuses_degrades_only_its_counter(env, monkeypatch):
    real_check = net_mod.tracepoint_check
    monkeypatch.setattr(net_mod, "tracepoint_check", lambda tp: net_mod.features.ModeCheck(
        False, "not in this kernel") if tp == "tcp_receive_reset" else real_check(tp))

    class Refusing(net_mod.BpfObject):
        def load(self):
            if self.programs["tb_tcp_retransmit_skb"].autoload:
                raise ProbeError("tb_tcp_retransmit_skb", "tp_btf/tcp_retransmit_skb",
                                 "load failed: Permission denied")
            super().load()
    monkeypatch.setattr(lifecycle, "BpfObject", Refusing)     # every probe opens through it
    with NetProbe() as probe:
        assert probe.modes() == {"net.retransmit": "raw_tp", "net.connect": "tp_btf"}
        assert "not in this kernel" in probe.missing()["net.reset"]
        refused = env.cgroup()
        env.spawn(env.client_ns, refused, CONNECT, SERVER_ADDR, str(CLOSED_PORT)).wait(30)
        assert wait_for("connect failures",
                        lambda: counter(probe, cgroup_id(refused), "connect_failures"),
                        lambda n: n > 0) == 1
        assert counter(probe, cgroup_id(refused), "resets_received") == 0
