"""The mount table as the kernel reports it in /proc/self/mountinfo."""
from __future__ import annotations

import os
import re
import stat
from dataclasses import dataclass

from ..errors import SetupError

# File systems that hold no user data, skipped by default. Pipes, sockets
# and anonymous inodes live on internal mounts (pipefs, sockfs, anon_inodefs).
DEFAULT_SKIP_FSTYPES = (
    "proc", "sysfs", "cgroup", "cgroup2", "devtmpfs", "devpts", "debugfs", "tracefs",
    "securityfs", "bpf", "pstore", "configfs", "fusectl", "mqueue", "hugetlbfs",
    "binfmt_misc", "autofs", "efivarfs", "rpc_pipefs", "nsfs", "pipefs", "sockfs",
    "anon_inodefs", "pidfs", "selinuxfs", "bdev",
)

_ESCAPE = re.compile(r"\\([0-7]{3})")


def _unescape(field: str) -> str:
    return _ESCAPE.sub(lambda m: chr(int(m.group(1), 8)), field)


@dataclass(frozen=True)
class Mount:
    mnt_id: int
    dev: int            # kernel dev_t encoding: major << 20 | minor
    mountpoint: str
    fstype: str
    source: str
    options: str = ""   # the super block's options: a v1 cgroup mount names its controllers here
    root: str = "/"     # the directory of the file system mounted here


# A host with ten thousand mounts has a table of about 1.5 MB; a file that a
# user points --mountinfo at (/dev/zero, a log) must not be read without end.
MAX_TABLE_BYTES = 16 << 20


class MountTableError(SetupError):
    """The mount table cannot be read or is not one."""


def _mount(line: str) -> Mount:
    # The kernel separates fields with one space and escapes only space, tab,
    # newline and backslash: str.split() would also cut a path at \r, \f or
    # U+2028, which a mount point may hold.
    parts = line.split(" ")
    sep = parts.index("-", 6)
    major, minor = (int(x) for x in parts[2].split(":"))
    if len(parts) < sep + 2 or not parts[sep + 1]:
        raise ValueError("no file-system type")
    return Mount(
        mnt_id=int(parts[0]),
        dev=(major << 20) | minor,
        mountpoint=_unescape(parts[4]),
        fstype=parts[sep + 1],
        source=_unescape(parts[sep + 2]) if len(parts) > sep + 2 else "",
        options=parts[sep + 3] if len(parts) > sep + 3 else "",
        root=_unescape(parts[3]),
    )


def parse_mountinfo(text: str, where: str = "mountinfo") -> list[Mount]:
    """Every line must be a mountinfo line: a table with a broken one is
    not the kernel's, and half of it would label I/O wrongly."""
    mounts = []
    for n, line in enumerate(text.split("\n"), 1):
        if not line.strip():
            continue
        try:
            mounts.append(_mount(line))
        except (ValueError, IndexError):
            raise MountTableError(f"{where}: line {n} is not a mountinfo line: "
                                  f"{line[:80]!r}") from None
    return mounts


def read_table(path: str) -> str:
    """The table's text: a regular file (as /proc's are) of at most
    MAX_TABLE_BYTES; never a FIFO or a device, which could block or never end."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        raise MountTableError(f"{path}: {exc.strerror}") from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise MountTableError(f"{path}: not a regular file (a mount table is "
                                  "/proc/PID/mountinfo or a copy of one)")
        chunks, size = [], 0
        while size <= MAX_TABLE_BYTES:
            chunk = os.read(fd, 1 << 20)
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
        raw = b"".join(chunks)
    except OSError as exc:
        raise MountTableError(f"{path}: {exc.strerror}") from None
    finally:
        os.close(fd)
    if len(raw) > MAX_TABLE_BYTES:
        raise MountTableError(f"{path}: larger than {MAX_TABLE_BYTES >> 20} MiB: not a mount table")
    # paths are bytes to the kernel: keep any that are not UTF-8 intact
    return raw.decode("utf-8", "surrogateescape")


class MountTable:
    """Mount id and device lookups, re-read only when mountinfo changes."""

    def __init__(self, path: str = "/proc/self/mountinfo"):
        self.path = path
        self._raw: str | None = None
        self.mounts: list[Mount] = []
        self.by_id: dict[int, Mount] = {}
        self.by_dev: dict[int, Mount] = {}
        self.refresh()

    def refresh(self) -> bool:
        """Re-read the table; True when it changed. Raises MountTableError
        (the table is left as it was) when the file cannot be read or is not
        a mount table."""
        raw = read_table(self.path)
        if raw == self._raw:
            return False
        mounts = parse_mountinfo(raw, self.path)
        if not mounts:
            raise MountTableError(f"{self.path}: no mounts in it")
        self._raw = raw
        self.mounts = mounts
        self.by_id = {m.mnt_id: m for m in self.mounts}
        by_dev: dict[int, Mount] = {}
        for m in self.mounts:
            # A bind mount shares its device with the original: keep the first.
            by_dev.setdefault(m.dev, m)
        self.by_dev = by_dev
        return True

    def mount_namespace_inode(self) -> int:
        """The mount namespace the table describes: that of the process whose
        mountinfo it reads (/proc/1/... for the host's, from a container)."""
        ns = os.path.join(os.path.dirname(self.path), "ns", "mnt")
        try:
            return os.stat(ns).st_ino
        except OSError as exc:
            raise MountTableError(
                f"{self.path}: no mount namespace beside it ({ns}: {exc.strerror}); the "
                "table must be a live /proc/PID/mountinfo, not a copy") from None

    def cgroup2_root(self) -> str | None:
        for m in self.mounts:
            if m.fstype == "cgroup2":
                return m.mountpoint
        return None
