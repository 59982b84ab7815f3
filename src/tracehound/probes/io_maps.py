"""io.h as Python sees it: the I/O probe's operations, histograms and the
byte layouts of its maps' keys and values (tests/unit/test_layouts.py checks
them against the BTF of the built io.bpf.o). No loader here: readers of the
counters' shape (the collector, `top`'s tables, benchmarks) import this
without libbpf.
"""
from __future__ import annotations

import array
import struct
from typing import NamedTuple

from ..bpf.layout import EnumLayout, Layout

# enum io_op and enum io_hist in io.h
OPS = ("read", "write", "open", "create", "unlink", "mkdir", "rmdir", "rename", "fsync")
# the ops whose ENOENT is counted apart from their errors (io.bpf.c account_in)
LOOKUP_OPS = OPS[OPS.index("open"):OPS.index("rename") + 1]
HISTS = ("read", "write", "fsync")
HIST_SLOTS = 32
KEY_DEV = 1                          # IO_KEY_DEV: mnt holds a device number
KEY_FOREIGN = 2                      # IO_KEY_FOREIGN: a user namespace owns the mount
# settings.tp_ops bits of the groups counted at syscall exit (io.h TP_*)
TP_BITS = {"copy": 1 << 16, "aio": 1 << 17}
# enum io_health, as the map label of the drops: which map was full, or
# (io_stats_reserve) only io_stats' slots kept for the node's own were left
HEALTH = ("io_stats", "io_start", "io_stats_reserve")
HEALTH_ENUM = ("stats_full", "start_full", "stats_reserve")
FSTYPE_LEN = 16
PATH_LEN = 256

OBJECT = "io"
IO_KEY = Layout("io_key", [("cgroup_id", "Q"), ("mnt", "I"), ("flags", "I")])
IO_STATS = Layout("io_stats", [
    ("owner", f"{IO_KEY.size}s"),
    ("bytes", "Q", 2), ("calls", "Q", len(OPS)), ("errors", "Q", len(OPS)),
    ("not_found", "Q", len(OPS)),
    ("lat_sum_ns", "Q", len(HISTS)), ("hist", "Q", len(HISTS) * HIST_SLOTS),
    ("cache_fill", "Q")])
# after the owner key every field of struct io_stats is a __u64: Python reads
# the counters as one flat array
COUNTERS_AT = IO_KEY.size
N_FIELDS = (IO_STATS.size - COUNTERS_AT) // 8
CACHE_FILL = N_FIELDS - 1            # index of cache_fill among the counters
LAYOUTS = (
    IO_KEY, IO_STATS,
    Layout("io_settings", [("agent_mnt_ns", "I"), ("tp_ops", "I"), ("timed_ops", "I"),
                           ("slots", "I"), ("sample_gap_ns", "I"), ("audit", "I"),
                           ("reserved", "I")]),
    Layout("io_sampler", [("last_ts", "Q"), ("timed", "Q"), ("tick", "Q"), ("task", "Q"),
                          ("since", "I"), ("interval", "I"), ("in_tick", "I"), ("pad", "I")]),
    Layout("fstype_name", [("name", f"{FSTYPE_LEN}s")]),
    Layout("mnt_lpm_key", [("prefixlen", "I"), ("path", f"{PATH_LEN}s")]),
    Layout("mnt_lpm_value", [("mnt_id", "I"), ("skip", "I")]),
    Layout("io_audit", [("hist", "Q", len(HISTS) * HIST_SLOTS), ("picked", "Q", len(HISTS))]),
    EnumLayout("io_op", OPS, "OP_", stop="OP_MAX"),
    EnumLayout("io_hist", HISTS, "HIST_", stop="HIST_MAX"),
    EnumLayout("io_health", HEALTH_ENUM, "HEALTH_", stop="HEALTH_MAX"),
)
KEY = IO_KEY.struct
SETTINGS = LAYOUTS[2].struct
SAMPLER = LAYOUTS[3]
SLOT = struct.Struct("=I")
U64 = struct.Struct("=Q")


class IoKey(NamedTuple):
    cgroup_id: int
    mnt: int        # a mount id, or a device number when flags & KEY_DEV
    flags: int


def decode_values(raw: bytes) -> array.array:
    """The counters of a struct io_stats as one flat array of u64, in the
    kernel's order."""
    a = array.array("Q")
    a.frombytes(raw[COUNTERS_AT:COUNTERS_AT + N_FIELDS * 8])
    return a


def timed_mask(latency: frozenset[str]) -> int:
    """settings.timed_ops: a bit per operation whose latency is measured."""
    return sum(1 << OPS.index(op) for op in latency)


# the operations each group counts (its bits in settings.tp_ops)
GROUP_OPS = {"read": ("read",), "write": ("write",), "fsync": ("fsync",),
             "open": ("open", "create"), "remove": ("unlink", "rmdir"),
             "mkdir": ("mkdir",), "rename": ("rename",)}


def op_mask(group: str) -> int:
    """The group's bits in settings.tp_ops (used in tracepoint mode)."""
    if group in TP_BITS:
        return TP_BITS[group]
    return sum(1 << OPS.index(op) for op in GROUP_OPS.get(group, ()))
