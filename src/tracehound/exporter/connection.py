"""One connection of the agent's HTTP server: its requests read by a
deadline, answered by the application, and written by a deadline.

Reading: a connection has `idle_timeout` seconds, from being accepted or
from the end of its previous response, to deliver a complete request head.
The limit is a deadline, not a per-read timeout, so a client that drips one
byte at a time is dropped on time too.

Writing: a response must be taken by the client within `write_timeout`
seconds from its first byte (a streamed body's rendering included), and
make progress at least every `idle_timeout` seconds; a client that stops reading is dropped when either passes. Writes
never block the thread beyond that: while the client's socket is full the
connection is marked stalled, which lets the server close it first when it
needs room for a new scrape (http.py).
"""
from __future__ import annotations

import http.server
import io
import logging
import re
import select
import socket
import ssl
import time
import urllib.parse
from email.utils import formatdate
from typing import Optional

from .messages import Request, Response, status_reason, text_response

log = logging.getLogger(__name__)

MAX_REQUEST_LINE = 8192           # the longest target we serve is short
MAX_HEAD = 64 * 1024              # request line and headers, per request
SEND_CHUNK = 64 * 1024            # one send() at most; a stalled one waits for room
ALLOWED_METHODS = ("GET", "HEAD")
_HOP_BY_HOP = frozenset({"connection", "keep-alive", "transfer-encoding", "content-length",
                         "proxy-connection", "te", "trailer", "upgrade"})
# uri-host [ ":" port ] (RFC 9110 7.2): a bracketed IPv6 literal or a reg-name
_HOST_RE = re.compile(r"(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9\-._~!$&'()*+,;=%]*)(:[0-9]{0,5})?")
_DIGITS_RE = re.compile(r"[0-9]{1,18}")
HEADER_NAME_RE = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
_WOULD_BLOCK = (BlockingIOError, ssl.SSLWantWriteError, ssl.SSLWantReadError)


class DeadlineReader(io.RawIOBase):
    """Socket reads that must all finish by `deadline` (a monotonic time):
    the timeout of each recv is what is left of the deadline. At most
    `budget` bytes are read before the next reset (a head of a hundred
    64 KiB header lines would otherwise be read whole)."""

    def __init__(self, sock: socket.socket):
        super().__init__()
        self.sock = sock
        self.deadline: Optional[float] = None
        self.budget = MAX_HEAD

    def reset(self, timeout: float) -> None:
        self.deadline = time.monotonic() + timeout
        self.budget = MAX_HEAD

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

    def __init__(self, handler: "Handler"):
        self.handler = handler

    def write(self, data):
        self.handler.send(data)
        return len(data)

    def flush(self):
        pass


class Abandon(Exception):
    """The connection failed mid-write; its thread just ends."""


