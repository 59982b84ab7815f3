"""Loader for net.bpf.o: TCP retransmits, failed connects and resets
received, counted per socket cgroup in the kernel.

Each hook is a group of its own: a kernel without one tracepoint (or one
that refuses its program) loses that counter only. A kernel that refuses
them all leaves the probe unavailable with a reason; it never stops the
agent. Nothing outside this module knows net.bpf.o's map names or layouts.
"""
from __future__ import annotations

import logging
import os
import struct
import threading
from dataclasses import dataclass

from .. import defaults
from ..bpf import features
from ..bpf.features import btf_tracepoint_check as tracepoint_check
from ..bpf.layout import EnumLayout, Layout
from ..bpf.lifecycle import OptionalProbe, open_loaded
from ..bpf.loader import BpfObject, Map
from . import object_path

log = logging.getLogger(__name__)

# enum net_counter and enum net_health in net.h
COUNTERS = ("retransmits", "connect_failures", "resets_received")
HEALTH = ("counters_full",)

# net.h as Python sees it; the layout test checks these against the BTF of
# the built net.bpf.o
OBJECT = "net"
NET_COUNTERS = Layout("net_counters", [("counts", "Q", len(COUNTERS))])
LAYOUTS = (
    NET_COUNTERS,
    EnumLayout("net_counter", COUNTERS, "NC_", stop="NC_MAX"),
    EnumLayout("net_health", HEALTH, "NH_", stop="NH_MAX"),
)
KEY = struct.Struct("=Q")
VALUE = NET_COUNTERS.struct
SLOT = struct.Struct("=I")
U64 = struct.Struct("=Q")

MODES = ("tp_btf", "raw_tp")
PREFIX = {"tp_btf": "tb", "raw_tp": "rt"}
# group -> the tracepoint its program sits on
HOOKS = {
    "retransmit": "tcp_retransmit_skb",
    "connect": "inet_sock_set_state",
    "reset": "tcp_receive_reset",
}
def net_groups() -> tuple[features.HookGroup, ...]:
    def hook(mode: str, tracepoint: str) -> features.HookMode:
        return features.HookMode((f"{PREFIX[mode]}_{tracepoint}",),
                                 (lambda: tracepoint_check(tracepoint),),
                                 f"{mode}/{tracepoint}")
    return tuple(features.HookGroup(name, tuple((mode, hook(mode, tp)) for mode in MODES))
                 for name, tp in HOOKS.items())


@dataclass
class NetProbeConfig:
    max_cgroups: int = defaults.NET_MAX_CGROUPS    # capacity of the per-cgroup table


class NetProbe(OptionalProbe):
    """The net probe; start() never raises for a refusing kernel: `available`
    is then False and `reason` says why."""

    name = "net"

    def __init__(self, config: NetProbeConfig | None = None):
        self.config = config or NetProbeConfig()
        self.obj: BpfObject | None = None
        self.plans: list[features.GroupPlan] = []
        self._maps: dict[str, Map] = {}
        self._lock = threading.Lock()      # scrapes read while the agent may close

    # -- lifecycle --------------------------------------------------------
    def _start(self) -> None:
        self.plans = []
        # tracepoints only: every --hook-mode uses the same hooks here
        self.plans = features.load_with_fallback("net", net_groups(), "auto",
                                                 self._load_and_attach, every_group=False)

    def _load_and_attach(self, plans: list[features.GroupPlan]) -> None:
        self.close()
        obj, maps = open_loaded(
            object_path(OBJECT), programs=features.wanted_programs(plans),
            maps=("net_counters", "net_health"),
            prepare=lambda obj: obj.map("net_counters").set_max_entries(self.config.max_cgroups))
        with self._lock:
            self.obj, self._maps = obj, maps

    def close(self) -> None:
        with self._lock:
            self._maps = {}
            if self.obj is not None:
                self.obj.close()
                self.obj = None

    # -- reading ------------------------------------------------------------
    def counters(self) -> dict[int, dict[str, int]]:
        """cgroup id -> {counter name: count} (COUNTERS), for every cgroup
        the kernel has counted something for."""
        with self._lock:
            if not self._maps:
                return {}
            items = self._maps["net_counters"].items()
        return {KEY.unpack_from(k)[0]: dict(zip(COUNTERS, VALUE.unpack_from(v)))
                for k, v in items}

    def drops(self) -> dict[str, int]:
        """Counter updates lost, by reason (HEALTH)."""
        with self._lock:
            if not self._maps:
                return {name: 0 for name in HEALTH}
            health = self._maps["net_health"]
            raw = {name: health.lookup(SLOT.pack(i)) for i, name in enumerate(HEALTH)}
        return {name: U64.unpack(v[:8])[0] if v else 0 for name, v in raw.items()}

    def retire(self, cgroup_ids) -> None:
        """Delete the counters of cgroups that are gone (exported one last
        time by the caller): short jobs must not fill the table. A socket
        that outlives its cgroup may count again later: its entry comes
        back from zero and is exported, and retired, once more."""
        with self._lock:
            if not self._maps:
                return
            counters = self._maps["net_counters"]
            for cgid in cgroup_ids:
                counters.delete(KEY.pack(cgid))

    # -- reporting ------------------------------------------------------------
    def modes(self) -> dict[str, str]:
        """probe name ('net.retransmit', ...) -> hook mode in use."""
        if not self.available:
            return {}
        return {f"net.{p.group.name}": p.mode for p in self.plans if p.mode}

    def missing(self) -> dict[str, str]:
        """Groups left without a hook while the others run, and why."""
        if not self.available:
            return {}
        return {f"net.{p.group.name}": p.why_not() for p in self.plans if not p.mode}


def doctor_lines() -> list[str]:
    """What `tracehound doctor` says about each net hook on this host."""
    path = object_path(OBJECT)
    if not os.path.exists(path):
        return [f"net          -> not available ({path} is missing: rebuild the probes)"]
    out = []
    for p in features.plan(net_groups()):
        out.append(f"net.{p.group.name:<11} -> {p.mode or 'NONE'}"
                   + ("" if p.mode else f" ({p.why_not()})"))
    return out
