"""RDMA port state and counters, read from sysfs.

For each device under /sys/class/infiniband and each of its ports:

  ports/<n>/state, phys_state   "4: ACTIVE", "5: LinkUp" (code and name)
  ports/<n>/rate, link_layer    "100 Gb/sec (4X EDR)", "InfiniBand" / "Ethernet"
  ports/<n>/gid_attrs/ndevs/0   the netdev of a RoCE port (an IB port has none)
  ports/<n>/counters/*          IB PMA counters; only devices that answer
                                management datagrams have them. Soft-RoCE
                                (rxe) has no counters/ directory at all.
  ports/<n>/hw_counters/*       the driver's own counters (rxe: sent_pkts,
                                rcvd_pkts, out_of_seq_request, rcvd_rnr_err,
                                retry_exceeded_err, link_downed, ...)
  <dev>/hw_counters/*           device-wide driver counters, where a driver
                                has any (rxe has none)

hw_counters/lifespan is the kernel's cache time for those counters in ms, a
setting and no counter, so it is left out.

PMA port_xmit_data and port_rcv_data count 4-octet words, as the IB spec
defines them; they are kept as read (the collector also exports them x4 as
bytes). PMA error counters saturate at their width instead of wrapping.

Reading never raises. A value that is not an unsigned integer, a file larger
than max_bytes, a name that is not a plain identifier, a file the kernel
refuses to read, and a device, port or file that vanishes between listing and
reading are skipped and counted by reason (read_errors()). Optional files
and directories that are simply absent are not errors. Everything is read
with openat() relative to directory fds, which is cheaper than building
paths and cannot wander into a different device that reused a name.
"""
from __future__ import annotations

import errno
import os
import re
import threading
from dataclasses import dataclass, field

SYSFS_ROOT = "/sys/class/infiniband"
# sysfs hands out at most a page per attribute; anything longer is not sysfs
MAX_VALUE_BYTES = 4096
# 2**64 - 1 has 20 digits: a longer number is no hardware counter
MAX_DIGITS = 20
# hw_counters entries that are settings, not counters
NOT_COUNTERS = frozenset({"lifespan"})
UP_STATES = frozenset({"ACTIVE", "ACTIVE_DEFER"})
READ_ERROR_REASONS = ("malformed", "too_large", "unreadable", "vanished", "bad_name")

# device, port and counter names end up as label values: plain ASCII only
_NAME = re.compile(r"[A-Za-z0-9_.:+-]{1,64}")
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC
# O_NONBLOCK: a FIFO planted where a counter should be must not hang a scrape
_FILE_FLAGS = os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK
_GONE = (errno.ENOENT, errno.ENODEV, errno.ENXIO)


@dataclass
class PortSample:
    device: str
    port: int
    state: str = ""                  # "ACTIVE"; "" where unreadable
    state_id: int | None = None      # 4
    phys_state: str = ""             # "LinkUp"
    phys_state_id: int | None = None  # 5
    rate: str = ""                   # as sysfs writes it
    link_layer: str = ""
    netdev: str = ""
    counters: dict[str, int] = field(default_factory=dict)
    hw_counters: dict[str, int] = field(default_factory=dict)

    @property
    def up(self) -> bool:
        return self.state in UP_STATES


@dataclass
class PortsSnapshot:
    ports: list[PortSample] = field(default_factory=list)
    device_hw_counters: dict[str, dict[str, int]] = field(default_factory=dict)


def rate_bytes_per_second(rate: str) -> float | None:
    """'100 Gb/sec (4X EDR)' -> 12.5e9; None when not in that form."""
    head = rate.split(" ", 2)
    if len(head) < 2 or head[1] != "Gb/sec":
        return None
    try:
        gbps = float(head[0])
    except ValueError:
        return None
    return gbps * 1e9 / 8 if gbps >= 0 else None


def parse_counter(raw: bytes) -> int | None:
    value = raw.strip()
    # bytes.isdigit is ASCII-only: no '²', no sign, no '0x'
    if not value or len(value) > MAX_DIGITS or not value.isdigit():
        return None
    return int(value)


def parse_state(raw: bytes) -> tuple[int, str] | None:
    """b'4: ACTIVE' -> (4, 'ACTIVE'); names may hold spaces ('Phy Test')."""
    code, sep, name = raw.strip().partition(b":")
    name = name.strip()
    if not sep or not code.isdigit() or len(code) > 3 or not name or len(name) > 64:
        return None
    if any(c < 0x20 or c > 0x7E for c in name):
        return None
    return int(code), name.decode("ascii")


def _text(raw: bytes | None) -> str:
    if raw is None:
        return ""
    raw = raw.strip()
    if len(raw) > 128 or any(c < 0x20 or c > 0x7E for c in raw):
        return ""
    return raw.decode("ascii")


