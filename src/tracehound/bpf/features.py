"""Which hook mode each probe can use on this kernel, decided by trying.

Order of preference per hook group: fentry/fexit, kprobe/kretprobe, syscall
tracepoints. Nothing here looks at the kernel version: fentry is probed by
loading a tiny program against each function, kprobes by the kernel's kprobe
interfaces and symbol table, tracepoints by tracefs.
"""
from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass, field
from functools import lru_cache

from ..errors import TracehoundError
from . import libbpf
from .loader import BpfObject

MODES = ("fentry", "kprobe", "tracepoint")
TRACEFS = "/sys/kernel/tracing"


@dataclass(frozen=True)
class HookGroup:
    """Operations that must share a mode so no call is counted twice."""
    name: str
    functions: tuple[str, ...]      # VFS functions for fentry/kprobe
    syscalls: tuple[str, ...]       # syscall tracepoints

    def programs(self, mode: str) -> list[str]:
        if mode == "fentry":
            return [f"{p}_{f}" for f in self.functions for p in ("fe", "fx")]
        if mode == "kprobe":
            return [f"{p}_{f}" for f in self.functions for p in ("kp", "kr")]
        return [f"tp_{d}_{s}" for s in self.syscalls for d in ("enter", "exit")]


IO_GROUPS = (
    HookGroup("read", ("vfs_read", "vfs_readv"),
              ("read", "pread64", "readv", "preadv", "preadv2")),
    HookGroup("write", ("vfs_write", "vfs_writev"),
              ("write", "pwrite64", "writev", "pwritev", "pwritev2")),
    HookGroup("fsync", ("vfs_fsync_range",), ("fsync", "fdatasync")),
    HookGroup("open", ("vfs_open",), ("open", "openat", "openat2", "creat")),
    # unlinkat(AT_REMOVEDIR) is an rmdir: both must be hooked the same way.
    HookGroup("remove", ("vfs_unlink", "vfs_rmdir"), ("unlink", "unlinkat", "rmdir")),
    HookGroup("mkdir", ("vfs_mkdir",), ("mkdir", "mkdirat")),
    HookGroup("rename", ("vfs_rename",), ("rename", "renameat", "renameat2")),
)


@dataclass
class ModeCheck:
    ok: bool
    reason: str


@dataclass
class GroupPlan:
    group: HookGroup
    mode: str | None
    checks: dict[str, ModeCheck] = field(default_factory=dict)
    missing_tracepoints: tuple[str, ...] = ()


def ensure_tracefs() -> bool:
    """Mount tracefs if nothing has; tracepoint and kprobe attach need it."""
    if os.path.exists(os.path.join(TRACEFS, "events")):
        return True
    try:
        subprocess.run(["mount", "-t", "tracefs", "nodev", TRACEFS],
                       check=True, capture_output=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return False
    return os.path.exists(os.path.join(TRACEFS, "events"))


def hookprobe_path() -> str:
    return os.path.join(os.path.dirname(os.path.dirname(__file__)), "probes", "hookprobe.bpf.o")


@lru_cache(maxsize=None)
def fentry_check(function: str) -> ModeCheck:
    try:
        obj = BpfObject(hookprobe_path())
    except TracehoundError as exc:
        return ModeCheck(False, str(exc))
    with obj:
        prog = obj.programs["probe_fentry"]
        try:
            prog.set_attach_target(function)
            obj.load()
        except TracehoundError as exc:
            reason = getattr(exc, "reason", str(exc))
            return ModeCheck(False, f"fentry on {function} refused: {reason}")
    return ModeCheck(True, f"fentry on {function} loads")


@lru_cache(maxsize=1)
def _kprobe_interface() -> str | None:
    if os.path.exists("/sys/bus/event_source/devices/kprobe/type"):
        return "kprobe PMU"
    if os.path.exists(os.path.join(TRACEFS, "kprobe_events")):
        return "tracefs kprobe_events"
    return None


@lru_cache(maxsize=1)
def _kernel_symbols() -> frozenset[str]:
    names = set()
    try:
        with open("/proc/kallsyms") as f:
            for line in f:
                parts = line.split()
                if len(parts) >= 3 and parts[1] in "tT":
                    names.add(parts[2])
    except OSError:
        pass
    return frozenset(names)


def kprobe_check(function: str) -> ModeCheck:
    iface = _kprobe_interface()
    if iface is None:
        return ModeCheck(False, "kernel has no kprobe support (no kprobe PMU, no kprobe_events)")
    if function not in _kernel_symbols():
        return ModeCheck(False, f"{function} is not a kernel symbol (inlined or renamed)")
    return ModeCheck(True, f"{function} via {iface}")


def tracepoint_exists(syscall: str) -> bool:
    return os.path.isdir(os.path.join(TRACEFS, "events", "syscalls", f"sys_enter_{syscall}"))


def tracepoint_check(group: HookGroup) -> tuple[ModeCheck, tuple[str, ...]]:
    if not ensure_tracefs():
        return ModeCheck(False, f"tracefs is not mounted at {TRACEFS} and could not be"), ()
    present = [s for s in group.syscalls if tracepoint_exists(s)]
    missing = tuple(s for s in group.syscalls if s not in present)
    if not present:
        return ModeCheck(False, "no syscall tracepoints (kernel without CONFIG_FTRACE_SYSCALLS)"), missing
    # A syscall this architecture lacks cannot be called, so skipping it loses nothing.
    return ModeCheck(True, "syscalls " + ",".join(present)), missing


def _check(group: HookGroup, mode: str) -> tuple[ModeCheck, tuple[str, ...]]:
    if mode == "tracepoint":
        return tracepoint_check(group)
    checker = fentry_check if mode == "fentry" else kprobe_check
    for fn in group.functions:
        res = checker(fn)
        if not res.ok:
            return res, ()
    return ModeCheck(True, ", ".join(group.functions)), ()


def plan(groups=IO_GROUPS, forced: str = "auto",
         demoted: dict[str, set[str]] | None = None) -> list[GroupPlan]:
    """Pick a mode per group. `demoted` lists modes that already failed to
    load or attach for a group and must not be picked again."""
    libbpf.lib()
    demoted = demoted or {}
    out = []
    for group in groups:
        gp = GroupPlan(group, None)
        for mode in (MODES if forced == "auto" else (forced,)):
            if mode in demoted.get(group.name, ()):
                gp.checks[mode] = ModeCheck(False, "failed to load or attach (see log)")
                continue
            res, missing = _check(group, mode)
            gp.checks[mode] = res
            if res.ok and gp.mode is None:
                gp.mode = mode
                gp.missing_tracepoints = missing
                if forced == "auto":
                    break
        out.append(gp)
    return out
