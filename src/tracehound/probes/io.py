"""Loader for io.bpf.o: picks a hook mode per group, loads, attaches, and
keeps the probe's configuration maps (skip list, mount prefixes) current."""
from __future__ import annotations

import logging
import select
import struct
import threading
from dataclasses import dataclass

from ..bpf import features
from ..bpf.loader import BpfObject
from ..errors import ProbeError, TracehoundError
from ..host.mounts import DEFAULT_SKIP_FSTYPES, MountTable
from . import object_path

log = logging.getLogger(__name__)

FSTYPE_LEN = 16
PATH_LEN = 256
MAX_RETRIES = 8


@dataclass
class IoProbeConfig:
    hook_mode: str = "auto"
    skip_fstypes: tuple[str, ...] = DEFAULT_SKIP_FSTYPES
    max_entries: int = 8192


class IoProbe:
    """The loaded and attached I/O probe. Use as a context manager."""

    name = "io"

    def __init__(self, config: IoProbeConfig, mounts: MountTable):
        self.config = config
        self.mounts = mounts
        self.obj: BpfObject | None = None
        self.plans: list[features.GroupPlan] = []
        self._lpm_keys: set[bytes] = set()
        self._lock = threading.Lock()
        self._watcher: threading.Thread | None = None
        self._stop = threading.Event()

    # -- lifecycle --------------------------------------------------------
    def start(self) -> "IoProbe":
        demoted: dict[str, set[str]] = {}
        for _ in range(MAX_RETRIES):
            self.plans = features.plan(features.IO_GROUPS, self.config.hook_mode, demoted)
            unusable = [p for p in self.plans if p.mode is None]
            if unusable:
                p = unusable[0]
                why = "; ".join(f"{m}: {c.reason}" for m, c in p.checks.items())
                raise TracehoundError(f"io probe: no usable hook for {p.group.name} ({why})")
            try:
                self._load_and_attach()
                return self
            except ProbeError as exc:
                group = self._group_of(exc.program)
                if self.config.hook_mode != "auto" or group is None:
                    raise
                mode = next(p.mode for p in self.plans if p.group.name == group)
                log.warning("io probe: %s in %s mode failed (%s); trying the next mode",
                            group, mode, exc.reason)
                demoted.setdefault(group, set()).add(mode)
        raise TracehoundError("io probe: gave up after repeated load/attach failures")

    def _group_of(self, program: str) -> str | None:
        for p in self.plans:
            if program in p.group.programs(p.mode):
                return p.group.name
        return None

    def _load_and_attach(self) -> None:
        self.close()
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
            self._configure()
            obj.attach_all()
            self._start_watcher()
        except BaseException:
            obj.close()
            self.obj = None
            raise

    def close(self) -> None:
        self._stop.set()
        if self._watcher is not None:
            self._watcher.join(timeout=2)
            self._watcher = None
        with self._lock:
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
        skip = self.obj.map("skip_fstypes")
        for name in self.config.skip_fstypes:
            raw = name.encode()[:FSTYPE_LEN - 1]
            skip.update(raw.ljust(FSTYPE_LEN, b"\0"), b"\1")
        tp_ops = sum(p.group.op_mask for p in self.plans if p.mode == "tracepoint")
        self.obj.map("io_config").update(
            struct.pack("I", 0), struct.pack("II", self.mounts.mount_namespace_inode(), tp_ops))
        self.sync_mounts(force=True)

    def sync_mounts(self, force: bool = False) -> None:
        """Mirror mount points into the LPM trie used for absolute paths."""
        with self._lock:
            if self.obj is not None and (self.mounts.refresh() or force):
                self._sync_lpm()

    def _sync_lpm(self) -> None:
        # Unmounted vfsmount addresses may be reused: forget cached ids.
        cache = self.obj.map("mnt_cache")
        for key in list(cache.keys()):
            cache.delete(key)
        lpm = self.obj.map("mounts_by_path")
        skip = set(self.config.skip_fstypes)
        wanted: dict[bytes, bytes] = {}
        for m in self.mounts.mounts:  # later mounts hide earlier ones at the same point
            prefix = m.mountpoint.rstrip("/") + "/"
            raw = prefix.encode()[:PATH_LEN]
            key = struct.pack("I", len(raw) * 8) + raw.ljust(PATH_LEN, b"\0")
            wanted[key] = struct.pack("II", m.mnt_id, 1 if m.fstype in skip else 0)
        for key in self._lpm_keys - wanted.keys():
            lpm.delete(key)
        for key, value in wanted.items():
            lpm.update(key, value)
        self._lpm_keys = set(wanted)

    # -- reporting ------------------------------------------------------------
    def modes(self) -> dict[str, str]:
        """probe name ('io.read', ...) -> hook mode in use."""
        return {f"io.{p.group.name}": p.mode for p in self.plans}
