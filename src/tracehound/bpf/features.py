"""Which hook mode each probe can use on this kernel, decided by trying, and
loading a probe with a fallback per hook group.

Nothing here looks at the kernel version: fentry is probed by loading a tiny
program against each function, kprobes by the kernel's kprobe interfaces and
symbol table, tracepoints by tracefs and the raw syscall tracepoints. Each
probe declares its own hook groups (its tables live with the probe); this
module only knows how to check a requirement and pick, per group, the best
mode whose requirements all hold.
"""
from __future__ import annotations

import logging
import os
import subprocess
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import lru_cache

from ..errors import ProbeError, TracehoundError
from . import libbpf
from .loader import BpfObject

log = logging.getLogger(__name__)

MODES = ("fentry", "kprobe", "tracepoint")
TRACEFS = "/sys/kernel/tracing"


@dataclass
class ModeCheck:
    ok: bool
    reason: str


Check = Callable[[], ModeCheck]


@dataclass(frozen=True)
class HookMode:
    """One way to hook a group: the programs to load and what must hold first."""
    programs: tuple[str, ...]
    checks: tuple[Check, ...]
    summary: str = ""            # what doctor says when every check passes (default:
                                 # what the checks said)


@dataclass(frozen=True)
class HookGroup:
    """Operations that must share a mode so no call is counted twice.
    `modes` is ordered best first: (mode name, HookMode) pairs. An optional
    group the kernel cannot hook is left out (and reported) instead of
    failing its probe."""
    name: str
    modes: tuple[tuple[str, HookMode], ...]
    optional: bool = False
    # hooked by trace events that exist whatever the hook mode: the group's
    # modes are tried even when the probe is forced to another mode
    any_mode: bool = False

    def mode(self, name: str) -> HookMode | None:
        return dict(self.modes).get(name)

    def programs(self, mode: str) -> tuple[str, ...]:
        found = self.mode(mode)
        return found.programs if found else ()


@dataclass
class GroupPlan:
    group: HookGroup
    mode: str | None
    checks: dict[str, ModeCheck] = field(default_factory=dict)

    def why_not(self) -> str:
        return "; ".join(f"{m}: {c.reason}" for m, c in self.checks.items()) or "not checked"


def wanted_programs(plans: Sequence[GroupPlan]) -> set[str]:
    """The programs the planned groups load in their chosen modes (a group
    with no mode loads none)."""
    return {name for p in plans if p.mode for name in p.group.programs(p.mode)}


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
def kallsyms_table() -> bytes:
    """/proc/kallsyms as read once, with a newline in front so that every
    line, the first included, starts after one."""
    try:
        with open("/proc/kallsyms", "rb") as f:
            return b"\n" + f.read()
    except OSError:
        return b""


def kernel_has_function(name: str) -> bool:
    """Whether the running kernel (modules included) has this text symbol.
    Searched in the table's bytes: splitting its 100k+ lines into a set took
    a fifth of the agent's start on a 6.18 host (0.13 of 0.2 s to read and
    parse), and thirty times that under emulation."""
    table = kallsyms_table()
    word = name.encode()
    # "ADDR T name\n", or "ADDR t name\t[module]\n" for a module's
    return any(f" {kind} ".encode() + word + end in table
               for kind in "tT" for end in (b"\n", b"\t"))


def kprobe_check(function: str) -> ModeCheck:
    iface = _kprobe_interface()
    if iface is None:
        return ModeCheck(False, "kernel has no kprobe support (no kprobe PMU, no kprobe_events)")
    if not kernel_has_function(function):
        return ModeCheck(False, f"{function} is not a kernel symbol (inlined or renamed)")
    return ModeCheck(True, f"{function} via {iface}")


@lru_cache(maxsize=1)
def tp_btf_check() -> ModeCheck:
    why = _try_load("probe_tp_btf")
    if why:
        return ModeCheck(False, f"tp_btf on raw syscall tracepoints refused: {why}")
    return ModeCheck(True, "tp_btf sys_enter/sys_exit")


VMLINUX_BTF = "/sys/kernel/btf/vmlinux"


@lru_cache(maxsize=1)
def _vmlinux_btf() -> bytes:
    try:
        with open(VMLINUX_BTF, "rb") as f:
            return f.read()
    except OSError:
        return b""


