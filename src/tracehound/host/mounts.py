"""The mount table as the kernel reports it in /proc/self/mountinfo."""
from __future__ import annotations

import os
import re
from dataclasses import dataclass

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


def parse_mountinfo(text: str) -> list[Mount]:
    mounts = []
    for line in text.splitlines():
        parts = line.split()
        if len(parts) < 10 or "-" not in parts:
            continue
        sep = parts.index("-", 6)
        major, minor = (int(x) for x in parts[2].split(":"))
        mounts.append(Mount(
            mnt_id=int(parts[0]),
            dev=(major << 20) | minor,
            mountpoint=_unescape(parts[4]),
            fstype=parts[sep + 1],
            source=_unescape(parts[sep + 2]) if len(parts) > sep + 2 else "",
        ))
    return mounts


class MountTable:
    """Mount id and device lookups, re-read only when mountinfo changes."""

    def __init__(self, path: str = "/proc/self/mountinfo"):
        self.path = path
        self._raw = ""
        self.mounts: list[Mount] = []
        self.by_id: dict[int, Mount] = {}
        self.by_dev: dict[int, Mount] = {}
        self.refresh()

    def refresh(self) -> bool:
        """Re-read the table; True when it changed."""
        with open(self.path) as f:
            raw = f.read()
        if raw == self._raw:
            return False
        self._raw = raw
        self.mounts = parse_mountinfo(raw)
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
        return os.stat(os.path.join(os.path.dirname(self.path), "ns", "mnt")).st_ino

    def cgroup2_root(self) -> str | None:
        for m in self.mounts:
            if m.fstype == "cgroup2":
                return m.mountpoint
        return None
