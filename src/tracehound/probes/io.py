"""The I/O probe (io.bpf.o): its hook tables, its map layouts, and the loader
that picks a hook mode per group, loads, attaches, fills the configuration
maps (the mount prefixes, kept current, are io_mount_mirror.py's) and reads
the counters back.

Nothing outside this module knows io.bpf.o's map names: the collector gets
decoded (IoKey, values) pairs. The byte layouts (io.h's) are io_maps.py's.
"""
from __future__ import annotations

import array
import logging
import mmap
import struct
import threading
from dataclasses import dataclass
from typing import Iterator

from .. import defaults
from ..bpf import features
from ..bpf.features import HookGroup, HookMode
from ..bpf.lifecycle import open_loaded
from ..bpf.loader import BpfObject, Map
from ..host.mounts import DEFAULT_SKIP_FSTYPES, MountTable
from . import object_path
from .cgroup_key import set_cgroup_key
from .io_mount_mirror import MOUNTS_SEEN_MAP, MountMirror
from .io_maps import (CACHE_FILL, COUNTERS_AT, FSTYPE_LEN, HEALTH, HISTS, KEY, OPS, SAMPLER,
                      SETTINGS, SLOT, U64, IoKey, decode_values, op_mask, timed_mask)

log = logging.getLogger(__name__)

# Syscall mode: two raw tracepoints serve every group; settings.tp_ops tells
# them which operations are theirs to count.
SYSCALL_PROGRAMS = ("tp_sys_enter", "tp_sys_exit")
# Programs that only start a clock: left out for operations whose latency is
# not measured (exit counts those alone).
CLOCK_PROGRAMS = {"tp_sys_enter": HISTS, "fe_vfs_read": ("read",), "fe_vfs_readv": ("read",),
                  "fe_vfs_write": ("write",), "fe_vfs_writev": ("write",),
                  "fe_vfs_fsync_range": ("fsync",)}
# moves a timed call's start off its CPU when its task is switched out
CLOCK_MOVER = "tp_sched_switch"
# start io_uring requests' clocks: the submit event's name since 6.5, and before
URING_CLOCKS = (("rt_io_uring_submit_req", "io_uring_submit_req"),
                ("rt_io_uring_submit_sqe", "io_uring_submit_sqe"))
URING_COMPLETE = "rt_io_uring_complete"
SETTINGS_MAP = ".rodata.settings"
# bpf_rdonly_cast (6.2) lets the probe read kernel structs with plain loads;
# older kernels get the build that reads them through helper calls
COMPAT_OBJECT = "io_compat"
DIRECT_READS_KFUNC = "bpf_rdonly_cast"


def _group(name: str, functions: tuple[str, ...], syscalls: tuple[str, ...],
           syscall_events: tuple[str, ...] = ()) -> HookGroup:
    """`syscall_events`: syscalls the VFS modes count through their own trace
    events, because a kernel may inline their whole path past the VFS function."""
    events = tuple(f"sc_{p}_{s}" for s in syscall_events for p in ("enter", "exit"))
    event_checks = tuple((lambda s=s: features.syscall_event_check(s)) for s in syscall_events)
    summary = ", ".join(functions + tuple(f"{s} trace events" for s in syscall_events))

    def vfs(mode: str, entry: str, exit_: str) -> HookMode:
        # fexit sees the arguments: fentry only starts clocks, and only
        # operations with a latency histogram have one
        programs = tuple(f"{p}_{f}" for f in functions for p in (entry, exit_)
                         if p != "fe" or f"fe_{f}" in CLOCK_PROGRAMS) + events
        return HookMode(programs, features.function_checks(mode, functions) + event_checks,
                        summary)

    def tracepoint() -> features.ModeCheck:
        res = features.tp_btf_check()
        return res if not res.ok else features.ModeCheck(True, f"{res.reason}: {', '.join(syscalls)}")

    return HookGroup(name, (
        ("fentry", vfs("fentry", "fe", "fx")),
        ("kprobe", vfs("kprobe", "kp", "kr")),
        ("tracepoint", HookMode(SYSCALL_PROGRAMS, (tracepoint,))),
    ))


