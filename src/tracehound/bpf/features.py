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


# enum io_op in probes/common.h
OPS = ("read", "write", "open", "create", "unlink", "mkdir", "rmdir", "rename", "fsync")

# Syscall mode: two raw tracepoints serve every group; io_config.tp_ops tells
# them which operations are theirs to count.
SYSCALL_PROGRAMS = ["tp_sys_enter", "tp_sys_exit"]


@dataclass(frozen=True)
class HookGroup:
    """Operations that must share a mode so no call is counted twice."""
    name: str
    functions: tuple[str, ...]      # VFS functions for fentry/kprobe
    syscalls: tuple[str, ...]       # the syscalls it covers in tracepoint mode
    ops: tuple[str, ...]
    # syscalls the VFS modes count through their own trace events, because a
    # kernel may inline their whole path past the VFS function
    syscall_events: tuple[str, ...] = ()
    modes: tuple[str, ...] = MODES  # the modes it has programs for, best first

    def programs(self, mode: str) -> list[str]:
        events = [f"sc_{p}_{s}" for s in self.syscall_events for p in ("enter", "exit")]
        if mode == "fentry":
            return [f"{p}_{f}" for f in self.functions for p in ("fe", "fx")] + events
        if mode == "kprobe":
            return [f"{p}_{f}" for f in self.functions for p in ("kp", "kr")] + events
        return list(SYSCALL_PROGRAMS)

    @property
    def op_mask(self) -> int:
        return sum(1 << OPS.index(op) for op in self.ops)


IO_GROUPS = (
    HookGroup("read", ("vfs_read", "vfs_readv"),
              ("read", "pread64", "readv", "preadv", "preadv2"), ("read",)),
    HookGroup("write", ("vfs_write", "vfs_writev"),
              ("write", "pwrite64", "writev", "pwritev", "pwritev2"), ("write",)),
    HookGroup("fsync", ("vfs_fsync_range",), ("fsync", "fdatasync"), ("fsync",),
              syscall_events=("fdatasync",)),
    HookGroup("open", ("vfs_open",), ("open", "openat", "openat2", "creat"), ("open", "create")),
    # unlinkat(AT_REMOVEDIR) is an rmdir: both must be hooked the same way.
    HookGroup("remove", ("vfs_unlink", "vfs_rmdir"), ("unlink", "unlinkat", "rmdir"),
              ("unlink", "rmdir")),
    HookGroup("mkdir", ("vfs_mkdir",), ("mkdir", "mkdirat"), ("mkdir",)),
    HookGroup("rename", ("vfs_rename",), ("rename", "renameat", "renameat2"), ("rename",)),
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


def _try_load(program: str, target: str | None = None) -> str | None:
    """Load one program of the hook-probe object; None if the kernel took it,
    else the reason it did not."""
    try:
        obj = BpfObject(hookprobe_path())
    except TracehoundError as exc:
        return str(exc)
    with obj:
        for name, prog in obj.programs.items():
            prog.autoload = name == program
        try:
            if target:
                obj.programs[program].set_attach_target(target)
            obj.load()
        except TracehoundError as exc:
            return getattr(exc, "reason", str(exc))
    return None


@lru_cache(maxsize=None)
def fentry_check(function: str) -> ModeCheck:
    why = _try_load("probe_fentry", function)
    if why:
        return ModeCheck(False, f"fentry on {function} refused: {why}")
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


@lru_cache(maxsize=1)
def _tp_btf_check() -> ModeCheck:
    why = _try_load("probe_tp_btf")
    if why:
        return ModeCheck(False, f"tp_btf on raw syscall tracepoints refused: {why}")
    return ModeCheck(True, "tp_btf sys_enter/sys_exit")


def syscall_event_check(syscall: str) -> ModeCheck:
    if not ensure_tracefs():
        return ModeCheck(False, "tracefs is not mounted and could not be mounted")
    if not os.path.isdir(os.path.join(TRACEFS, "events", "syscalls", f"sys_enter_{syscall}")):
        return ModeCheck(False, f"no syscalls/sys_enter_{syscall} trace event "
                                "(kernel built without syscall tracepoints)")
    return ModeCheck(True, f"syscalls/sys_enter_{syscall}")


def tracepoint_check(group: HookGroup) -> ModeCheck:
    res = _tp_btf_check()
    if not res.ok:
        return res
    return ModeCheck(True, f"{res.reason}: {', '.join(group.syscalls)}")


def _check(group: HookGroup, mode: str) -> ModeCheck:
    if mode == "tracepoint":
        return tracepoint_check(group)
    checker = fentry_check if mode == "fentry" else kprobe_check
    for fn in group.functions:
        res = checker(fn)
        if not res.ok:
            return res
    for name in group.syscall_events:
        res = syscall_event_check(name)
        if not res.ok:
            return res
    return ModeCheck(True, ", ".join(group.functions + tuple(
        f"{s} trace events" for s in group.syscall_events)))


def plan(groups=IO_GROUPS, forced: str = "auto",
         demoted: dict[str, set[str]] | None = None) -> list[GroupPlan]:
    """Pick a mode per group. `demoted` lists modes that already failed to
    load or attach for a group and must not be picked again."""
    libbpf.lib()
    demoted = demoted or {}
    out = []
    for group in groups:
        gp = GroupPlan(group, None)
        for mode in (group.modes if forced == "auto" else (forced,)):
            if mode not in group.modes:
                gp.checks[mode] = ModeCheck(False, f"no {mode} hooks exist for this group")
                continue
            if mode in demoted.get(group.name, ()):
                gp.checks[mode] = ModeCheck(False, "failed to load or attach (see log)")
                continue
            res = _check(group, mode)
            gp.checks[mode] = res
            if res.ok and gp.mode is None:
                gp.mode = mode
                if forced == "auto":
                    break
        out.append(gp)
    return out
