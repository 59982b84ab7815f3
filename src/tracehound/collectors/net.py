"""TCP health per cgroup -> Prometheus metric families, at scrape time: the
net probe's kernel counters, and socket state from a sock_diag scan."""
from __future__ import annotations

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from ..attribution.owners import Owners
from ..attribution.workload import WORKLOAD_LABELS
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


class NetCollector:
    """prometheus_client collector over a started NetProbe (None when the
    kernel refused it: the socket state is still exported) and a SockDiag."""

    name = "net"

    def __init__(self, probe, sockdiag, owners: Owners):
        self.probe = probe
        self.sockdiag = sockdiag
        self.owners = owners

    def collect(self):
        self.owners.new_scrape()
        counted, gone = {}, set()
        if self.probe is not None and self.probe.available:
            counted = self.probe.counters()
            yield from self._counters(counted)
            # counters of removed cgroups were exported above for the last time
            gone = {cgid for cgid in counted if not self.owners.alive(cgid)}
            if gone:
                self.probe.retire(gone)
        scan = self.sockdiag.scan()
        yield from self._sockets(scan)
        self.owners.retain(self.name, (set(counted) - gone) | set(scan.cgroups), gone)
        yield from self._health(scan)

    def _counters(self, counted: dict[int, dict[str, int]]):
        active = {name.removeprefix("net.") for name in self.probe.modes()}
        per_owner: dict[tuple, dict[str, int]] = {}
        for cgid, values in counted.items():
            labels = self.owners.labels(cgid)
            if not self.owners.in_scope(labels[0]):     # another node's (--cgroup-scope)
                continue
            sums = per_owner.setdefault(labels, {})
            for name, n in values.items():
                sums[name] = sums.get(name, 0) + n
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