def _syscall_group(name: str, syscalls: tuple[str, ...]) -> HookGroup:
    """Syscalls that move file data past the VFS read and write functions
    (io_async.bpf.h): the raw syscall hooks count them in tracepoint mode;
    the VFS modes attach these syscalls' own trace events instead, on a
    kernel that offers that mode, so a probe's groups report one mode."""
    events = tuple(f"sc_{p}_{s}" for s in syscalls for p in ("enter", "exit"))
    event_checks = tuple((lambda s=s: features.syscall_event_check(s)) for s in syscalls)
    summary = ", ".join(f"{s} trace events" for s in syscalls)

    def vfs(mode: str) -> HookMode:
        return HookMode(events, features.function_checks(mode, ("vfs_read",)) + event_checks,
                        summary)

    def tracepoint() -> features.ModeCheck:
        res = features.tp_btf_check()
        return res if not res.ok else features.ModeCheck(True, f"{res.reason}: {', '.join(syscalls)}")

    return HookGroup(name, (("fentry", vfs("fentry")), ("kprobe", vfs("kprobe")),
                            ("tracepoint", HookMode(SYSCALL_PROGRAMS, (tracepoint,)))),
                     optional=True)


def _trace_event_group(name: str, tracepoint: str, program: str,
                       clocks: tuple[str, ...] = ()) -> HookGroup:
    """Counted where the kernel completes the work, through one trace event
    (tp_btf, or raw_tp for the rt_ programs), whichever mode the rest of the
    probe runs in. `clocks`: programs that time the work, of which the loader
    keeps what the kernel has."""
    kind = "raw_tp" if program.startswith("rt_") else "tp_btf"
    hook = HookMode((program, *clocks), (features.tp_btf_check,
                                         lambda: features.btf_tracepoint_check(tracepoint)),
                    f"{kind}/{tracepoint}")
    return HookGroup(name, (("tracepoint", hook),), optional=True, any_mode=True)


GROUPS = (
    _group("read", ("vfs_read", "vfs_readv"), ("read", "pread64", "readv", "preadv", "preadv2")),
    _group("write", ("vfs_write", "vfs_writev"),
           ("write", "pwrite64", "writev", "pwritev", "pwritev2")),
    _group("fsync", ("vfs_fsync_range",), ("fsync", "fdatasync"), syscall_events=("fdatasync",)),
    _group("open", ("vfs_open",), ("open", "openat", "openat2", "creat")),
    # unlinkat(AT_REMOVEDIR) is an rmdir: both must be hooked the same way.
    _group("remove", ("vfs_unlink", "vfs_rmdir"), ("unlink", "unlinkat", "rmdir")),
    _group("mkdir", ("vfs_mkdir",), ("mkdir", "mkdirat")),
    _group("rename", ("vfs_rename",), ("rename", "renameat", "renameat2")),
    # data moved past vfs_read/vfs_write: each counted once, where it completes
    _trace_event_group("uring", "io_uring_complete", URING_COMPLETE,
                       tuple(prog for prog, _tp in URING_CLOCKS)),
    _syscall_group("aio", ("io_getevents", "io_pgetevents")),
    _syscall_group("copy", ("copy_file_range", "sendfile64", "splice")),
    _trace_event_group("pagecache", "mm_filemap_add_to_page_cache", "tb_filemap_add"),
)
def uring_clock() -> tuple[str, ...]:
    """The program that starts io_uring requests' clocks on this kernel (none
    where neither submit event exists: the requests are counted untimed)."""
    return next(((prog,) for prog, tp in URING_CLOCKS
                 if features.btf_tracepoint_check(tp).ok), ())


def object_name() -> str:
    return "io" if features.kernel_has_function(DIRECT_READS_KFUNC) else COMPAT_OBJECT


