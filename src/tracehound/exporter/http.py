"""The agent's HTTP server: a thread per connection, bounded and time-limited.

A node agent is scraped by a handful of Prometheus servers, polled by
`tracehound top` and chaos probes, and sometimes poked by scanners, clients
that stop reading, or half-broken proxies. None of those may stop the
others, so:

* every accepted connection gets its own daemon thread (HTTP/1.1, with
  keep-alive), which reads and writes by deadlines (connection.py): a client
  that sends its request too slowly, or does not take its response, is
  dropped when its deadline passes;
* at most `max_connections` connections are open at once. When a new one
  arrives at the limit, room is made by closing, in this order, the
  connection idle longest (waiting for a request, or still sending its
  request head), then the one that has made no progress for longest in the
  middle of a response (its client not reading). Only when every open connection is being
  answered (in the application, or taking its bytes) is the new one refused
  at once with 503. A client that stops reading therefore never keeps a
  real scrape waiting, and threads stay bounded;
* with TLS (webconfig.py), the handshake runs in the connection's thread,
  by the same deadline as a request head;
* `close()` stops accepting, shuts down every open connection socket (which
  wakes any thread blocked reading or writing it) and waits briefly for the
  threads; it returns within its timeout whatever the clients do.

The application is a function `Request -> Response` (messages.py); responses
are built in memory (as one or more chunks), so each has a Content-Length, or
streamed as they are made (chunked transfer coding; for HTTP/1.0 the
connection closes after the body), and HEAD is answered by the
server (headers only). Nothing here logs a line per request or prints a traceback: failures go to
the debug log, and the client gets a plain-text status.

Why not prometheus_client's own server (start_http_server, a wsgiref
ThreadingWSGIServer): bench.http_server serves one registry through both in
one run (report and commit: bench/report/http-server.md). Alone it scrapes
as fast (within a tenth), but it gives every connection a thread for as long
as the client likes: beside 500 stalled clients it held about 500 threads
(here about 70, for at most 64 connections), 500 clients that never read
cost it over a gigabyte more memory (tens of MB here) and a scrape made as
they came timed out; clients that never finish a request head are never
dropped, and it renders /metrics for each when they go; and one client that
never starts its TLS handshake stops all of its HTTPS.
"""
from __future__ import annotations

import _socket
import errno
import logging
import select
import selectors
import socket
import ssl
import threading
import time
from typing import Callable, Optional, Union

from .connection import Abandon, Handler
from .messages import Request, Response

log = logging.getLogger(__name__)

DEFAULT_IDLE_TIMEOUT = 10.0
# a scrape's whole answer; Prometheus gives up on a target long before
DEFAULT_WRITE_TIMEOUT = 60.0
DEFAULT_MAX_CONNECTIONS = 64
DEFAULT_BACKLOG = 128

_WAIT_AFTER_CLOSE = 1.5           # close(): how long to wait for handler threads

Guard = Callable[[Request, Callable[[Request], Response]], Response]


def _unguarded(request: Request, app: Callable[[Request], Response]) -> Response:
    return app(request)


class _Slot:
    """Bookkeeping of one open connection."""

    __slots__ = ("sock", "busy", "since", "evicted", "stalled", "stalled_since")

    def __init__(self, sock: socket.socket):
        self.sock = sock
        self.busy = False           # between a complete request head and its response's end
        self.since = time.monotonic()
        self.evicted = False
        self.stalled = False        # writing, and the client's socket has no room
        self.stalled_since = 0.0    # since when, without progress