class Handler(http.server.BaseHTTPRequestHandler):
    """Parses with the standard library; answers with its own writer.
    `server` is the HTTPServer (http.py): its app, timeouts and slots."""

    protocol_version = "HTTP/1.1"

    def setup(self):
        self.connection = self.request
        try:
            self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        except OSError:
            pass
        self.connection.settimeout(self.server.idle_timeout)
        self._reader = DeadlineReader(self.connection)
        self.rfile = io.BufferedReader(self._reader)
        self.wfile = _Writer(self)
        self._slot = self.server.slot_of(self.connection)
        self._write_deadline = 0.0

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
            self.raw_requestline = line
            if len(line) > MAX_REQUEST_LINE:
                self.send_error(414)
                return
            if not self.parse_request():
                return
        except (OSError, ValueError):   # timeout, reset, or the socket shut down under us
            self.close_connection = True
            return
        slot = self._slot
        if slot is None or not self.server.begin(slot):
            return                      # evicted while its head arrived, or stopping
        try:
            self._answer()
        finally:
            self.server.end(slot)

    def _read_request_line(self) -> bytes:
        # a few empty lines before a request line are tolerated (RFC 9112 2.2)
        for _ in range(4):
            line = self.rfile.readline(MAX_REQUEST_LINE + 1)
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
            # the guard (authentication) sees every method: a 405 says nothing
            # to a client that has not authenticated
            response = self.server.guard(request, self._allowed)
        except Exception as exc:
            log.debug("%s %s failed: %r", self.command, raw_path, exc)
            response = text_response(500, "internal error\n")
        self._respond(response)

    def _allowed(self, request: Request) -> Response:
        if request.method not in ALLOWED_METHODS:
            return text_response(405, "method not allowed: use GET or HEAD\n",
                                 [("Allow", ", ".join(ALLOWED_METHODS))])
        return self.server.app(request)

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
        # from the answer's first byte: a slow collection is not the client's fault
        self._write_deadline = time.monotonic() + self.server.write_timeout
        response.headers.extend(self.server.extra_headers)
        try:
            head = self._head(response)
        except (ValueError, TypeError) as exc:   # headers not fit for the wire
            log.debug("unsendable response headers: %r", exc)
            response.close()
            response = text_response(500, "internal error\n")
            head = self._head(response)
        if response.length is None:
            self._stream(head, response)
            return
        chunks = [] if self.command == "HEAD" else response.chunks
        if not chunks or response.length <= SEND_CHUNK:
            self.send(head + b"".join(chunks))
            return
        self.send(head)
        for chunk in chunks:
            self.send(chunk)

    def _stream(self, head: bytes, response: Response):
        """A body made while it is sent: chunked for HTTP/1.1, delimited by
        closing the connection for HTTP/1.0 (_head said which)."""
        try:
            self.send(head)
            if self.command == "HEAD":
                return
            chunked = self.request_version != "HTTP/1.0"
            for chunk in response.chunks:
                if not chunk:
                    continue
                if not chunked:
                    self.send(chunk)
                elif len(chunk) <= SEND_CHUNK:
                    self.send(b"%x\r\n%s\r\n" % (len(chunk), chunk))
                else:                       # a large (maybe shared) chunk is not copied
                    self.send(b"%x\r\n" % len(chunk))
                    self.send(chunk)
                    self.send(b"\r\n")
            if chunked:
                self.send(b"0\r\n\r\n")
        except Abandon:
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
            if not HEADER_NAME_RE.fullmatch(name) or "\r" in value or "\n" in value:
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

    def send(self, data):
        """Write all of data by the response's deadlines, or abandon the
        connection (its thread then ends and the socket is closed)."""
        view = memoryview(data)
        try:
            while view:
                view = view[self._send_some(view[:SEND_CHUNK]):]
        except (OSError, ValueError) as exc:   # ValueError: an SSL socket closed under us
            log.debug("write to %s failed: %r", self.client_address, exc)
            self.close_connection = True
            raise Abandon() from None

    def _send_some(self, chunk) -> int:
        """Bytes of chunk the socket took. While it has no room the slot is
        marked stalled, and the wait ends at the earlier deadline: the
        response's, or `idle_timeout` without progress."""
        sock, slot = self.connection, self._slot
        stalled_until = time.monotonic() + self.server.idle_timeout
        want_read = False
        try:
            while True:
                if time.monotonic() >= self._write_deadline:
                    # also a client that reads, but too slowly to matter
                    raise TimeoutError("the client did not take its response in time")
                sock.setblocking(False)
                try:
                    return sock.send(chunk)
                except _WOULD_BLOCK as exc:
                    want_read = isinstance(exc, ssl.SSLWantReadError)
                if slot is not None and not slot.stalled:
                    slot.stalled_since = time.monotonic()
                    slot.stalled = True
                if slot is None or slot.evicted or self.server.closing:
                    raise ConnectionAbortedError("connection closed by the server")
                left = min(self._write_deadline, stalled_until) - time.monotonic()
                if left <= 0:
                    raise TimeoutError("the client did not take its response in time")
                select.select([sock] if want_read else [], [] if want_read else [sock], [], left)
        finally:
            if slot is not None:
                slot.stalled = False

    def log_message(self, format, *args):   # no line per request, nor per error
        pass
