"""Reading the local agent over its root-only Unix socket (exporter/local.py).

    body = read_local("/run/tracehound/default.sock", "/health", timeout=2.0)

What an answer here proves: a process running as root served it, from a
socket in a directory only root can write. Before connecting, the socket and
its directory are checked (a socket owned by root, mode without group or
other bits, in a root-owned directory no one else may write); after, the
server's SO_PEERCRED uid must be 0. Any failure raises LocalAgentError whose
text is the cause, in words an operator reads in a drain reason.
"""
from __future__ import annotations

import errno
import http.client
import os
import socket
import stat
import struct
import time

from .. import defaults

# far above the health families of any agent
MAX_BODY = 8 << 20
_UCRED = struct.Struct("3i")        # pid, uid, gid


def socket_path(instance: str, run_dir: str = defaults.RUN_DIR) -> str:
    """Where instance `instance` serves its local channel."""
    return os.path.join(run_dir, f"{instance}.sock")


def peer_uid(sock: socket.socket) -> int | None:
    """The uid of the process at the other end of a Unix socket, as the
    kernel recorded it at connect (or listen) time."""
    try:
        raw = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _UCRED.size)
    except OSError:
        return None
    return _UCRED.unpack(raw)[1]


def root_peer(sock: socket.socket) -> bool:
    return peer_uid(sock) == 0


def trusted_directory(path: str) -> str | None:
    """None when `path` is a real directory owned by root that no one else
    may write; else why not."""
    try:
        st = os.lstat(path)
    except OSError as exc:
        return f"{path}: {exc.strerror}"
    if not stat.S_ISDIR(st.st_mode):
        return f"{path} is not a directory"
    if st.st_uid != 0:
        return f"{path} is owned by uid {st.st_uid}, not root"
    if st.st_mode & 0o022:
        return f"{path} is writable by others (mode {stat.S_IMODE(st.st_mode):o})"
    return None


class LocalAgentError(Exception):
    """Why the agent's answer could not be had (str: the cause)."""

    def __init__(self, cause: str, transient: bool = False):
        super().__init__(cause)
        self.transient = transient      # starting up: worth another try soon


def check_socket(path: str) -> None:
    """LocalAgentError unless `path` is root's socket in a root-only directory."""
    why = trusted_directory(os.path.dirname(path) or ".")
    if why:
        raise LocalAgentError(f"untrusted agent socket directory: {why}")
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        raise LocalAgentError(f"no agent socket at {path} (agent not running)") from None
    except OSError as exc:
        raise LocalAgentError(f"agent socket {path}: {exc.strerror}") from None
    if not stat.S_ISSOCK(st.st_mode):
        raise LocalAgentError(f"{path} is not a socket")
    if st.st_uid != 0 or st.st_mode & 0o077:
        raise LocalAgentError(f"{path} is not the agent's (uid {st.st_uid}, mode "
                              f"{stat.S_IMODE(st.st_mode):o})")


class _Connection(http.client.HTTPConnection):
    def __init__(self, sock: socket.socket, timeout: float):
        super().__init__("localhost", timeout=timeout)
        self.sock = sock

    def connect(self):          # already connected
        pass


def read_local(path: str, target: str, timeout: float) -> bytes:
    """The body of GET `target` from the agent at `path`, whole within
    `timeout` seconds, else LocalAgentError with the cause."""
    check_socket(path)
    deadline = time.monotonic() + timeout
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.settimeout(timeout)
        try:
            sock.connect(path)
        except socket.timeout:
            raise LocalAgentError(f"no connection to {path} within {timeout:g} s") from None
        except OSError as exc:
            if exc.errno == errno.ECONNREFUSED:
                raise LocalAgentError(f"connection refused at {path} (agent not running)") \
                    from None
            raise LocalAgentError(f"cannot connect to {path}: {exc.strerror}") from None
        uid = peer_uid(sock)
        if uid != 0:
            raise LocalAgentError(f"{path} is served by uid {uid}, not root")
        return _get(sock, target, path, deadline, timeout)
    finally:
        sock.close()


def _get(sock: socket.socket, target: str, path: str, deadline: float,
         timeout: float) -> bytes:
    conn = _Connection(sock, timeout)
    try:
        conn.request("GET", target, headers={"Connection": "close"})
        resp = conn.getresponse()
        chunks, size = [], 0
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise socket.timeout()
            sock.settimeout(left)
            chunk = resp.read1(65536)
            if not chunk:
                break
            size += len(chunk)
            if size > MAX_BODY:
                raise LocalAgentError(f"the answer of {path} exceeds {MAX_BODY >> 20} MiB")
            chunks.append(chunk)
    except socket.timeout:
        raise LocalAgentError(f"no whole answer from {path} within {timeout:g} s") from None
    except (http.client.HTTPException, OSError) as exc:
        raise LocalAgentError(f"broken answer from {path}: {exc!r}"[:200]) from None
    body = b"".join(chunks)
    if resp.status == 503:
        raise LocalAgentError(f"agent at {path} starting: "
                              f"{body.decode('utf-8', 'replace').strip()[:100]}", transient=True)
    if resp.status != 200:
        raise LocalAgentError(f"agent at {path} answered {resp.status} {resp.reason}")
    return body
