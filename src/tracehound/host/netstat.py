"""The node's own TCP counters, from /proc/net/snmp.

The file is per network namespace (it is /proc/self/net/snmp): the agent
reads the counters of the namespace it runs in, which on a node is the
node's. They count every socket, those of no job's cgroup included: with
Slurm's cgroup/v1 plugin on a hybrid host, a job's sockets sit at the v2
root and only the node's counters can show that its link loses packets.

The kernel writes the file, one header line and one value line per
protocol; it is still read bounded and parsed without trusting its shape.
"""
from __future__ import annotations

SNMP = "/proc/net/snmp"
MAX_BYTES = 64 << 10
# /proc/net/snmp field -> the name the collector uses
FIELDS = {"RetransSegs": "retransmitted", "OutSegs": "sent", "InSegs": "received"}


def parse_tcp(text: str) -> dict[str, int]:
    """{"retransmitted": n, "sent": n, "received": n} from the Tcp: lines;
    the fields present and well formed only."""
    rows = [line.split()[1:] for line in text.splitlines() if line.startswith("Tcp:")]
    if len(rows) < 2 or len(rows[0]) != len(rows[1]):
        return {}
    out = {}
    for name, value in zip(rows[0], rows[1]):
        if name in FIELDS and value.isascii() and value.isdigit():
            out[FIELDS[name]] = int(value)
    return out


def tcp_counters(path: str = SNMP) -> dict[str, int]:
    """The agent's namespace's TCP counters; {} where the file is missing."""
    try:
        with open(path, "rb") as f:
            text = f.read(MAX_BYTES).decode("ascii", "replace")
    except OSError:
        return {}
    return parse_tcp(text)
