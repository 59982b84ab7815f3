"""TCP socket state per cgroup at scrape time, from the kernel's socket
diagnostics (NETLINK_SOCK_DIAG, inet_diag): what `ss -ti` reads, without
running it.

Only established IPv4 and IPv6 TCP sockets are asked for; each answer
carries struct tcp_info (INET_DIAG_INFO) and the id of the cgroup the
socket was created in (INET_DIAG_CGROUP_ID). A netlink socket sees its own
network namespace only, so with `all_netns` one is opened in every
namespace a process lives in (containers, pods without host networking).

Reading stops after `max_sockets`, and the scan says it was cut short. The
parser never trusts a length: a short, odd or overlong message is skipped,
never raised on.
"""
from __future__ import annotations

import ctypes
import os
import socket
import struct
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import NamedTuple

NETLINK_SOCK_DIAG = 4
SOCK_DIAG_BY_FAMILY = 20
NLM_F_REQUEST = 0x1
NLM_F_DUMP = 0x300
NLMSG_ERROR = 2
NLMSG_DONE = 3
INET_DIAG_INFO = 2
INET_DIAG_CGROUP_ID = 21
TCP_ESTABLISHED = 1
CLONE_NEWNET = 0x40000000

NLMSG = struct.Struct("=IHHII")             # struct nlmsghdr
REQ = struct.Struct("=BBBBI48s")            # struct inet_diag_req_v2
DIAG_MSG = struct.Struct("=BBBB48sIIIII")   # struct inet_diag_msg
RTA = struct.Struct("=HH")                  # struct rtattr
U64 = struct.Struct("=Q")
ERR = struct.Struct("=i")
# struct tcp_info (linux/tcp.h): the offsets of the fields read. Older
# kernels send a shorter struct; a field past its end reads as 0.
TI_BACKOFF = 4                              # __u8: RTO backoffs of the head segment
TI_RTT = struct.Struct("=I"), 68            # smoothed RTT, us
TI_TOTAL_RETRANS = struct.Struct("=I"), 100
TI_BYTES = struct.Struct("=QQ"), 120        # bytes_acked, bytes_received

RECV_BUFFER = 1 << 16
TIMEOUT_S = 5.0


class TcpSocket(NamedTuple):
    cgroup_id: int
    rtt_us: int
    bytes_acked: int
    bytes_received: int
    total_retrans: int
    backoff: int


@dataclass
class CgroupTcp:
    """The established sockets of one cgroup, summed."""
    sockets: int = 0
    rtt_sockets: int = 0        # of which have an RTT sample
    rtt_sum_us: int = 0
    rtt_max_us: int = 0
    bytes_acked: int = 0
    bytes_received: int = 0
    total_retrans: int = 0      # of the live sockets: falls when one closes
    backing_off: int = 0        # sockets whose retransmission timer is backing off

    def add(self, s: TcpSocket) -> None:
        self.sockets += 1
        if s.rtt_us:
            self.rtt_sockets += 1
            self.rtt_sum_us += s.rtt_us
            self.rtt_max_us = max(self.rtt_max_us, s.rtt_us)
        self.bytes_acked += s.bytes_acked
        self.bytes_received += s.bytes_received
        self.total_retrans += s.total_retrans
        self.backing_off += s.backoff > 0

    @property
    def rtt_mean_us(self) -> float:
        return self.rtt_sum_us / self.rtt_sockets if self.rtt_sockets else 0.0


@dataclass
class Scan:
    cgroups: dict[int, CgroupTcp] = field(default_factory=dict)
    sockets: int = 0            # read, over every namespace
    truncated: bool = False     # stopped at max_sockets
    namespaces: int = 0         # network namespaces read
    errors: list[str] = field(default_factory=list)

    def add(self, s: TcpSocket) -> None:
        self.sockets += 1
        c = self.cgroups.get(s.cgroup_id)
        if c is None:
            c = self.cgroups[s.cgroup_id] = CgroupTcp()
        c.add(s)


