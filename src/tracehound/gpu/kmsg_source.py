"""The kernel log as the watcher reads it: /dev/kmsg, one record per read.

Interface::

    source = DevKmsg()            # opened at the oldest record the ring holds
    source.read(timeout=0.5)      # b"prio,seq,usec,flags;text\n...", or None
    source.close()
"""
from __future__ import annotations

import os
import select
from typing import Protocol

DEFAULT_PATH = "/dev/kmsg"
BOOT_ID_PATH = "/proc/sys/kernel/random/boot_id"
# The kernel refuses (EINVAL) a read buffer smaller than the next record;
# a formatted record is at most 8 KiB.
READ_SIZE = 16384


class KmsgSource(Protocol):
    """read(): one record, or None when none came within `timeout` seconds;
    BrokenPipeError when records were overwritten before being read (the
    next read returns the oldest record still held)."""
    def read(self, timeout: float) -> bytes | None: ...
    def close(self) -> None: ...


class DevKmsg:
    """/dev/kmsg opened at its oldest record, read without blocking."""

    def __init__(self, path: str = DEFAULT_PATH):
        self.fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        self._poll = select.poll()
        self._poll.register(self.fd, select.POLLIN)

    def read(self, timeout: float) -> bytes | None:
        for attempt in (0, 1):
            try:
                return os.read(self.fd, READ_SIZE)
            except BlockingIOError:
                # a reader that was overtaken wakes with POLLERR; its read says EPIPE
                if attempt or not self._poll.poll(max(0, int(timeout * 1000))):
                    return None
        return None

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


def read_boot_id(path: str = BOOT_ID_PATH) -> str | None:
    try:
        with open(path) as f:
            return f.read().strip() or None
    except OSError:
        return None
