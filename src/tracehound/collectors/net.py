"""TCP health per cgroup -> Prometheus metric families, at scrape time: the
net probe's kernel counters, and socket state from a sock_diag scan."""
from __future__ import annotations

import threading

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from ..attribution.owners import Owners
from ..attribution.workload import WORKLOAD_LABELS
from ..host import netstat
from ..host.sockdiag import CgroupTcp, Scan

OWNER = ["cgroup", *WORKLOAD_LABELS]
# counter name in probes/net.py COUNTERS -> (hook group, family, help)
COUNTER_FAMILIES = {
    "retransmits": ("retransmit", "tracehound_net_tcp_retransmits",
                    "TCP segments retransmitted, by the socket's cgroup."),
    "connect_failures": ("connect", "tracehound_net_tcp_connect_failures",
                         "TCP connects that failed (SYN_SENT -> CLOSE: refused, timed out, "
                         "unreachable, or abandoned), by the socket's cgroup."),
    "resets_received": ("reset", "tracehound_net_tcp_resets_received",
                        "TCP resets received that reset a socket (a refused connect is one), "
                        "by the socket's cgroup."),
}

NODE_FAMILIES = {
    "retransmitted": "TCP segments retransmitted by every socket of the agent's network "
                     "namespace (the node's), whatever its cgroup (/proc/net/snmp RetransSegs).",
    "sent": "TCP segments sent by every socket of the agent's network namespace (the node's), "
            "whatever its cgroup (/proc/net/snmp OutSegs).",
}