def progress(scan: Scan) -> dict[int, int]:
    """cgroup id -> bytes acknowledged by peers + bytes received, over its
    live sockets: for the stall detector (it moves while data moves)."""
    return {cgid: c.bytes_acked + c.bytes_received for cgid, c in scan.cgroups.items()}


# --- messages -----------------------------------------------------------------

def request(family: int, seq: int) -> bytes:
    """A dump request for the established TCP sockets of one family, with
    their tcp_info."""
    body = REQ.pack(family, socket.IPPROTO_TCP, 1 << (INET_DIAG_INFO - 1), 0,
                    1 << TCP_ESTABLISHED, bytes(48))
    return NLMSG.pack(NLMSG.size + len(body), SOCK_DIAG_BY_FAMILY,
                      NLM_F_REQUEST | NLM_F_DUMP, seq, 0) + body


class Batch(NamedTuple):
    sockets: list[TcpSocket]
    done: bool                  # NLMSG_DONE seen: the dump is complete
    error: int                  # a negative errno from NLMSG_ERROR, else 0


def parse(buf: bytes) -> Batch:
    """One datagram of a dump: the sockets in it, and whether it ended it."""
    out: list[TcpSocket] = []
    pos, end = 0, len(buf)
    while pos + NLMSG.size <= end:
        length, kind, _flags, _seq, _pid = NLMSG.unpack_from(buf, pos)
        if length < NLMSG.size or pos + length > end:
            break               # nothing after a bad length can be framed
        payload = buf[pos + NLMSG.size:pos + length]
        pos += (length + 3) & ~3
        if kind == NLMSG_DONE:
            return Batch(out, True, 0)
        if kind == NLMSG_ERROR:
            err = ERR.unpack_from(payload)[0] if len(payload) >= ERR.size else -1
            if err:
                return Batch(out, True, err)
            continue            # an acknowledgement
        if kind == SOCK_DIAG_BY_FAMILY:
            sock = parse_socket(payload)
            if sock is not None:
                out.append(sock)
    return Batch(out, False, 0)


def parse_socket(payload: bytes) -> TcpSocket | None:
    """struct inet_diag_msg and its attributes; None when too short."""
    if len(payload) < DIAG_MSG.size:
        return None
    cgroup_id, info = 0, b""
    for kind, value in attributes(payload, DIAG_MSG.size):
        if kind == INET_DIAG_CGROUP_ID and len(value) >= U64.size:
            cgroup_id = U64.unpack_from(value)[0]
        elif kind == INET_DIAG_INFO:
            info = value
    return TcpSocket(cgroup_id, _field(info, *TI_RTT), *_pair(info, *TI_BYTES),
                     _field(info, *TI_TOTAL_RETRANS),
                     info[TI_BACKOFF] if len(info) > TI_BACKOFF else 0)


def attributes(buf: bytes, pos: int) -> Iterator[tuple[int, bytes]]:
    """(type, value) of each rtattr from pos on, until one does not fit."""
    end = len(buf)
    while pos + RTA.size <= end:
        length, kind = RTA.unpack_from(buf, pos)
        if length < RTA.size or pos + length > end:
            return
        yield kind & 0x3FFF, buf[pos + RTA.size:pos + length]   # without NLA_F_ flags
        pos += (length + 3) & ~3


def _field(info: bytes, fmt: struct.Struct, at: int) -> int:
    return fmt.unpack_from(info, at)[0] if len(info) >= at + fmt.size else 0


def _pair(info: bytes, fmt: struct.Struct, at: int) -> tuple[int, int]:
    return fmt.unpack_from(info, at) if len(info) >= at + fmt.size else (0, 0)


# --- reading --------------------------------------------------------------------

def open_socket(netns: str | None = None) -> socket.socket:
    """A sock_diag socket in this network namespace, or in the one a
    /proc/PID/ns/net path names (it stays bound to that namespace)."""
    if netns is None:
        return _netlink()
    box: dict = {}

    def body():
        try:
            fd = os.open(netns, os.O_RDONLY | os.O_CLOEXEC)
            try:
                if _libc().setns(fd, CLONE_NEWNET) != 0:
                    raise OSError(ctypes.get_errno(), f"setns {netns}: "
                                  + os.strerror(ctypes.get_errno()))
            finally:
                os.close(fd)
            box["sock"] = _netlink()
        except OSError as exc:
            box["error"] = exc

    # setns moves the calling thread only: a thread that ends right after
    t = threading.Thread(target=body, name="sockdiag-netns", daemon=True)
    t.start()
    t.join()
    if "error" in box:
        raise box["error"]
    return box["sock"]


