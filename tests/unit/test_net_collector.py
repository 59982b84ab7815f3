"""The net collector over a stub probe and a stub socket scan: families,
labels, counters of removed cgroups exported once then retired; and the
probe's declared map layout against the built object."""

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from tracehound.attribution.cgroups import CgroupResolver
from tracehound.attribution.owners import Owners
from tracehound.attribution.resolver import WorkloadResolver
from tracehound.collectors.net import NetCollector
from tracehound.host.sockdiag import Scan, TcpSocket

TRAINER = "/system.slice/trainer.service"
OTHER = "/system.slice/other.service"


class StubProbe:
    available = True

    def __init__(self, counters, hooks=("retransmit", "connect", "reset"), full=0):
        self._counters = counters
        self.hooks = hooks
        self.full = full
        self.retired = []

    def counters(self):
        return {k: dict(v) for k, v in self._counters.items()}

    def drops(self):
        return {"counters_full": self.full}

    def retire(self, ids):
        self.retired.append(set(ids))
        for cgid in ids:
            self._counters.pop(cgid, None)

    def modes(self):
        return {f"net.{h}": "tp_btf" for h in self.hooks}


class StubSockets:
    def __init__(self, sockets=(), truncated=False):
        self.sockets = list(sockets)
        self.truncated = truncated
        self.truncated_scans = 0

    def scan(self):
        s = Scan(truncated=self.truncated)
        for sock in self.sockets:
            s.add(sock)
        self.truncated_scans += self.truncated
        return s


@pytest.fixture
def tree(tmp_path):
    root = tmp_path / "cg"
    for path in (TRAINER, OTHER):
        (root / path.lstrip("/")).mkdir(parents=True)
    owners = Owners(CgroupResolver(str(root)),
                    WorkloadResolver(job_id_source=None, pod_source=None))
    ids = {p: (root / p.lstrip("/")).stat().st_ino for p in (TRAINER, OTHER)}
    return root, owners, ids


def counts(retransmits=0, connect_failures=0, resets_received=0):
    return {"retransmits": retransmits, "connect_failures": connect_failures,
            "resets_received": resets_received}


def scrape(collector) -> dict:
    """{(sample name, frozenset of non-empty labels): value}"""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)
    out = {}
    for fam in text_string_to_metric_families(generate_latest(registry).decode()):
        for s in fam.samples:
            labels = frozenset((k, v) for k, v in s.labels.items() if v)
            out[(s.name, labels)] = s.value
    return out


def owner(path, **extra):
    unit = path.rsplit("/", 1)[1]
    return frozenset({"cgroup": path, "workload": "systemd", "unit": unit, **extra}.items())


def test_counters_and_socket_gauges_carry_cgroup_and_workload_labels(tree):
    _, owners, ids = tree
    probe = StubProbe({ids[TRAINER]: counts(7, 2, 1), ids[OTHER]: counts()})
    sockets = StubSockets([TcpSocket(ids[TRAINER], 1000, 100, 40, 3, 0),
                           TcpSocket(ids[TRAINER], 3000, 200, 60, 0, 2),
                           TcpSocket(ids[TRAINER], 0, 0, 0, 0, 0)])
    m = scrape(NetCollector(probe, sockets, owners))
    t = owner(TRAINER)
    assert m[("tracehound_net_tcp_retransmits_total", t)] == 7
    assert m[("tracehound_net_tcp_connect_failures_total", t)] == 2
    assert m[("tracehound_net_tcp_resets_received_total", t)] == 1
    assert m[("tracehound_net_tcp_retransmits_total", owner(OTHER))] == 0
    assert m[("tracehound_net_tcp_sockets", t)] == 3
    # RTT over the two sockets that have a sample, in seconds
    assert m[("tracehound_net_tcp_rtt_seconds", t | {("stat", "mean")})] == pytest.approx(0.002)
    assert m[("tracehound_net_tcp_rtt_seconds", t | {("stat", "max")})] == pytest.approx(0.003)
    assert m[("tracehound_net_tcp_socket_bytes", t | {("direction", "sent")})] == 300
    assert m[("tracehound_net_tcp_socket_bytes", t | {("direction", "received")})] == 100
    assert m[("tracehound_net_tcp_socket_retransmits", t)] == 3
    assert m[("tracehound_net_tcp_sockets_backing_off", t)] == 1
    assert ("tracehound_net_tcp_sockets", owner(OTHER)) not in m     # no socket there
    assert m[("tracehound_net_drops_total", frozenset({("reason", "counters_full")}))] == 0
    assert m[("tracehound_net_sockdiag_sockets", frozenset())] == 3
    assert m[("tracehound_net_sockdiag_truncated_scans_total", frozenset())] == 0
    assert probe.retired == []