class HTTPServer:
    """Serves `app` (Request -> Response) on host:port; see the module doc.
    `tls` (an ssl.SSLContext, or a function that returns the one for each
    new connection) serves HTTPS; `guard(request, app)` runs
    before the application for every request (authentication);
    `extra_headers` go on every response."""

    def __init__(self, host: str, port: int, app: Callable[[Request], Response], *,
                 idle_timeout: float = DEFAULT_IDLE_TIMEOUT,
                 write_timeout: float = DEFAULT_WRITE_TIMEOUT,
                 max_connections: int = DEFAULT_MAX_CONNECTIONS,
                 backlog: int = DEFAULT_BACKLOG,
                 tls: Union[ssl.SSLContext, Callable[[], ssl.SSLContext], None] = None,
                 guard: Guard = _unguarded,
                 extra_headers: tuple = (),
                 peer_check: Optional[Callable[[ssl.SSLSocket], bool]] = None,
                 listener: Optional[socket.socket] = None,
                 accept_check: Optional[Callable[[socket.socket], bool]] = None):
        if idle_timeout <= 0 or write_timeout <= 0:
            raise ValueError("idle_timeout and write_timeout must be positive")
        if max_connections < 1:
            raise ValueError("max_connections must be at least 1")
        self.app = app
        self.idle_timeout = float(idle_timeout)
        self.write_timeout = float(write_timeout)
        self.max_connections = int(max_connections)
        self.tls = tls
        self.guard = guard
        self.extra_headers = tuple(extra_headers)
        self.peer_check = peer_check
        # before a connection takes a slot: False closes it (the local
        # channel's root-only peer check)
        self.accept_check = accept_check
        self.closing = False
        self.evictions = 0
        self._lock = threading.Lock()
        self._drained = threading.Condition(self._lock)
        self._slots: dict = {}
        self._thread: Optional[threading.Thread] = None
        if listener is not None:
            # bound and listening already (a Unix socket: exporter/local.py)
            self.socket = listener
            self.socket.setblocking(False)
            self.server_address = (host, port)
        else:
            family = socket.AF_INET6 if ":" in host else socket.AF_INET
            self.socket = socket.socket(family, socket.SOCK_STREAM)
            try:
                self.socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                self.socket.bind((host, port))
                self.socket.listen(max(int(backlog), 1))
                self.socket.setblocking(False)
            except BaseException:
                self.socket.close()
                raise
            self.server_address = self.socket.getsockname()
        self._wake_r, self._wake_w = socket.socketpair()

    @property
    def port(self) -> int:
        return self.server_address[1]

    def start(self) -> "HTTPServer":
        self._thread = threading.Thread(target=self._accept_loop, name="exporter-accept",
                                        daemon=True)
        self._thread.start()
        return self

    def close(self, timeout: float = _WAIT_AFTER_CLOSE) -> None:
        """Stop accepting, cut every open connection, wait up to `timeout`
        for their threads (daemon threads: any still busy are left behind)."""
        deadline = time.monotonic() + timeout
        with self._lock:
            if self.closing:
                return
            self.closing = True
        try:
            self._wake_w.send(b"x")
        except OSError:
            pass
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(max(deadline - time.monotonic(), 0))
        self.socket.close()
        with self._lock:
            for slot in self._slots.values():
                _shut(slot.sock)
            while self._slots:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._drained.wait(left)
        self._wake_r.close()
        self._wake_w.close()

    # -- accepting -----------------------------------------------------------

    def _accept_loop(self):
        with selectors.DefaultSelector() as selector:
            selector.register(self.socket, selectors.EVENT_READ)
            selector.register(self._wake_r, selectors.EVENT_READ)
            while not self.closing:
                try:
                    events = selector.select()
                except OSError as exc:
                    if not self.closing:
                        log.warning("exporter stopped accepting connections: %s", exc)
                    break
                if self.closing:
                    break
                if any(key.fileobj is self.socket for key, _ in events):
                    self._accept_ready()

    def _accept_ready(self):
        while not self.closing:
            try:
                sock, address = self.socket.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:
                if exc.errno in (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM):
                    time.sleep(0.1)     # out of descriptors: let connections finish
                return
            if self.accept_check is not None and not self.accept_check(sock):
                sock.close()
                continue
            if not self._admit(sock):
                _refuse(sock)
                continue
            try:
                threading.Thread(target=self._serve_connection, args=(sock, address),
                                 name="exporter-conn", daemon=True).start()
            except RuntimeError:        # no thread to be had
                self._release(sock)

    def _admit(self, sock: socket.socket) -> bool:
        with self._lock:
            if self.closing:
                return False
            if len(self._slots) >= self.max_connections:
                victim = self._victim()
                if victim is None:
                    return False
                victim.evicted = True
                self.evictions += 1
                del self._slots[victim.sock]
                _shut(victim.sock)      # its thread sees EOF or a failed write, and closes it
            self._slots[sock] = _Slot(sock)
            return True

    def _victim(self) -> Optional[_Slot]:
        """The connection to close for a new one: the longest idle, else the
        longest stalled writing (its client reads nothing)."""
        idle = [slot for slot in self._slots.values() if not slot.busy]
        if idle:
            return min(idle, key=lambda slot: slot.since)
        # a slow but reading client makes progress, which restarts its clock
        stalled = [slot for slot in self._slots.values() if slot.stalled]
        if stalled:
            return min(stalled, key=lambda slot: slot.stalled_since)
        return None

    def _serve_connection(self, sock: socket.socket, address):
        try:
            if self.tls is not None:
                tls = self._handshake(sock, address)
                if tls is None:
                    return
                sock = tls
            Handler(sock, address, self)
        except Abandon:
            pass
        except Exception as exc:
            log.debug("connection from %s: %r", address, exc)
        finally:
            self._release(sock)

    def _handshake(self, sock: socket.socket, address) -> Optional[ssl.SSLSocket]:
        """The TLS handshake by the idle deadline; its socket replaces the
        plain one in the slot (None: the client failed it, and is closed)."""
        deadline = time.monotonic() + self.idle_timeout
        try:
            context = self.tls() if callable(self.tls) else self.tls
            tls = context.wrap_socket(sock, server_side=True, do_handshake_on_connect=False)
        except (OSError, ValueError) as exc:
            log.debug("TLS setup failed: %r", exc)
            return None
        with self._lock:
            slot = self._slots.pop(sock, None)
            if slot is None:             # evicted meanwhile
                _shut(tls)
                tls.close()
                return None
            slot.sock = tls
            self._slots[tls] = slot
        try:
            tls.setblocking(False)
            while True:
                try:
                    tls.do_handshake()
                    break
                except ssl.SSLWantReadError:
                    wait = ([tls], [])
                except ssl.SSLWantWriteError:
                    wait = ([], [tls])
                left = deadline - time.monotonic()
                if left <= 0 or slot.evicted or self.closing:
                    raise TimeoutError("TLS handshake not done in time")
                select.select(*wait, [], left)
            if self.peer_check is not None and not self.peer_check(tls):
                raise ssl.SSLError("client certificate not allowed")
        except (OSError, ValueError) as exc:
            log.debug("TLS handshake with %s failed: %r", address, exc)
            self._release(tls)
            return None
        return tls

    def _release(self, sock: socket.socket):
        with self._lock:
            self._slots.pop(sock, None)
            if not self._slots:
                self._drained.notify_all()
        try:
            _socket.socket.shutdown(sock, socket.SHUT_WR)
        except OSError:
            pass
        sock.close()

    # -- slot states, for the handler ---------------------------------------

    def slot_of(self, sock: socket.socket) -> Optional[_Slot]:
        with self._lock:
            return self._slots.get(sock)

    def begin(self, slot: _Slot) -> bool:
        with self._lock:
            if slot.evicted or self.closing:
                return False
            slot.busy = True
            slot.since = time.monotonic()
            return True

    def end(self, slot: _Slot) -> None:
        with self._lock:
            slot.busy = False
            slot.since = time.monotonic()


_BUSY_BODY = b"too many connections, retry\n"
_BUSY = (b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: text/plain; charset=utf-8\r\n"
         b"Retry-After: 1\r\nConnection: close\r\nContent-Length: %d\r\n\r\n%s"
         % (len(_BUSY_BODY), _BUSY_BODY))


def _refuse(sock: socket.socket) -> None:
    """503 at once, in plain text (over TLS the client sees a failed handshake)."""
    try:
        sock.setblocking(False)
        sock.send(_BUSY)
        sock.shutdown(socket.SHUT_WR)
    except OSError:
        pass
    sock.close()


def _shut(sock: socket.socket) -> None:
    """Wake whatever thread reads or writes sock: the plain socket's
    shutdown, also under TLS (SSLSocket.shutdown would drop its TLS state
    under the thread using it)."""
    try:
        _socket.socket.shutdown(sock, socket.SHUT_RDWR)
    except OSError:
        pass