def _netlink() -> socket.socket:
    s = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW | socket.SOCK_CLOEXEC,
                      NETLINK_SOCK_DIAG)
    s.settimeout(TIMEOUT_S)
    return s


_LIBC = None


def _libc():
    global _LIBC
    if _LIBC is None:
        _LIBC = ctypes.CDLL(None, use_errno=True)
    return _LIBC


def dump(sock: socket.socket, scan: Scan, max_sockets: int) -> None:
    """Add the established TCP sockets of sock's namespace to scan, both
    families, stopping once scan holds max_sockets."""
    buf = bytearray(RECV_BUFFER)
    for seq, family in enumerate((socket.AF_INET, socket.AF_INET6), start=1):
        sock.sendto(request(family, seq), (0, 0))
        while True:
            n = sock.recv_into(buf)
            batch = parse(bytes(buf[:n]))
            for s in batch.sockets:
                if scan.sockets >= max_sockets:
                    scan.truncated = True
                    return      # closing the socket drops the rest of the dump
                scan.add(s)
            if batch.error:
                raise OSError(-batch.error, f"sock_diag {family_name(family)}: "
                              + os.strerror(-batch.error))
            if batch.done or n == 0:
                break


def family_name(family: int) -> str:
    return "IPv6" if family == socket.AF_INET6 else "IPv4"


def namespaces(proc: str = "/proc") -> list[str]:
    """A /proc/PID/ns/net path for each network namespace other than this
    process's own that some process is in."""
    try:
        own = os.stat(f"{proc}/self/ns/net").st_ino
    except OSError:
        return []
    found: dict[int, str] = {own: ""}
    try:
        pids = [p for p in os.listdir(proc) if p.isdigit()]
    except OSError:
        return []
    for pid in pids:
        path = f"{proc}/{pid}/ns/net"
        try:
            ino = os.stat(path).st_ino
        except OSError:
            continue            # gone, or a kernel thread
        found.setdefault(ino, path)
    return [p for p in found.values() if p]


def scan(max_sockets: int, all_netns: bool = True, netns: list[str] | None = None) -> Scan:
    """Established TCP sockets per cgroup: this namespace's, and with
    all_netns every other one a process is in (or those named in netns)."""
    out = Scan()
    paths = [None, *(namespaces() if all_netns else [])] if netns is None else netns
    for path in paths:
        if out.truncated:
            break
        try:
            with open_socket(path) as sock:
                out.namespaces += 1
                dump(sock, out, max_sockets)
        except OSError as exc:   # a namespace that went away, or no permission
            out.errors.append(f"{path or 'own namespace'}: {exc.strerror or exc}")
    return out


class SockDiag:
    """Scans shared by a scrape and the stall detector: a scan younger than
    reuse_s is handed out again instead of asking the kernel twice."""

    def __init__(self, max_sockets: int, all_netns: bool = True, reuse_s: float = 1.0,
                 scanner=scan):
        self.max_sockets = max_sockets
        self.all_netns = all_netns
        self.reuse_s = reuse_s
        self._scanner = scanner
        self._last: tuple[float, Scan] | None = None
        self._lock = threading.Lock()
        self.scans = 0
        self.truncated_scans = 0

    def scan(self) -> Scan:
        with self._lock:
            now = time.monotonic()
            if self._last is not None and now - self._last[0] < self.reuse_s:
                return self._last[1]
            result = self._scanner(self.max_sockets, self.all_netns)
            self.scans += 1
            self.truncated_scans += result.truncated
            self._last = (now, result)
            return result

    def progress(self) -> dict[int, int]:
        return progress(self.scan())