@dataclass
class IoProbeConfig:
    hook_mode: str = defaults.HOOK_MODE
    skip_fstypes: tuple[str, ...] = DEFAULT_SKIP_FSTYPES
    max_entries: int = defaults.IO_MAX_ENTRIES
    # operations (of HISTS) whose latency the kernel measures; the others
    # are counted at exit only, with no clock read and, in syscall mode, no
    # entry hook at all
    latency: frozenset[str] = frozenset(HISTS)
    cgroup_key: str = "v2"       # the hierarchy counted by (cgroup_key.py)
    # sampled timing (io_sample.bpf.h): about one timed call of a kind per
    # CPU per this many ns when calls come faster; 0: every call is timed
    sample_gap_ns: int = defaults.LATENCY_SAMPLE_GAP_NS
    # every timed op's call also timed, once, into io_audit (io_sample.bpf.h)
    audit: bool = False


class IoProbe:
    """The loaded and attached I/O probe. Use as a context manager."""

    name = "io"

    def __init__(self, config: IoProbeConfig, mounts: MountTable):
        self.config = config
        self.mounts = mounts
        self.obj: BpfObject | None = None
        self.plans: list[features.GroupPlan] = []
        self._maps: dict[str, Map] = {}
        self._counters: mmap.mmap | None = None   # io_stats, shared with the kernel
        self._lock = threading.Lock()
        self._mirror = MountMirror(mounts, config.skip_fstypes, self._lock)

    # -- lifecycle --------------------------------------------------------
    def start(self) -> "IoProbe":
        self.plans = features.load_with_fallback(
            "io", GROUPS, self.config.hook_mode, self._load_and_attach, every_group=True)
        return self

    def _load_and_attach(self, plans: list[features.GroupPlan]) -> None:
        self.close()
        self.plans = plans
        latency = self.config.latency
        wanted = features.wanted_programs(plans)
        wanted -= {n for n, ops in CLOCK_PROGRAMS.items() if not latency.intersection(ops)}
        if wanted & set(CLOCK_PROGRAMS):
            wanted.add(CLOCK_MOVER)
        # the uring group lists every submit program; keep the one this
        # kernel has, and none when nothing is timed
        wanted -= {prog for prog, _tp in URING_CLOCKS} - set(uring_clock() if latency else ())

        def prepare(obj: BpfObject) -> None:
            for name in ("io_stats", "io_slots", "free_slots"):
                obj.map(name).set_max_entries(self.config.max_entries)
            tp_ops = sum(op_mask(p.group.name) for p in plans if p.mode == "tracepoint")
            obj.map(SETTINGS_MAP).set_initial_value(SETTINGS.pack(
                self.mounts.mount_namespace_inode(), tp_ops, timed_mask(latency),
                self.config.max_entries, self.config.sample_gap_ns, int(self.config.audit),
                int(self.config.max_entries * defaults.IO_RESERVED_SHARE)))
            set_cgroup_key(obj, self.config.cgroup_key)

        def ready(obj: BpfObject, maps: dict[str, Map]) -> None:
            # the skip list and mount prefixes are in place before any
            # program sees its first call
            self.obj, self._maps = obj, maps
            self._counters = maps["io_stats"].memory()
            self._configure()
        try:
            open_loaded(object_path(object_name()), programs=wanted, prepare=prepare,
                        ready=ready, maps=("io_stats", "io_slots", "free_slots", "io_health",
                                           "io_samplers", "skip_fstypes", "mounts_by_path",
                                           MOUNTS_SEEN_MAP))
        except BaseException:
            self._forget_object()
            raise
        self._mirror.watch()

    def _forget_object(self) -> None:
        """Drop what refers to the object (closed by its owner or by
        open_loaded's failure path)."""
        self._maps = {}
        self._mirror.forget()
        if self._counters is not None:
            self._counters.close()
            self._counters = None
        self.obj = None

    def close(self) -> None:
        self._mirror.stop()
        with self._lock:
            obj = self.obj
            self._forget_object()
            if obj is not None:
                obj.close()

    def __enter__(self) -> "IoProbe":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.close()

    # -- configuration maps ----------------------------------------------
    def _configure(self) -> None:
        skip = self._maps["skip_fstypes"]
        for name in self.config.skip_fstypes:
            raw = name.encode()[:FSTYPE_LEN - 1]
            skip.update(raw.ljust(FSTYPE_LEN, b"\0"), b"\1")
        self._mirror.start(self._maps)

    def sync_mounts(self, force: bool = False) -> None:
        """Mirror the mount table into the kernel now (the watcher does it on
        every change)."""
        self._mirror.sync(force)

    # -- reading ------------------------------------------------------------
    def stats(self) -> Iterator[tuple[IoKey, array.array]]:
        """Every (cgroup, mount) entry of the counters, decoded as it is read
        (one batch of raw values at a time). The mount table is re-read first,
        so every mount id read has its name; no map is written here."""
        with self._lock:
            self.mounts.refresh()
        unpack = KEY.unpack
        for k, v in self._entries():
            yield IoKey(*unpack(k)), decode_values(v)

    def keys(self) -> Iterator[IoKey]:
        """Every registered (cgroup, mount) key, its counters left undecoded."""
        unpack = KEY.unpack
        for k, _raw in self._entries():
            yield IoKey(*unpack(k))

    def progress(self) -> dict[int, int]:
        """cgroup id -> a number that grows with every byte moved and every
        call made in it (the stall detector's I/O source): bytes, calls and
        page-cache fills; errors are not progress."""
        out: dict[int, int] = {}
        for k, v in self._entries():
            a = decode_values(v)
            cgid = KEY.unpack(k)[0]
            out[cgid] = out.get(cgid, 0) + sum(a[:2 + len(OPS)]) + a[CACHE_FILL]
        return out

    def _entries(self) -> Iterator[tuple[bytes, bytes]]:
        """(raw key, raw struct io_stats) of every registered key: the slots
        from io_slots, the counters straight from the mapped array."""
        for k, v in self._maps["io_slots"].iter_items():
            raw = self._slot(k, v)
            if raw is not None:
                yield k, raw

    def _slot(self, key: bytes, slot: bytes) -> bytes | None:
        """The struct io_stats in a slot, or None while it does not (yet, or
        any more) belong to the key: a key registered while its slot is
        being handed over is read at the next scrape."""
        stride = self._maps["io_stats"].stride
        at = SLOT.unpack(slot)[0] * stride
        raw = self._counters[at:at + stride]
        return raw if raw[:COUNTERS_AT] == key else None

    def retire(self, keys: list[IoKey]) -> list[tuple[IoKey, array.array]]:
        """Read these entries one last time and free their slots (their
        cgroup is gone, so nothing can add to them any more)."""
        out = []
        for key in keys:
            raw = self._retire(KEY.pack(*key))
            if raw is not None:
                out.append((key, decode_values(raw)))
        return out

    def _retire(self, key: bytes) -> bytes | None:
        slots, stats = self._maps["io_slots"], self._maps["io_stats"]
        found = slots.lookup(key)
        if found is None:
            return None
        raw = self._slot(key, found)
        slots.delete(key)
        # emptied, owner included, before it can be handed out again
        stats.update(found, bytes(stats.value_size))
        self._maps["free_slots"].push(found)
        return raw

    def drops(self) -> dict[str, int]:
        """Updates lost because a map was full, by map name (summed over CPUs)."""
        health = self._maps["io_health"]
        return {name: sum(health.lookup_percpu_u64(struct.pack("I", i)))
                for i, name in enumerate(HEALTH)}

    def timed_calls(self) -> dict[str, int]:
        """op (of HISTS) -> calls whose latency was timed, summed over CPUs;
        {} when every call is timed (the requests say how many)."""
        if not self.config.sample_gap_ns or "io_samplers" not in self._maps:
            return {}
        samplers = self._maps["io_samplers"]
        timed = SAMPLER.offsets()["timed"][0]
        return {op: sum(U64.unpack_from(v, timed)[0]
                        for v in samplers.lookup_percpu(struct.pack("I", h)))
                for h, op in enumerate(HISTS) if op in self.config.latency}

    # -- reporting ------------------------------------------------------------
    def modes(self) -> dict[str, str]:
        """probe name ('io.read', ...) -> hook mode in use (an optional group
        this kernel cannot hook is absent)."""
        return {f"io.{p.group.name}": p.mode for p in self.plans if p.mode}

    def missing(self) -> dict[str, str]:
        """probe name -> why this kernel could not hook that optional group."""
        return {f"io.{p.group.name}": p.why_not() for p in self.plans if not p.mode}