def btf_tracepoint_check(tracepoint: str) -> ModeCheck:
    """The kernel has the tracepoint if its BTF names the typedef every
    tracepoint gets (btf_trace_<name>); CO-RE needs that BTF anyway."""
    btf = _vmlinux_btf()
    if not btf:
        return ModeCheck(False, f"no kernel BTF at {VMLINUX_BTF}")
    if b"\0btf_trace_" + tracepoint.encode() + b"\0" not in btf:
        return ModeCheck(False, f"no {tracepoint} tracepoint in this kernel")
    return ModeCheck(True, f"{tracepoint} tracepoint")


def syscall_event_check(syscall: str) -> ModeCheck:
    if not ensure_tracefs():
        return ModeCheck(False, "tracefs is not mounted and could not be mounted")
    if not os.path.isdir(os.path.join(TRACEFS, "events", "syscalls", f"sys_enter_{syscall}")):
        return ModeCheck(False, f"no syscalls/sys_enter_{syscall} trace event "
                                "(kernel built without syscall tracepoints)")
    return ModeCheck(True, f"syscalls/sys_enter_{syscall}")


def function_checks(mode: str, functions: Sequence[str]) -> tuple[Check, ...]:
    """The checks for hooking these kernel functions in fentry or kprobe mode."""
    checker = fentry_check if mode == "fentry" else kprobe_check
    return tuple((lambda fn=fn: checker(fn)) for fn in functions)


def _check(hook: HookMode) -> ModeCheck:
    reasons = []
    for check in hook.checks:
        res = check()
        if not res.ok:
            return res
        reasons.append(res.reason)
    return ModeCheck(True, hook.summary or "; ".join(reasons))


def plan(groups: Sequence[HookGroup], forced: str = "auto",
         demoted: dict[str, set[str]] | None = None) -> list[GroupPlan]:
    """Pick a mode per group. `demoted` lists modes that already failed to
    load or attach for a group and must not be picked again."""
    libbpf.lib()
    demoted = demoted or {}
    out = []
    for group in groups:
        gp = GroupPlan(group, None)
        names = [m for m, _ in group.modes] if forced == "auto" or group.any_mode else [forced]
        for mode in names:
            hook = group.mode(mode)
            if hook is None:
                gp.checks[mode] = ModeCheck(False, f"no {mode} hooks exist for this group")
                continue
            if mode in demoted.get(group.name, ()):
                gp.checks[mode] = ModeCheck(False, "failed to load or attach (see log)")
                continue
            res = _check(hook)
            gp.checks[mode] = res
            if res.ok and gp.mode is None:
                gp.mode = mode
                if forced == "auto" or group.any_mode:
                    break
        out.append(gp)
    return out


def load_with_fallback(probe: str, groups: Sequence[HookGroup], forced: str,
                       load: Callable[[list[GroupPlan]], None], *, every_group: bool,
                       retries: int = 8) -> list[GroupPlan]:
    """Plan, then `load(plans)`; a group whose programs the kernel refuses is
    demoted to its next mode and the whole probe is loaded again.

    every_group: a group left without a mode is an error (the I/O probe must
    count everything), unless the group is optional; otherwise the probe
    runs with the groups that have one, as long as at least one does. A
    refusal in a forced mode is raised as is when it leaves a required group
    without a mode."""
    demoted: dict[str, set[str]] = {}
    for _ in range(retries):
        plans = plan(groups, forced, demoted)
        unusable = [p for p in plans if p.mode is None and not p.group.optional]
        if every_group and unusable:
            p = unusable[0]
            raise TracehoundError(f"{probe} probe: no usable hook for {p.group.name} ({p.why_not()})")
        active = [p for p in plans if p.mode]
        if not active:
            raise TracehoundError("no usable hook: " + "; ".join(
                f"{probe}.{p.group.name}: {p.why_not()}" for p in plans))
        try:
            load(plans)
            return plans
        except ProbeError as exc:
            failed = next((p for p in active if exc.program in p.group.programs(p.mode)), None)
            if failed is None or (every_group and forced != "auto" and not failed.group.optional):
                raise
            log.warning("%s probe: %s in %s mode failed (%s); trying the next mode",
                        probe, failed.group.name, failed.mode, exc.reason)
            if exc.log:
                log.debug("%s probe: program %s on %s: the kernel's log:\n%s",
                          probe, exc.program, exc.hook, exc.log)
            demoted.setdefault(failed.group.name, set()).add(failed.mode)
    raise TracehoundError(f"{probe} probe: gave up after repeated load/attach failures")
