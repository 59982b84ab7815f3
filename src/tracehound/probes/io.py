"""The I/O probe (io.bpf.o): its hook tables, its map layouts, and the loader
that picks a hook mode per group, loads, attaches, keeps the configuration
maps (skip list, mount prefixes) current and reads the counters back.

Nothing outside this module knows io.bpf.o's map names or byte layouts: the
collector gets decoded (IoKey, values) pairs. Layouts follow io.h; a test
checks them against the BTF of the built object.
"""
from __future__ import annotations

import array
import logging
import select
import struct
import threading
from dataclasses import dataclass
from typing import Iterator, NamedTuple

from .. import defaults
from ..bpf import features
from ..bpf.features import HookGroup, HookMode
from ..bpf.layout import EnumLayout, Layout
from ..bpf.loader import BpfObject, Map
from ..host.mounts import DEFAULT_SKIP_FSTYPES, MountTable
from . import object_path

log = logging.getLogger(__name__)

# enum io_op and enum io_hist in io.h
OPS = ("read", "write", "open", "create", "unlink", "mkdir", "rmdir", "rename", "fsync")
HISTS = ("read", "write", "fsync")
HIST_SLOTS = 32
KEY_DEV = 1                          # IO_KEY_DEV: mnt holds a device number
HEALTH = ("io_stats", "io_start")    # enum io_health: which map was full
FSTYPE_LEN = 16
PATH_LEN = 256

# io.h as Python sees it; tests/unit/test_layouts.py checks these against
# the BTF of the built io.bpf.o
OBJECT = "io"
IO_KEY = Layout("io_key", [("cgroup_id", "Q"), ("mnt", "I"), ("flags", "I")])
IO_STATS = Layout("io_stats", [
    ("bytes", "Q", 2), ("calls", "Q", len(OPS)), ("errors", "Q", len(OPS)),
    ("lat_sum_ns", "Q", len(HISTS)), ("hist", "Q", len(HISTS) * HIST_SLOTS)])
# every field of struct io_stats is a __u64: Python reads it as one flat array
N_FIELDS = IO_STATS.size // 8
LAYOUTS = (
    IO_KEY, IO_STATS,
    Layout("io_config", [("agent_mnt_ns", "I"), ("tp_ops", "I")]),
    Layout("fstype_name", [("name", f"{FSTYPE_LEN}s")]),
    Layout("mnt_lpm_key", [("prefixlen", "I"), ("path", f"{PATH_LEN}s")]),
    Layout("mnt_lpm_value", [("mnt_id", "I"), ("skip", "I")]),
    EnumLayout("io_op", OPS, "OP_", stop="OP_MAX"),
    EnumLayout("io_hist", HISTS, "HIST_", stop="HIST_MAX"),
    EnumLayout("io_health", tuple(m.removeprefix("io_") + "_full" for m in HEALTH),
               "HEALTH_", stop="HEALTH_MAX"),
)
KEY = IO_KEY.struct

# Syscall mode: two raw tracepoints serve every group; io_config.tp_ops tells
# them which operations are theirs to count.
SYSCALL_PROGRAMS = ("tp_sys_enter", "tp_sys_exit")


class IoKey(NamedTuple):
    cgroup_id: int
    mnt: int        # a mount id, or a device number when flags & KEY_DEV
    flags: int


def _group(name: str, functions: tuple[str, ...], syscalls: tuple[str, ...],
           syscall_events: tuple[str, ...] = ()) -> HookGroup:
    """`syscall_events`: syscalls the VFS modes count through their own trace
    events, because a kernel may inline their whole path past the VFS function."""
    events = tuple(f"sc_{p}_{s}" for s in syscall_events for p in ("enter", "exit"))
    event_checks = tuple((lambda s=s: features.syscall_event_check(s)) for s in syscall_events)
    summary = ", ".join(functions + tuple(f"{s} trace events" for s in syscall_events))

    def vfs(mode: str, entry: str, exit_: str) -> HookMode:
        programs = tuple(f"{p}_{f}" for f in functions for p in (entry, exit_)) + events
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
)
# the operations each group counts (its bits in io_config.tp_ops)
GROUP_OPS = {"read": ("read",), "write": ("write",), "fsync": ("fsync",),
             "open": ("open", "create"), "remove": ("unlink", "rmdir"),
             "mkdir": ("mkdir",), "rename": ("rename",)}


def op_mask(group: str) -> int:
    return sum(1 << OPS.index(op) for op in GROUP_OPS[group])


def decode_values(raw: bytes) -> array.array:
    """struct io_stats as one flat array of u64, in the kernel's order."""
    a = array.array("Q")
    a.frombytes(raw[:N_FIELDS * 8])
    return a


@dataclass
class IoProbeConfig:
    hook_mode: str = defaults.HOOK_MODE
    skip_fstypes: tuple[str, ...] = DEFAULT_SKIP_FSTYPES
    max_entries: int = defaults.IO_MAX_ENTRIES


