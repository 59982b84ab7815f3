"""Loader for exits.bpf.o: why processes end, per cgroup.

One hook, sched_process_exit, as a BTF-typed raw tracepoint where the kernel
takes it, else as the classic tracepoint; the loader tries in that order and
says which one runs. A kernel that refuses both leaves the probe unavailable
with a reason; it never stops the agent.
"""
from __future__ import annotations

import logging
import os
import signal as signal_mod
import struct
import time
from dataclasses import dataclass, field

from ..bpf import features
from ..bpf.layout import EnumLayout, Layout
from ..bpf.lifecycle import OptionalProbe, open_loaded
from ..bpf.loader import BpfObject, Map
from ..errors import TracehoundError
from .cgroup_key import set_cgroup_key
from . import object_path

log = logging.getLogger(__name__)

REASONS = ("clean", "signal", "oom", "error")
HEALTH = ("counters_full", "last_full")
SIG_CORE = 0x80
MAPS = ("exit_counts", "exit_last", "exit_health")
MODES = ("tp_btf", "tracepoint")
PROGRAMS = {"tp_btf": "tb_sched_process_exit", "tracepoint": "tp_sched_process_exit"}
HOOKS = {"tp_btf": "tp_btf/sched_process_exit", "tracepoint": "tracepoint/sched/sched_process_exit"}
VMLINUX_BTF = "/sys/kernel/btf/vmlinux"

# exits.h as Python sees it; a test checks these against the built object's BTF
OBJECT = "exits"
LAYOUTS = (
    Layout("exit_key", [("cgroup_id", "Q"), ("reason", "I"), ("signal", "I")]),
    Layout("exit_last", [("ktime_ns", "Q"), ("pid", "I"), ("status", "I"), ("comm", "16s")]),
    EnumLayout("exit_reason", REASONS, "REASON_", stop="REASON_MAX"),
    EnumLayout("exit_health", HEALTH, "H_", stop="H_MAX"),
)
KEY, LAST = (lay.struct for lay in LAYOUTS[:2])
U32 = struct.Struct("=I")
U64 = struct.Struct("=Q")


def signal_name(signo: int) -> str:
    """SEGV, KILL, RTMIN+3; '' for none (an error or clean exit)."""
    if signo <= 0:
        return ""
    try:
        return signal_mod.Signals(signo).name.removeprefix("SIG")
    except ValueError:
        pass
    lo, hi = signal_mod.SIGRTMIN, signal_mod.SIGRTMAX
    return f"RTMIN+{signo - lo}" if lo < signo < hi else str(signo)


@dataclass(frozen=True)
class ExitKey:
    cgroup_id: int
    reason: str          # one of REASONS (or the number, from a newer object)
    signal: int          # the fatal signal number; 0 for error and clean exits
    core: bool = False   # the process dumped core


@dataclass(frozen=True)
class LastExit:
    pid: int
    comm: str
    status: int          # exit status of an error exit
    ktime_ns: int        # CLOCK_MONOTONIC of the exit

    def wall_time(self, now_mono_ns: int | None = None, now_wall: float | None = None) -> float:
        """The exit as a Unix time (the probe stamps a monotonic clock)."""
        mono = time.monotonic_ns() if now_mono_ns is None else now_mono_ns
        wall = time.time() if now_wall is None else now_wall
        return wall - max(0, mono - self.ktime_ns) / 1e9


# exit_counts' max_entries in exits.bpf.c
COUNTS_ENTRIES = 8192


@dataclass
class ExitsSnapshot:
    counts: dict[ExitKey, int] = field(default_factory=dict)
    last: dict[ExitKey, LastExit] = field(default_factory=dict)
    health: dict[str, int] = field(default_factory=dict)

    def cgroup_ids(self) -> set[int]:
        return {k.cgroup_id for k in self.counts} | {k.cgroup_id for k in self.last}


def decode_key(raw: bytes) -> ExitKey:
    cgid, reason, sig = KEY.unpack(raw[:KEY.size])
    name = REASONS[reason] if reason < len(REASONS) else str(reason)
    return ExitKey(cgid, name, sig & ~SIG_CORE, bool(sig & SIG_CORE))


def encode_key(key: ExitKey) -> bytes:
    return KEY.pack(key.cgroup_id, REASONS.index(key.reason),
                    key.signal | (SIG_CORE if key.core else 0))


