"""The agent's HTTP server: a thread per connection, bounded and time-limited.

A node agent is scraped by a handful of Prometheus servers, polled by
`tracehound top` and chaos probes, and sometimes poked by scanners or
half-broken proxies. None of those may stop the others, so:

* every accepted connection gets its own daemon thread (HTTP/1.1, with
  keep-alive);
* a connection has `idle_timeout` seconds, from being accepted or from the
  end of its previous response, to deliver a complete request head (request
  line and headers). The limit is a deadline, not a per-read timeout, so a
  client that drips one byte at a time is dropped on time too. A response
  that makes no progress for `idle_timeout` seconds (a client that stopped
  reading) is abandoned the same way;
* at most `max_connections` connections are open at once. When a new one
  arrives at the limit, the connection that has been idle longest (waiting
  for a request, or still sending its request head) is closed to make room;
  only when every open connection is in the middle of a response is the new
  one refused at once with 503. Idle or slow-to-speak sockets therefore
  never keep a real scrape waiting, and threads stay bounded;
* `close()` stops accepting, shuts down every open connection socket (which
  wakes any thread blocked reading or writing it) and waits briefly for the
  threads; it returns within its timeout whatever the clients do.

The application is a function `Request -> Response` (messages.py); responses
are built in memory (as one or more chunks), so each has a Content-Length, or
streamed as they are made (chunked transfer coding; for HTTP/1.0 the
connection closes after the body), and HEAD is answered by the
server (headers only). Nothing here logs a line per request or prints a traceback: failures go to
the debug log, and the client gets a plain-text status.
"""
from __future__ import annotations

import errno
import http.server
import io
import logging
import re
import selectors
import socket
import threading
import time
import urllib.parse
from email.utils import formatdate
from typing import Callable, Optional

from .messages import Request, Response, status_reason, text_response

log = logging.getLogger(__name__)

DEFAULT_IDLE_TIMEOUT = 10.0
DEFAULT_MAX_CONNECTIONS = 64
DEFAULT_BACKLOG = 128

_MAX_REQUEST_LINE = 8192          # the longest target we serve is short
_MAX_HEAD = 64 * 1024             # request line and headers, per request
_SEND_CHUNK = 64 * 1024           # each chunk gets the full write timeout
_WAIT_AFTER_CLOSE = 1.5           # close(): how long to wait for handler threads
_ALLOWED_METHODS = ("GET", "HEAD")
_HOP_BY_HOP = frozenset({"connection", "keep-alive", "transfer-encoding", "content-length",
                         "proxy-connection", "te", "trailer", "upgrade"})
# uri-host [ ":" port ] (RFC 9110 7.2): a bracketed IPv6 literal or a reg-name
_HOST_RE = re.compile(r"(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9\-._~!$&'()*+,;=%]*)(:[0-9]{0,5})?")
_DIGITS_RE = re.compile(r"[0-9]{1,18}")
_HEADER_NAME_RE = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")


class _DeadlineReader(io.RawIOBase):
    """Socket reads that must all finish by `deadline` (a monotonic time):
    the timeout of each recv is what is left of the deadline. At most
    `budget` bytes are read before the next reset (a head of a hundred
    64 KiB header lines would otherwise be read whole)."""

    def __init__(self, sock: socket.socket):
        super().__init__()
        self.sock = sock
        self.deadline: Optional[float] = None
        self.budget = _MAX_HEAD

    def reset(self, timeout: float) -> None:
        self.deadline = time.monotonic() + timeout
        self.budget = _MAX_HEAD

    def readable(self):
        return True

    def readinto(self, buf):
        if self.deadline is not None:
            left = self.deadline - time.monotonic()
            if left <= 0:
                raise socket.timeout("request head not received in time")
            self.sock.settimeout(left)
        if self.budget <= 0:
            raise ConnectionAbortedError("request head too large")
        view = memoryview(buf)[:self.budget]
        count = self.sock.recv_into(view)
        self.budget -= count
        return count


class _Writer:
    """wfile for BaseHTTPRequestHandler code paths that write directly."""

    def __init__(self, handler: "_Handler"):
        self.handler = handler

    def write(self, data):
        self.handler._send(data)
        return len(data)

    def flush(self):
        pass


class _Slot:
    """Bookkeeping of one open connection."""

    __slots__ = ("sock", "busy", "since", "evicted")

    def __init__(self, sock: socket.socket):
        self.sock = sock
        self.busy = False           # between a complete request head and its response's end
        self.since = time.monotonic()
        self.evicted = False