class NetCollector:
    """prometheus_client collector over a started NetProbe (None when the
    kernel refused it: the socket state is still exported) and a SockDiag."""

    name = "net"

    def __init__(self, probe, sockdiag, owners: Owners, snmp: str = netstat.SNMP):
        self.probe = probe
        self.sockdiag = sockdiag
        self.owners = owners
        self.snmp = snmp
        # removed cgroups' last counters, by labels, until a scrape exports them
        self._final: dict[tuple, dict[str, int]] = {}
        self._lock = threading.Lock()

    def retire_removed(self) -> int:
        """Removed cgroups' counters leave the kernel table on the agent's
        schedule (subsystems/net.py), whether or not anyone scrapes; their
        last values wait, under their names, for the next scrape, which
        exports them once more. Returns how many cgroups went."""
        if self.probe is None or not self.probe.available:
            return 0
        self.owners.new_scrape()
        counted = self.probe.counters()
        gone = {cgid for cgid in counted if self.owners.removed(cgid)}
        with self._lock:
            for cgid in gone:
                # named before the pruning that follows this turn forgets it
                labels = self.owners.labels(cgid)
                if self.owners.in_scope(labels[0]):
                    _add(self._final, labels, counted[cgid])
        if gone:
            self.probe.retire(gone)
        self.owners.retain(self.name, set(counted) - gone, gone)
        return len(gone)

    def collect(self):
        """Reads the counters and a socket scan and exports them; changes nothing."""
        self.owners.new_scrape()
        if self.probe is not None and self.probe.available:
            with self._lock:
                final, self._final = self._final, {}
            yield from self._counters(self.probe.counters(), final)
        scan = self.sockdiag.scan()
        yield from self._sockets(scan)
        # sockets outlive their cgroups: their names are kept while they do
        self.owners.retain(self.name + "_sockets", scan.cgroups)
        yield from self._health(scan)
        yield from self._node()

    def _node(self):
        """The node's TCP counters, every socket's, whatever its cgroup."""
        counted = netstat.tcp_counters(self.snmp)
        for name, text in NODE_FAMILIES.items():
            if name in counted:
                fam = CounterMetricFamily(f"tracehound_net_node_tcp_{name}_segments", text)
                fam.add_metric([], counted[name])
                yield fam

    def _counters(self, counted: dict[int, dict[str, int]], final: dict[tuple, dict[str, int]]):
        active = {name.removeprefix("net.") for name in self.probe.modes()}
        per_owner: dict[tuple, dict[str, int]] = {}
        for labels, values in final.items():
            _add(per_owner, labels, values)
        for cgid, values in counted.items():
            if not self.owners.alive(cgid):
                continue        # removed: retired on the schedule, exported then
            labels = self.owners.labels(cgid)
            if not self.owners.in_scope(labels[0]):     # another node's (--cgroup-scope)
                continue
            _add(per_owner, labels, values)
        for name, (group, family, text) in COUNTER_FAMILIES.items():
            if group not in active:
                continue        # its hook is missing here: no series rather than zeros
            fam = CounterMetricFamily(family, text, labels=OWNER)
            for labels, sums in sorted(per_owner.items()):
                fam.add_metric(list(labels), sums.get(name, 0))
            yield fam

    def _sockets(self, scan: Scan):
        # ids of a removed and a recreated cgroup may share a path: one series
        per_owner: dict[tuple, CgroupTcp] = {}
        for cgid, c in scan.cgroups.items():
            labels = self.owners.labels(cgid)
            if not self.owners.in_scope(labels[0]):
                continue
            into = per_owner.get(labels)
            if into is None:
                per_owner[labels] = c
            else:
                per_owner[labels] = merged(into, c)
        owners = sorted(per_owner.items())
        sockets = GaugeMetricFamily("tracehound_net_tcp_sockets",
                                    "Established TCP sockets, by the socket's cgroup.",
                                    labels=OWNER)
        rtt = GaugeMetricFamily("tracehound_net_tcp_rtt_seconds",
                                "Smoothed round-trip time over the cgroup's established TCP "
                                "sockets that have a sample: their mean and the largest.",
                                labels=[*OWNER, "stat"])
        data = GaugeMetricFamily(
            "tracehound_net_tcp_socket_bytes",
            "Bytes over the cgroup's established TCP sockets (sent: acknowledged by the "
            "peer); falls when a socket closes.", labels=[*OWNER, "direction"])
        retrans = GaugeMetricFamily(
            "tracehound_net_tcp_socket_retransmits",
            "Retransmitted segments over the lifetime of the cgroup's established TCP "
            "sockets; falls when a socket closes.", labels=OWNER)
        backoff = GaugeMetricFamily(
            "tracehound_net_tcp_sockets_backing_off",
            "Established TCP sockets whose retransmission timer is backing off: the peer "
            "has not acknowledged data for at least one timeout.", labels=OWNER)
        for labels, c in owners:
            lv = list(labels)
            sockets.add_metric(lv, c.sockets)
            if c.rtt_sockets:
                rtt.add_metric([*lv, "mean"], c.rtt_mean_us / 1e6)
                rtt.add_metric([*lv, "max"], c.rtt_max_us / 1e6)
            data.add_metric([*lv, "sent"], c.bytes_acked)
            data.add_metric([*lv, "received"], c.bytes_received)
            retrans.add_metric(lv, c.total_retrans)
            backoff.add_metric(lv, c.backing_off)
        yield from (sockets, rtt, data, retrans, backoff)

    def _health(self, scan: Scan):
        drops = CounterMetricFamily(
            "tracehound_net_drops",
            "TCP counter updates the kernel could not record (counters_full: the "
            "per-cgroup table was full).", labels=["reason"])
        if self.probe is not None and self.probe.available:
            for reason, n in sorted(self.probe.drops().items()):
                drops.add_metric([reason], n)
        yield drops
        seen = GaugeMetricFamily("tracehound_net_sockdiag_sockets",
                                 "Established TCP sockets the last socket scan read.")
        seen.add_metric([], scan.sockets)
        yield seen
        truncated = CounterMetricFamily(
            "tracehound_net_sockdiag_truncated_scans",
            "Socket scans that stopped at the socket cap (--net-max-sockets): the socket "
            "gauges of that scrape leave sockets out.")
        truncated.add_metric([], getattr(self.sockdiag, "truncated_scans", 0))
        yield truncated


def merged(a: CgroupTcp, b: CgroupTcp) -> CgroupTcp:
    return CgroupTcp(a.sockets + b.sockets, a.rtt_sockets + b.rtt_sockets,
                     a.rtt_sum_us + b.rtt_sum_us, max(a.rtt_max_us, b.rtt_max_us),
                     a.bytes_acked + b.bytes_acked, a.bytes_received + b.bytes_received,
                     a.total_retrans + b.total_retrans, a.backing_off + b.backing_off)


def _add(into: dict[tuple, dict[str, int]], labels: tuple, values: dict[str, int]) -> None:
    sums = into.setdefault(labels, {})
    for name, n in values.items():
        sums[name] = sums.get(name, 0) + n