def decode_last(raw: bytes) -> LastExit:
    ktime, pid, status, comm = LAST.unpack(raw[:LAST.size])
    return LastExit(pid, comm.split(b"\0", 1)[0].decode(errors="replace"), status, ktime)


def read_snapshot(maps: dict) -> ExitsSnapshot:
    snap = ExitsSnapshot()
    for raw, value in maps["exit_counts"].items():
        key = decode_key(raw)
        snap.counts[key] = snap.counts.get(key, 0) + U64.unpack(value[:8])[0]
    for raw, value in maps["exit_last"].items():
        snap.last[decode_key(raw)] = decode_last(value)
    for i, name in enumerate(HEALTH):
        value = maps["exit_health"].lookup(U32.pack(i))
        snap.health[name] = U64.unpack(value[:8])[0] if value else 0
    return snap


def _btf_check() -> features.ModeCheck:
    if os.path.exists(VMLINUX_BTF):
        return features.ModeCheck(True, "tp_btf/sched_process_exit")
    return features.ModeCheck(False, f"no kernel BTF ({VMLINUX_BTF})")


def _tracepoint_check() -> features.ModeCheck:
    if not features.ensure_tracefs():
        return features.ModeCheck(False, "tracefs is not mounted and could not be mounted")
    if not os.path.isdir(os.path.join(features.TRACEFS, "events", "sched", "sched_process_exit")):
        return features.ModeCheck(False, "no sched/sched_process_exit trace event")
    return features.ModeCheck(True, "sched/sched_process_exit")


def exit_groups() -> tuple[features.HookGroup, ...]:
    return (features.HookGroup("exits", tuple(
        (mode, features.HookMode((PROGRAMS[mode],), (check,)))
        for mode, check in (("tp_btf", _btf_check), ("tracepoint", _tracepoint_check)))),)


@dataclass
class ExitsProbeConfig:
    mode: str = "auto"           # auto, tp_btf or tracepoint
    cgroup_key: str = "v2"       # the hierarchy counted by (cgroup_key.py)


class ExitsProbe(OptionalProbe):
    """The exit probe; start() never raises for a refusing kernel:
    `available` is then False and `reason` says why."""

    name = "exits"

    def __init__(self, config: ExitsProbeConfig | None = None):
        self.config = config or ExitsProbeConfig()
        self.obj: BpfObject | None = None
        self.plans: list[features.GroupPlan] = []
        self._maps: dict[str, Map] | None = None

    def _start(self) -> None:
        if self.config.mode not in ("auto", *MODES):
            raise TracehoundError(f"exit probe mode {self.config.mode} does not exist "
                                  f"(use auto, {' or '.join(MODES)})")
        self.plans = features.load_with_fallback("exits", exit_groups(), self.config.mode,
                                                 self._load_and_attach, every_group=True)

    def _load_and_attach(self, plans: list[features.GroupPlan]) -> None:
        self.close()
        self.obj, self._maps = open_loaded(
            object_path(OBJECT), programs=features.wanted_programs(plans), maps=MAPS,
            prepare=lambda obj: set_cgroup_key(obj, self.config.cgroup_key))

    def close(self) -> None:
        self._maps = None
        if self.obj is not None:
            self.obj.close()
            self.obj = None

    def snapshot(self) -> ExitsSnapshot:
        if self._maps is None:
            return ExitsSnapshot()
        return read_snapshot(self._maps)

    def retire(self, cgroup_ids: set[int]) -> None:
        """Delete the counters and last exits of cgroups that are gone
        (exported one last time by the caller): short jobs must not fill
        the maps."""
        if self._maps is None or not cgroup_ids:
            return
        for name in ("exit_counts", "exit_last"):
            table = self._maps[name]
            for raw in list(table.keys()):
                if KEY.unpack(raw[:KEY.size])[0] in cgroup_ids:
                    table.delete(raw)

    def modes(self) -> dict[str, str]:
        return {p.group.name: p.mode for p in self.plans if p.mode} if self.available else {}


def doctor_line() -> str:
    """One line for `tracehound doctor`: the form of the hook that would be used."""
    if not os.path.exists(object_path(OBJECT)):
        return f"exits        -> not available ({object_path(OBJECT)} is missing: rebuild the probes)"
    gp = features.plan(exit_groups())[0]
    if gp.mode is None:
        return f"exits        -> not available ({gp.why_not()})"
    return f"exits        -> {gp.mode} ({HOOKS[gp.mode]})"