class _Handler(http.server.BaseHTTPRequestHandler):
    """Parses with the standard library; answers with its own writer."""

    protocol_version = "HTTP/1.1"
    server: "HTTPServer"

    def setup(self):
        self.connection = self.request
        try:
            self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        except OSError:
            pass
        self.connection.settimeout(self.server.idle_timeout)
        self._reader = _DeadlineReader(self.connection)
        self.rfile = io.BufferedReader(self._reader)
        self.wfile = _Writer(self)
        self._slot = self.server._slot_of(self.connection)

    def finish(self):
        try:
            self.rfile.close()
        except Exception:
            pass

    def handle(self):
        self.close_connection = True
        self.handle_one_request()
        while not self.close_connection and not self.server.closing:
            self.handle_one_request()

    # -- one request ---------------------------------------------------------

    def handle_one_request(self):
        self.close_connection = True
        self.command = None
        self.request_version = self.default_request_version
        self._reader.reset(self.server.idle_timeout)
        try:
            line = self._read_request_line()
            if not line:
                return
            if len(line) > _MAX_REQUEST_LINE:
                self.send_error(414)
                return
            self.raw_requestline = line
            if not self.parse_request():
                return
        except (OSError, ValueError):   # timeout, reset, or the socket shut down under us
            self.close_connection = True
            return
        slot = self._slot
        if slot is None or not self.server._begin(slot):
            return                      # evicted while its head arrived, or stopping
        try:
            self._answer()
        finally:
            self.server._end(slot)

    def _read_request_line(self) -> bytes:
        # a few empty lines before a request line are tolerated (RFC 9112 2.2)
        for _ in range(4):
            line = self.rfile.readline(_MAX_REQUEST_LINE + 1)
            if line not in (b"\r\n", b"\n"):
                return line
        return b""

    def handle_expect_100(self):
        # bodies are never read: answer straight away (and close afterwards)
        return True

    def _answer(self):
        if self.request_version == "HTTP/0.9":
            self._reject(400, "HTTP/0.9 is not served")
            return
        hosts = self.headers.get_all("Host") or []
        if (len(hosts) > 1 or (not hosts and self.request_version != "HTTP/1.0")
                or (hosts and not _HOST_RE.fullmatch(hosts[0].strip()))):
            self._reject(400, "bad Host header")
            return
        lengths = self.headers.get_all("Content-Length") or []
        if len(lengths) > 1 or (lengths and not _DIGITS_RE.fullmatch(lengths[0].strip())):
            self._reject(400, "bad Content-Length")
            return
        if self.headers.get("Transfer-Encoding") or (lengths and int(lengths[0]) > 0):
            # a body we will not read would be taken for the next request
            self.close_connection = True
        if self.command not in _ALLOWED_METHODS:
            self._respond(text_response(405, "method not allowed: use GET or HEAD\n",
                                        [("Allow", ", ".join(_ALLOWED_METHODS))]))
            return
        target = self.path
        if not target.startswith("/"):
            parts = urllib.parse.urlsplit(target)
            if parts.scheme.lower() not in ("http", "https") or not parts.netloc:
                self._reject(400, "bad request target")
                return
            target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        raw_path, _, query = target.partition("?")
        host, port = self.server.server_address[:2]
        request = Request(self.command, urllib.parse.unquote(raw_path, "latin-1"), query,
                          self.headers, self.request_version, self.client_address,
                          str(host), int(port))
        try:
            response = self.server.app(request)
        except Exception as exc:
            log.debug("%s %s failed: %r", self.command, raw_path, exc)
            response = text_response(500, "internal error\n")
        self._respond(response)

    # -- writing -------------------------------------------------------------

    def send_error(self, code, message=None, explain=None):
        """Protocol-level errors: one plain-text line, then close. The
        standard library's messages quote the request; they are not echoed."""
        self._reject(int(code))

    def _reject(self, code: int, why: str = ""):
        self.close_connection = True
        text = f"{code} {status_reason(code)}" + (f": {why}" if why else "")
        self._respond(text_response(code, text + "\n"))

    def _respond(self, response: Response):
        try:
            head = self._head(response)
        except (ValueError, TypeError) as exc:   # headers not fit for the wire
            log.debug("unsendable response headers: %r", exc)
            response = text_response(500, "internal error\n")
            head = self._head(response)
        if response.length is None:
            self._stream(head, response)
            return
        chunks = [] if self.command == "HEAD" else response.chunks
        if not chunks or response.length <= _SEND_CHUNK:
            self._send(head + b"".join(chunks))
            return
        self._send(head)
        for chunk in chunks:
            self._send(chunk)

    def _stream(self, head: bytes, response: Response):
        """A body made while it is sent: chunked for HTTP/1.1, delimited by
        closing the connection for HTTP/1.0 (_head said which)."""
        try:
            self._send(head)
            if self.command == "HEAD":
                return
            chunked = self.request_version != "HTTP/1.0"
            for chunk in response.chunks:
                if chunk:
                    self._send(b"%x\r\n%s\r\n" % (len(chunk), chunk) if chunked else chunk)
            if chunked:
                self._send(b"0\r\n\r\n")
        except _Abandon:
            raise
        except Exception as exc:
            # too late for an error status: cut the body short, which the
            # client sees (no last chunk, or fewer bytes than it parsed)
            log.debug("%s %s failed while streaming: %r", self.command, self.path, exc)
            self.close_connection = True
        finally:
            response.close()

    def _head(self, response: Response) -> bytes:
        lines = [f"HTTP/1.1 {response.status} {response.reason or status_reason(response.status)}",
                 f"Date: {formatdate(usegmt=True)}"]
        for name, value in response.headers:
            name, value = str(name), str(value)
            if not _HEADER_NAME_RE.fullmatch(name) or "\r" in value or "\n" in value:
                raise ValueError(f"bad header {name!r}")
            if name.lower() not in _HOP_BY_HOP:
                lines.append(f"{name}: {value}")
        if response.length is not None:
            lines.append(f"Content-Length: {response.length}")
        elif self.request_version == "HTTP/1.0":
            self.close_connection = True       # the end of the body is the end of the connection
        else:
            lines.append("Transfer-Encoding: chunked")
        if self.close_connection:
            lines.append("Connection: close")
        elif self.request_version == "HTTP/1.0":
            lines.append("Connection: keep-alive")
        return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")

    def _send(self, data):
        """Write all of data; each chunk may take idle_timeout. A client that
        stopped reading costs this thread that long, then its connection."""
        view = memoryview(data)
        try:
            for start in range(0, len(view), _SEND_CHUNK):
                self.connection.settimeout(self.server.idle_timeout)
                self.connection.sendall(view[start:start + _SEND_CHUNK])
        except OSError as exc:
            log.debug("write to %s failed: %r", self.client_address, exc)
            self.close_connection = True
            raise _Abandon() from None

    def log_message(self, format, *args):   # no line per request, nor per error
        pass


