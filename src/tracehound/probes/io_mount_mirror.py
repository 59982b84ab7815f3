"""The I/O probe's copy of the mount table in the kernel: the path prefixes
namespace calls are resolved against (mounts_by_path, io_mounts.bpf.h) and
the remembered mount decisions (.data.mounts), kept the table's at start and
whenever it changes, on a watcher thread of its own: never in a scrape, which
only re-reads the table to name mount ids."""
from __future__ import annotations

import logging
import select
import struct
import threading

from ..bpf.loader import Map
from ..host.mounts import MountTable
from .io_maps import PATH_LEN

log = logging.getLogger(__name__)

MOUNTS_SEEN_MAP = ".data.mounts"
MOUNTS_SEEN_SLOTS = 4096


class MountMirror:
    def __init__(self, mounts: MountTable, skip_fstypes: tuple[str, ...], lock: threading.Lock):
        self.mounts = mounts
        self.skip = set(skip_fstypes)
        self.lock = lock                  # the probe's, held while it reads or closes
        self.maps: dict[str, Map] = {}
        self._keys: set[bytes] = set()
        self._mirrors: list | None = None   # the table the trie was last built from
        self._watcher: threading.Thread | None = None
        self._stop = threading.Event()

    def sync(self, force: bool = False) -> None:
        """Bring the kernel's copy up to the table (re-read first)."""
        with self.lock:
            if self.maps:
                self.mounts.refresh()
                if force or self.mounts.mounts is not self._mirrors:
                    self._write()
                    self._mirrors = self.mounts.mounts

    def _write(self) -> None:
        # The kernel checks each remembered mount id against its super block's
        # device; forgetting them all when the table changes also covers an
        # id and a device number both reused by a new mount.
        self.maps[MOUNTS_SEEN_MAP].update(struct.pack("I", 0), bytes(8 * MOUNTS_SEEN_SLOTS))
        lpm = self.maps["mounts_by_path"]
        wanted: dict[bytes, bytes] = {}
        for m in self.mounts.mounts:  # later mounts hide earlier ones at the same point
            prefix = m.mountpoint.rstrip("/") + "/"
            # the kernel's bytes, also where they are not UTF-8
            raw = prefix.encode("utf-8", "surrogateescape")[:PATH_LEN]
            key = struct.pack("I", len(raw) * 8) + raw.ljust(PATH_LEN, b"\0")
            wanted[key] = struct.pack("II", m.mnt_id, 1 if m.fstype in self.skip else 0)
        for key in self._keys - wanted.keys():
            lpm.delete(key)
        for key, value in wanted.items():
            lpm.update(key, value)
        self._keys = set(wanted)

    def start(self, maps: dict[str, Map]) -> None:
        """Fill the kernel's copy (before any program sees a call)."""
        self.maps = maps
        self.sync(force=True)

    def watch(self) -> None:
        """Follow mount changes as they happen: the kernel flags
        /proc/self/mountinfo with POLLPRI on every mount or unmount, so a new
        file system's path prefix is known before its first namespace op. A
        sync that fails is retried every half second until one succeeds."""
        def run():
            with open(self.mounts.path) as f:
                poller = select.poll()
                poller.register(f, select.POLLPRI | select.POLLERR)
                failed = False
                while not self._stop.is_set():
                    if poller.poll(500):
                        f.seek(0)
                        f.read()  # re-arm
                    elif not failed:
                        continue
                    try:
                        self.sync()
                        failed = False
                    except Exception as exc:  # keep watching
                        if not failed:
                            log.warning("io probe: mount sync failed: %s", exc)
                        failed = True
        self._watcher = threading.Thread(target=run, name="mount-watcher", daemon=True)
        self._watcher.start()

    def stop(self) -> None:
        """Stop the watcher; the caller forgets the maps (under its lock)."""
        self._stop.set()
        if self._watcher is not None:
            self._watcher.join(timeout=2)
            self._watcher = None
        self._stop.clear()

    def forget(self) -> None:
        self.maps = {}
        self._keys = set()
        self._mirrors = None
