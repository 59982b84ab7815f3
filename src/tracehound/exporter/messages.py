"""What the agent's HTTP server exchanges with its applications: a parsed
Request, an in-memory Response, and how WSGI apps such as /events are
called (/metrics is scrape.py's)."""
from __future__ import annotations

import http
import io
import logging
from typing import Callable, Iterable, Optional

log = logging.getLogger(__name__)

TEXT = "text/plain; charset=utf-8"


class Request:
    """One parsed request, as the application sees it."""

    __slots__ = ("method", "path", "query", "headers", "version", "client", "server_name",
                 "server_port")

    def __init__(self, method: str, path: str, query: str, headers, version: str,
                 client: tuple, server_name: str, server_port: int):
        self.method = method          # "GET" or "HEAD" (others never reach the app)
        self.path = path              # percent-decoded (latin-1, as in WSGI)
        self.query = query            # raw query string, without "?"
        self.headers = headers        # email.message.Message: .get(), .get_all()
        self.version = version        # "HTTP/1.1", "HTTP/1.0"
        self.client = client          # (address, port, ...)
        self.server_name = server_name
        self.server_port = server_port


class Response:
    """Status, headers and the body: bytes, a list of byte chunks (a large
    exposition is sent as rendered, never joined into a second copy), or an
    iterator of chunks made while they are sent (`length` None: the server
    uses chunked transfer coding, or closes the connection after it for an
    HTTP/1.0 client). Content-Length, Transfer-Encoding and Connection are
    the server's to set; an application's own are dropped."""

    __slots__ = ("status", "chunks", "length", "headers", "reason")

    def __init__(self, status: int, body=b"", headers: Iterable = (),
                 reason: Optional[str] = None):
        self.status = int(status)
        if isinstance(body, (bytes, bytearray, memoryview)):
            body = [bytes(body)]
        if isinstance(body, (list, tuple)):
            self.chunks = [c for c in body if c]
            self.length: Optional[int] = sum(map(len, self.chunks))
        else:
            self.chunks = body
            self.length = None
        self.headers = list(headers)
        self.reason = reason

    @property
    def body(self) -> bytes:
        """The whole body (a streamed one is consumed)."""
        return b"".join(self.chunks)

    def close(self) -> None:
        """Let a streamed body that will not be read finish its clean-up."""
        close = getattr(self.chunks, "close", None)
        if close is not None:
            close()


def text_response(status: int, text: str, headers: Iterable = ()) -> Response:
    return Response(status, text.encode("utf-8"), [("Content-Type", TEXT), *headers])


def status_reason(status: int) -> str:
    try:
        return http.HTTPStatus(status).phrase
    except ValueError:
        return "Unknown"


class _ErrorSink:
    """wsgi.errors: what an application writes there goes to the debug log."""

    def write(self, text):
        if text.strip():
            log.debug("wsgi.errors: %s", text.rstrip())

    def writelines(self, lines):
        for line in lines:
            self.write(line)

    def flush(self):
        pass


def call_wsgi(app: Callable, request: Request) -> Response:
    """Run a WSGI application for a bodiless request and collect its answer."""
    environ = {
        "REQUEST_METHOD": request.method,
        "SCRIPT_NAME": "",
        "PATH_INFO": request.path,
        "QUERY_STRING": request.query,
        "SERVER_NAME": request.server_name,
        "SERVER_PORT": str(request.server_port),
        "SERVER_PROTOCOL": request.version,
        "REMOTE_ADDR": str(request.client[0]) if request.client else "",
        "CONTENT_LENGTH": "",
        "wsgi.version": (1, 0),
        "wsgi.url_scheme": "http",
        "wsgi.input": io.BytesIO(b""),
        "wsgi.errors": _ErrorSink(),
        "wsgi.multithread": True,
        "wsgi.multiprocess": False,
        "wsgi.run_once": False,
    }
    for name, value in request.headers.items():
        key = name.upper().replace("-", "_")
        if key in ("CONTENT_TYPE", "CONTENT_LENGTH"):
            environ[key] = value
            continue
        key = "HTTP_" + key
        environ[key] = f"{environ[key]},{value}" if key in environ else value

    started: list = []
    chunks: list = []

    def start_response(status, headers, exc_info=None):
        if exc_info is not None and started:
            # the body is buffered, so a late error may still replace the status
            started.clear()
        elif started:
            raise AssertionError("start_response called twice")
        started.append((status, list(headers)))
        return chunks.append

    result = app(environ, start_response)
    try:
        for chunk in result:
            chunks.append(chunk)
    finally:
        close = getattr(result, "close", None)
        if close is not None:
            close()
    if not started:
        raise RuntimeError("WSGI application returned without calling start_response")
    status, headers = started[0]
    code, _, reason = str(status).partition(" ")
    return Response(int(code), b"".join(bytes(c) for c in chunks), headers,
                    reason=reason.strip() or None)