def test_a_removed_cgroups_counters_leave_on_the_schedule_and_are_exported_once(tree):
    """A scrape only reads; the retirement, on the agent's schedule, takes
    the counters out of the kernel table, named, and the next scrape
    exports them one last time."""
    root, owners, ids = tree
    probe = StubProbe({ids[TRAINER]: counts(5), ids[OTHER]: counts(1)})
    collector = NetCollector(probe, StubSockets(), owners)
    scrape(collector)
    (root / TRAINER.lstrip("/")).rmdir()
    scrape(collector)
    assert probe.retired == []                  # a scrape retires nothing
    assert collector.retire_removed() == 1      # no scrape needed for the table to shrink
    assert probe.retired == [{ids[TRAINER]}]
    owners.prune()                              # the turn's pruning: the name is still held
    last = scrape(collector)
    assert last[("tracehound_net_tcp_retransmits_total", owner(TRAINER))] == 5
    after = scrape(collector)
    assert not any(labels == owner(TRAINER) for _, labels in after)
    assert after[("tracehound_net_tcp_retransmits_total", owner(OTHER))] == 1
    # nothing refers to it any more: the schedule's pruning forgets its path
    owners.prune()
    assert owners.path(ids[TRAINER]) == f"unknown:{ids[TRAINER]}"


def test_a_live_socket_keeps_a_removed_cgroups_labels(tree):
    root, owners, ids = tree
    gone = ids[TRAINER]
    collector = NetCollector(StubProbe({gone: counts(1)}),
                             StubSockets([TcpSocket(gone, 5, 1, 1, 0, 0)]), owners)
    scrape(collector)
    (root / TRAINER.lstrip("/")).rmdir()
    scrape(collector)
    m = scrape(collector)
    assert m[("tracehound_net_tcp_sockets", owner(TRAINER))] == 1


def test_a_missing_hook_leaves_its_family_out_and_the_probe_may_be_absent(tree):
    _, owners, ids = tree
    probe = StubProbe({ids[TRAINER]: counts(1, 1, 0)}, hooks=("retransmit", "connect"), full=4)
    m = scrape(NetCollector(probe, StubSockets(), owners))
    names = {n for n, _ in m}
    assert "tracehound_net_tcp_retransmits_total" in names
    assert "tracehound_net_tcp_resets_received_total" not in names
    assert m[("tracehound_net_drops_total", frozenset({("reason", "counters_full")}))] == 4
    # no BPF at all: the socket state is still there
    sockets = StubSockets([TcpSocket(ids[OTHER], 10, 1, 2, 0, 0)], truncated=True)
    m = scrape(NetCollector(None, sockets, owners))
    assert m[("tracehound_net_tcp_sockets", owner(OTHER))] == 1
    assert m[("tracehound_net_sockdiag_truncated_scans_total", frozenset())] == 1
    assert not any(n.startswith("tracehound_net_tcp_retransmits") for n, _ in m)


def test_two_ids_with_one_path_make_one_series(tree):
    _, owners, ids = tree
    # a second id with the same labels: a removed and a recreated cgroup
    real_labels = owners.labels
    owners.labels = lambda cgid: real_labels(ids[TRAINER] if cgid == 999 else cgid)
    sockets = StubSockets([TcpSocket(ids[TRAINER], 100, 1, 1, 0, 0),
                           TcpSocket(999, 300, 1, 1, 0, 0)])
    m = scrape(NetCollector(StubProbe({}), sockets, owners))
    t = owner(TRAINER)
    assert m[("tracehound_net_tcp_sockets", t)] == 2
    assert m[("tracehound_net_tcp_rtt_seconds", t | {("stat", "mean")})] == pytest.approx(0.0002)
    assert m[("tracehound_net_tcp_rtt_seconds", t | {("stat", "max")})] == pytest.approx(0.0003)


# --- net.h against the built object ---------------------------------------------------


SNMP = ("Ip: Forwarding DefaultTTL\nIp: 1 64\n"
        "Tcp: RtoAlgorithm ActiveOpens InSegs OutSegs RetransSegs InErrs\n"
        "Tcp: 1 12 900 800 17 0\n"
        "Udp: InDatagrams\nUdp: 4\n")


def test_the_nodes_tcp_counters_come_from_its_snmp_file_whatever_the_cgroup(tree, tmp_path):
    _, owners, _ = tree
    snmp = tmp_path / "snmp"
    snmp.write_text(SNMP)
    m = scrape(NetCollector(None, StubSockets(), owners, snmp=str(snmp)))
    assert m[("tracehound_net_node_tcp_retransmitted_segments_total", frozenset())] == 17
    assert m[("tracehound_net_node_tcp_sent_segments_total", frozenset())] == 800


@pytest.mark.parametrize("text", [
    "",                                                     # nothing
    "Tcp: OutSegs RetransSegs\n",                           # a header without values
    "Tcp: OutSegs RetransSegs\nTcp: 5\n",                   # a short value line
    "Tcp: OutSegs RetransSegs\nTcp: -1 x\n",                # values that are not counts
    "Tcp: OutSegs RetransSegs\nTcp: \u0663 \u0664\n",        # digits, but not ASCII ones
])
def test_a_snmp_file_of_another_shape_gives_no_node_series_and_no_error(tree, tmp_path, text):
    _, owners, _ = tree
    snmp = tmp_path / "snmp"
    snmp.write_text(text)
    m = scrape(NetCollector(None, StubSockets(), owners, snmp=str(snmp)))
    assert not [k for k in m if k[0].startswith("tracehound_net_node_")]
    assert m[("tracehound_net_sockdiag_sockets", frozenset())] == 0


def test_the_agents_own_namespace_counters_are_read_from_proc():
    from tracehound.host import netstat
    counted = netstat.tcp_counters()
    assert set(counted) == {"retransmitted", "sent", "received"}, counted
