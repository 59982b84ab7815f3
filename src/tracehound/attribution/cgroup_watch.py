"""Learn cgroup paths as cgroups are created, through inotify.

A cgroup that is created, does its I/O and is removed between two scrapes
(a short job step, a cron pod) can no longer be found by walking the tree at
the next scrape: its kernel map entries would be exported under its bare id.
Watching every cgroup directory for new subdirectories records each path
while it exists, usually within a millisecond of its mkdir.
"""
from __future__ import annotations

import ctypes
import errno
import logging
import os
import select
import struct
import threading
from typing import Callable

log = logging.getLogger(__name__)

IN_CREATE, IN_DELETE = 0x100, 0x200
IN_Q_OVERFLOW, IN_IGNORED = 0x4000, 0x8000
IN_ONLYDIR, IN_ISDIR = 0x01000000, 0x40000000
IN_NONBLOCK, IN_CLOEXEC = os.O_NONBLOCK, os.O_CLOEXEC
EVENT = struct.Struct("iIII")  # wd, mask, cookie, len (then the name)

_libc = ctypes.CDLL(None, use_errno=True)


class CgroupWatcher:
    """Calls on_create(inode, path) for every cgroup directory below `root`,
    those there at start() included, and on_remove(path) for every one that
    goes, from its own thread. Events the kernel dropped (queue overflow)
    are not replayed: a scrape that meets an unknown id rescans anyway."""

    def __init__(self, root: str, on_create: Callable[[int, str], None],
                 on_remove: Callable[[str], None]):
        self.root = root.rstrip("/") or "/"
        self.on_create, self.on_remove = on_create, on_remove
        self._wd_path: dict[int, str] = {}
        self._wd_of: dict[str, int] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._full = False
        self.fd = _libc.inotify_init1(IN_NONBLOCK | IN_CLOEXEC)
        if self.fd < 0:
            raise OSError(ctypes.get_errno(), "inotify_init1 failed")

    def start(self) -> CgroupWatcher:
        self._watch_tree(self.root)
        self._thread = threading.Thread(target=self._run, name="cgroup-watcher", daemon=True)
        self._thread.start()
        return self

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=2)
            self._thread = None
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def _add_watch(self, path: str) -> bool:
        if self._full:
            return False
        # the name's own bytes: a cgroup named with bytes that are not UTF-8 is
        # kept as surrogates (surrogateescape) and must reach the kernel as it is
        wd = _libc.inotify_add_watch(self.fd, os.fsencode(path),
                                     IN_CREATE | IN_DELETE | IN_ONLYDIR)
        if wd < 0:
            err = ctypes.get_errno()
            if err == errno.ENOSPC:
                # fs.inotify.max_user_watches reached: scrapes still rescan
                log.warning("cgroup watcher: inotify watch limit reached; cgroups that live "
                            "shorter than a scrape interval may be exported by id only")
                self._full = True
            return False
        self._wd_path[wd] = path
        self._wd_of[path] = wd
        return True

    def _drop_watch(self, path: str) -> None:
        # cgroupfs keeps a removed directory's inode around, so the kernel
        # does not end the watch itself (no IN_IGNORED): end it here
        wd = self._wd_of.pop(path, None)
        if wd is not None:
            self._wd_path.pop(wd, None)
            _libc.inotify_rm_watch(self.fd, wd)

    def _watch_tree(self, top: str) -> None:
        """Watch `top` and everything below it, reporting each directory;
        subdirectories may have been made before the watch on their parent
        existed."""
        for dirpath, _dirs, _files in os.walk(top):
            if self._add_watch(dirpath):
                self._created(dirpath)

    def _created(self, path: str) -> None:
        try:
            ino = os.stat(path).st_ino
        except OSError:
            return  # already gone again
        self.on_create(ino, path[len(self.root):] or "/")

    def _run(self) -> None:
        poller = select.poll()
        poller.register(self.fd, select.POLLIN)
        while not self._stop.is_set():
            if not poller.poll(500):
                continue
            try:
                buf = os.read(self.fd, 1 << 16)
            except BlockingIOError:
                continue
            try:
                self._handle(buf)
            except Exception as exc:  # keep watching; scrapes rescan anyway
                log.warning("cgroup watcher: %s", exc)

    def _handle(self, buf: bytes) -> None:
        off = 0
        while off + EVENT.size <= len(buf):
            wd, mask, _cookie, length = EVENT.unpack_from(buf, off)
            name = buf[off + EVENT.size:off + EVENT.size + length].rstrip(b"\0").decode(
                errors="surrogateescape")
            off += EVENT.size + length
            if mask & IN_Q_OVERFLOW:
                continue
            if mask & IN_IGNORED:
                path = self._wd_path.pop(wd, None)
                if path is not None and self._wd_of.get(path) == wd:
                    del self._wd_of[path]
            elif mask & IN_ISDIR and wd in self._wd_path:
                path = os.path.join(self._wd_path[wd], name)
                if mask & IN_CREATE:
                    self._watch_tree(path)
                elif mask & IN_DELETE:
                    self._drop_watch(path)
                    self.on_remove(path[len(self.root):])