class _Pass:
    """One walk over the tree; its skips are added to the reader's totals
    once, at the end, under the reader's lock."""

    def __init__(self, max_bytes: int):
        self.max_bytes = max_bytes
        self.errors: dict[str, int] = {}

    def skip(self, reason: str) -> None:
        self.errors[reason] = self.errors.get(reason, 0) + 1

    def open_dir(self, name: str, dir_fd: int | None, listed: bool) -> int | None:
        """`listed`: the name came from a listing a moment ago, so its absence
        now means it vanished; otherwise it is an optional directory."""
        try:
            return os.open(name, _DIR_FLAGS, dir_fd=dir_fd)
        except OSError as exc:
            if exc.errno in _GONE:
                if listed:
                    self.skip("vanished")
            elif exc.errno != errno.ENOTDIR:
                self.skip("unreadable")
            return None

    def names(self, dir_fd: int) -> list[str]:
        """Plain entries (sysfs attributes and device links) of a directory."""
        out = []
        try:
            with os.scandir(dir_fd) as it:
                for entry in it:
                    if _NAME.fullmatch(entry.name):
                        out.append(entry.name)
                    else:
                        self.skip("bad_name")
        except OSError as exc:
            self.skip("vanished" if exc.errno in _GONE else "unreadable")
        out.sort()
        return out

    def read(self, name: str, dir_fd: int, listed: bool = False, quiet: bool = False) -> bytes | None:
        """At most max_bytes of one file; None, counted, when that fails.
        `quiet`: a file that may legitimately refuse reads (ndevs/0 of an IB port)."""
        try:
            fd = os.open(name, _FILE_FLAGS, dir_fd=dir_fd)
        except OSError as exc:
            if exc.errno in _GONE:
                if listed:
                    self.skip("vanished")
            elif not quiet:
                self.skip("unreadable")
            return None
        try:
            data = os.read(fd, self.max_bytes + 1)
        except OSError as exc:
            if not quiet:
                self.skip("vanished" if exc.errno in _GONE else "unreadable")
            return None
        finally:
            os.close(fd)
        if len(data) > self.max_bytes:
            self.skip("too_large")
            return None
        return data

    def counter_dir(self, name: str, parent_fd: int, only: str | None = None) -> dict[str, int]:
        out: dict[str, int] = {}
        dir_fd = self.open_dir(name, parent_fd, listed=False)
        if dir_fd is None:
            return out
        try:
            for entry in ([only] if only else self.names(dir_fd)):
                if entry in NOT_COUNTERS:
                    continue
                raw = self.read(entry, dir_fd, listed=not only)
                if raw is None:
                    continue
                value = parse_counter(raw)
                if value is None:
                    self.skip("malformed")
                else:
                    out[entry] = value
        finally:
            os.close(dir_fd)
        return out

    def state(self, name: str, port_fd: int) -> tuple[int | None, str]:
        raw = self.read(name, port_fd)
        if raw is None:
            return None, ""
        parsed = parse_state(raw)
        if parsed is None:
            self.skip("malformed")
            return None, ""
        return parsed

    def port(self, device: str, name: str, ports_fd: int, full: bool) -> PortSample | None:
        port_fd = self.open_dir(name, ports_fd, listed=True)
        if port_fd is None:
            return None
        try:
            p = PortSample(device, int(name))
            p.state_id, p.state = self.state("state", port_fd)
            p.phys_state_id, p.phys_state = self.state("phys_state", port_fd)
            p.netdev = _text(self.read("gid_attrs/ndevs/0", port_fd, quiet=True))
            if full:
                p.rate = _text(self.read("rate", port_fd))
                p.link_layer = _text(self.read("link_layer", port_fd))
                p.counters = self.counter_dir("counters", port_fd)
                p.hw_counters = self.counter_dir("hw_counters", port_fd)
            else:
                p.counters = self.counter_dir("counters", port_fd, only="link_downed")
                p.hw_counters = self.counter_dir("hw_counters", port_fd, only="link_downed")
            return p
        finally:
            os.close(port_fd)

    def device(self, device: str, root_fd: int, full: bool, snap: PortsSnapshot) -> None:
        dev_fd = self.open_dir(device, root_fd, listed=True)
        if dev_fd is None:
            return
        try:
            ports_fd = self.open_dir("ports", dev_fd, listed=False)
            if ports_fd is not None:
                try:
                    # numeric order: port 10 after port 2
                    for name in sorted(self.names(ports_fd), key=lambda n: (len(n), n)):
                        if not name.isdigit() or len(name) > 3:
                            self.skip("bad_name")
                            continue
                        port = self.port(device, name, ports_fd, full)
                        if port is not None:
                            snap.ports.append(port)
                finally:
                    os.close(ports_fd)
            if full:
                counters = self.counter_dir("hw_counters", dev_fd)
                if counters:
                    snap.device_hw_counters[device] = counters
        finally:
            os.close(dev_fd)


class PortReader:
    """Reads every RDMA port under `root`; safe to share between the scrape
    thread and the detector thread."""

    def __init__(self, root: str = SYSFS_ROOT, max_bytes: int = MAX_VALUE_BYTES):
        self.root = root
        self.max_bytes = max_bytes
        self._lock = threading.Lock()
        self._errors = dict.fromkeys(READ_ERROR_REASONS, 0)

    def read(self, full: bool = True) -> PortsSnapshot:
        """full=False reads only what a link watcher needs, often: state,
        phys_state, netdev and the link_downed counters (PMA and driver)."""
        walk = _Pass(self.max_bytes)
        snap = PortsSnapshot()
        # no RDMA at all is the common case, not an error
        root_fd = walk.open_dir(self.root, None, listed=False)
        if root_fd is not None:
            try:
                for device in walk.names(root_fd):
                    walk.device(device, root_fd, full, snap)
            finally:
                os.close(root_fd)
        if walk.errors:
            with self._lock:
                for reason, n in walk.errors.items():
                    self._errors[reason] += n
        return snap

    def read_errors(self) -> dict[str, int]:
        """Values skipped since the reader was made, by reason."""
        with self._lock:
            return dict(self._errors)