class IoProbe:
    """The loaded and attached I/O probe. Use as a context manager."""

    name = "io"

    def __init__(self, config: IoProbeConfig, mounts: MountTable):
        self.config = config
        self.mounts = mounts
        self.obj: BpfObject | None = None
        self.plans: list[features.GroupPlan] = []
        self._lpm_keys: set[bytes] = set()
        self._maps: dict[str, Map] = {}
        self._lock = threading.Lock()
        self._watcher: threading.Thread | None = None
        self._stop = threading.Event()

    # -- lifecycle --------------------------------------------------------
    def start(self) -> "IoProbe":
        self.plans = features.load_with_fallback(
            "io", GROUPS, self.config.hook_mode, self._load_and_attach, every_group=True)
        return self

    def _load_and_attach(self, plans: list[features.GroupPlan]) -> None:
        self.close()
        self.plans = plans
        obj = BpfObject(object_path("io"))
        try:
            wanted = set()
            for p in self.plans:
                wanted.update(p.group.programs(p.mode))
            for name, prog in obj.programs.items():
                prog.autoload = name in wanted
            obj.map("io_stats").set_max_entries(self.config.max_entries)
            obj.load()
            self.obj = obj
            # held for the probe's life: a Map remembers whether batch lookups work
            self._maps = {name: obj.map(name) for name in
                          ("io_stats", "io_health", "io_config", "skip_fstypes", "mnt_cache",
                           "mounts_by_path")}
            self._configure()
            obj.attach_all()
            self._start_watcher()
        except BaseException:
            obj.close()
            self.obj = None
            self._maps = {}
            raise

    def close(self) -> None:
        self._stop.set()
        if self._watcher is not None:
            self._watcher.join(timeout=2)
            self._watcher = None
        with self._lock:
            self._maps = {}
            if self.obj is not None:
                self.obj.close()
                self.obj = None
        self._stop.clear()

    def _start_watcher(self) -> None:
        """Follow mount changes as they happen: the kernel flags
        /proc/self/mountinfo with POLLPRI on every mount or unmount, so a new
        file system's path prefix is known before its first namespace op."""
        def watch():
            with open(self.mounts.path) as f:
                poller = select.poll()
                poller.register(f, select.POLLPRI | select.POLLERR)
                while not self._stop.is_set():
                    if poller.poll(500):
                        f.seek(0)
                        f.read()  # re-arm
                        try:
                            self.sync_mounts()
                        except Exception as exc:  # keep watching; scrapes sync too
                            log.warning("io probe: mount sync failed: %s", exc)
        self._watcher = threading.Thread(target=watch, name="mount-watcher", daemon=True)
        self._watcher.start()

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
        tp_ops = sum(op_mask(p.group.name) for p in self.plans if p.mode == "tracepoint")
        self._maps["io_config"].update(
            struct.pack("I", 0), struct.pack("II", self.mounts.mount_namespace_inode(), tp_ops))
        self.sync_mounts(force=True)

    def sync_mounts(self, force: bool = False) -> None:
        """Mirror mount points into the LPM trie used for absolute paths."""
        with self._lock:
            if self.obj is not None and (self.mounts.refresh() or force):
                self._sync_lpm()

    def _sync_lpm(self) -> None:
        # Unmounted vfsmount addresses may be reused: forget cached ids.
        cache = self._maps["mnt_cache"]
        for key in list(cache.keys()):
            cache.delete(key)
        lpm = self._maps["mounts_by_path"]
        skip = set(self.config.skip_fstypes)
        wanted: dict[bytes, bytes] = {}
        for m in self.mounts.mounts:  # later mounts hide earlier ones at the same point
            prefix = m.mountpoint.rstrip("/") + "/"
            # the kernel's bytes, also where they are not UTF-8
            raw = prefix.encode("utf-8", "surrogateescape")[:PATH_LEN]
            key = struct.pack("I", len(raw) * 8) + raw.ljust(PATH_LEN, b"\0")
            wanted[key] = struct.pack("II", m.mnt_id, 1 if m.fstype in skip else 0)
        for key in self._lpm_keys - wanted.keys():
            lpm.delete(key)
        for key, value in wanted.items():
            lpm.update(key, value)
        self._lpm_keys = set(wanted)

    # -- reading ------------------------------------------------------------
    def stats(self) -> Iterator[tuple[IoKey, array.array]]:
        """Every (cgroup, mount) entry of the counters, decoded as it is read
        (one batch of raw values at a time). The mount table is synced
        first, so every mount id read has its name."""
        self.sync_mounts()
        unpack = KEY.unpack
        for k, v in self._maps["io_stats"].iter_items():
            yield IoKey(*unpack(k)), decode_values(v)

    def retire(self, keys: list[IoKey]) -> list[tuple[IoKey, array.array]]:
        """Read these entries one last time and delete them (their cgroup is
        gone, so nothing can add to them any more)."""
        stats = self._maps["io_stats"]
        out = []
        for key in keys:
            raw = KEY.pack(*key)
            v = stats.lookup(raw)
            if v is not None:
                out.append((key, decode_values(v)))
            stats.delete(raw)
        return out

    def drops(self) -> dict[str, int]:
        """Updates lost because a map was full, by map name (summed over CPUs)."""
        health = self._maps["io_health"]
        return {name: sum(health.lookup_percpu_u64(struct.pack("I", i)))
                for i, name in enumerate(HEALTH)}

    # -- reporting ------------------------------------------------------------
    def modes(self) -> dict[str, str]:
        """probe name ('io.read', ...) -> hook mode in use."""
        return {f"io.{p.group.name}": p.mode for p in self.plans}