class _Abandon(Exception):
    """The connection failed mid-write; its thread just ends."""


class HTTPServer:
    """Serves `app` (Request -> Response) on host:port; see the module doc."""

    def __init__(self, host: str, port: int, app: Callable[[Request], Response], *,
                 idle_timeout: float = DEFAULT_IDLE_TIMEOUT,
                 max_connections: int = DEFAULT_MAX_CONNECTIONS,
                 backlog: int = DEFAULT_BACKLOG):
        if idle_timeout <= 0:
            raise ValueError("idle_timeout must be positive")
        if max_connections < 1:
            raise ValueError("max_connections must be at least 1")
        self.app = app
        self.idle_timeout = float(idle_timeout)
        self.max_connections = int(max_connections)
        self.closing = False
        self._lock = threading.Lock()
        self._drained = threading.Condition(self._lock)
        self._slots: dict = {}
        self._thread: Optional[threading.Thread] = None
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
                idle = [slot for slot in self._slots.values() if not slot.busy]
                if not idle:
                    return False
                oldest = min(idle, key=lambda slot: slot.since)
                oldest.evicted = True
                del self._slots[oldest.sock]
                _shut(oldest.sock)      # its thread sees EOF and closes the socket
            self._slots[sock] = _Slot(sock)
            return True

    def _serve_connection(self, sock: socket.socket, address):
        try:
            _Handler(sock, address, self)
        except _Abandon:
            pass
        except Exception as exc:
            log.debug("connection from %s: %r", address, exc)
        finally:
            self._release(sock)

    def _release(self, sock: socket.socket):
        with self._lock:
            self._slots.pop(sock, None)
            if not self._slots:
                self._drained.notify_all()
        try:
            sock.shutdown(socket.SHUT_WR)
        except OSError:
            pass
        sock.close()

    # -- slot states, for the handler ---------------------------------------

    def _slot_of(self, sock: socket.socket) -> Optional[_Slot]:
        with self._lock:
            return self._slots.get(sock)

    def _begin(self, slot: _Slot) -> bool:
        with self._lock:
            if slot.evicted or self.closing:
                return False
            slot.busy = True
            return True

    def _end(self, slot: _Slot) -> None:
        with self._lock:
            slot.busy = False
            slot.since = time.monotonic()


_BUSY_BODY = b"too many connections, retry\n"
_BUSY = (b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: text/plain; charset=utf-8\r\n"
         b"Retry-After: 1\r\nConnection: close\r\nContent-Length: %d\r\n\r\n%s"
         % (len(_BUSY_BODY), _BUSY_BODY))


def _refuse(sock: socket.socket) -> None:
    try:
        sock.setblocking(False)
        sock.send(_BUSY)
        sock.shutdown(socket.SHUT_WR)
    except OSError:
        pass
    sock.close()


def _shut(sock: socket.socket) -> None:
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
