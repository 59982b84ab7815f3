"""HTTP exporter: one registry per agent, collectors read maps at scrape time."""
from __future__ import annotations

import errno
import ipaddress
import logging
import threading

from prometheus_client import CollectorRegistry

from .. import defaults
from ..errors import SetupError
from ..host.port_owner import listener_uids
from .http import (DEFAULT_BACKLOG, DEFAULT_IDLE_TIMEOUT, DEFAULT_MAX_CONNECTIONS,
                   DEFAULT_WRITE_TIMEOUT, HTTPServer)
from .messages import Request, Response, call_wsgi, text_response
from .scrape import Scraper
from .webconfig import WebConfig

log = logging.getLogger(__name__)

DEFAULT_LISTEN = defaults.LISTEN
# how often a port another user's socket holds is tried again
BIND_RETRY_S = 2.0


def loopback(host: str) -> bool:
    """Whether host reaches this machine only (127.0.0.0/8, ::1, localhost)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def parse_listen(value: str) -> tuple[str, int]:
    """'HOST:PORT', '[v6]:PORT' or ':PORT' -> (host, port)."""
    host, sep, port = value.rpartition(":")
    # Port 0 asks the kernel for a free port; the printed URL shows which.
    # isdigit() alone also takes '²' and other digits int() refuses
    if not sep or not (port.isascii() and port.isdigit()) or len(port) > 5 \
            or not 0 <= int(port) < 65536:
        raise SetupError(f"--listen {value!r}: expected HOST:PORT, e.g. {DEFAULT_LISTEN}")
    host = host.strip("[]") or "0.0.0.0"
    return host, int(port)


class Exporter:
    """/metrics from the registry, health and readiness, and any extra routes
    (path -> WSGI app), served by .http.HTTPServer.

    /healthz answers 200 while the process runs; /readyz and /metrics answer
    503 until set_ready(True) (the agent calls it once its probes are loaded).
    The keyword arguments tune the server: idle_timeout (seconds a connection
    may take to send a request head, or wait without taking any of its
    answer), write_timeout (seconds to take a whole answer), max_connections
    (open at once; the longest idle, then the longest stalled, is closed to
    admit a new one) and backlog (listen queue). `web_config` (webconfig.py)
    adds TLS, basic authentication, which guards every path (health and
    readiness included, as the exporter toolkit does), and response headers.
    """

    def __init__(self, registry: CollectorRegistry, listen: str = DEFAULT_LISTEN,
                 routes: dict | None = None, *, idle_timeout: float = DEFAULT_IDLE_TIMEOUT,
                 write_timeout: float = DEFAULT_WRITE_TIMEOUT,
                 max_connections: int = DEFAULT_MAX_CONNECTIONS,
                 backlog: int = DEFAULT_BACKLOG, web_config: WebConfig | None = None):
        self.registry = registry
        self.web = web_config or WebConfig()
        self.write_timeout = write_timeout
        self.scraper = Scraper(registry)
        self.routes = dict(routes or {})
        self.host, self.port = parse_listen(listen)
        self.idle_timeout = idle_timeout
        self.max_connections = max_connections
        self.backlog = backlog
        self._ready = False
        self._server: HTTPServer | None = None
        self._lock = threading.Lock()
        self._stopped = threading.Event()
        self._retry: threading.Thread | None = None

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        scheme = "https" if self.web.tls is not None else "http"
        return f"{scheme}://{host}:{self.port}/metrics"

    @property
    def ready(self) -> bool:
        return self._ready

    def set_ready(self, ready: bool = True) -> None:
        self._ready = bool(ready)

    def handle(self, request: Request) -> Response:
        route = self.routes.get(request.path)
        if route is not None:
            return call_wsgi(route, request)
        if request.path == "/metrics":
            if not self._ready:
                return text_response(503, "tracehound: probes are loading, no metrics yet\n",
                                     [("Retry-After", "5")])
            return self.scraper.respond(request)
        if request.path == "/healthz":
            return text_response(200, "ok\n")
        if request.path == "/readyz":
            if self._ready:
                return text_response(200, "ready\n")
            return text_response(503, "not ready: probes are loading\n")
        return text_response(404, f"not found: {request.path} (try /metrics)\n")

    def start(self) -> "Exporter":
        """Bind and serve. A port another agent (root) holds is an error; a
        port held by another user's socket is not the agent's to lose: it
        starts anyway (its local channel serves `tracehound health`) and
        binds the port as soon as that socket goes, retrying every few
        seconds until stop()."""
        try:
            self._server = self._bind()
        except _PortBusy as busy:
            if not busy.uids or 0 in busy.uids:
                raise SetupError(f"cannot listen on {self.host}:{self.port}: address already "
                                 "in use (another agent running? pick one with --listen "
                                 "HOST:PORT)") from None
            log.warning("cannot listen on %s:%d yet: a socket of uid %s holds it (not an "
                        "agent); retrying every %g s, the local channel serves meanwhile",
                        self.host, self.port, ",".join(map(str, sorted(busy.uids))),
                        BIND_RETRY_S)
            self._retry = threading.Thread(target=self._bind_later, name="exporter-bind",
                                           daemon=True)
            self._retry.start()
            return self
        self._serving()
        return self

    def _bind(self) -> HTTPServer:
        web = self.web
        try:
            return HTTPServer(self.host, self.port, self.handle,
                              idle_timeout=self.idle_timeout,
                              write_timeout=self.write_timeout,
                              max_connections=self.max_connections,
                              backlog=self.backlog,
                              tls=web.reloader.current if web.reloader else web.tls,
                              guard=web.auth.guard if web.auth else _open,
                              extra_headers=web.headers,
                              peer_check=web.peer_allowed if web.allowed_sans else None)
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                raise _PortBusy(listener_uids(self.port)) from None
            raise SetupError(f"cannot listen on {self.host}:{self.port}: {exc.strerror}") from None

    def _bind_later(self) -> None:
        while not self._stopped.wait(BIND_RETRY_S):
            try:
                server = self._bind()
            except (_PortBusy, SetupError):
                continue
            with self._lock:
                if self._stopped.is_set():
                    server.close()
                    return
                self._server = server
            self._serving()
            log.warning("listening on %s:%d now", self.host, self.port)
            return

    def _serving(self) -> None:
        web = self.web
        self.port = self._server.port
        self._server.start()
        for note in web.notes:
            log.warning("%s: %s", web.path, note)
        if not loopback(self.host) and not web.secure:
            # pod, job and process names, pids and kernel-log lines, to anyone
            # who can reach the port
            missing = " or ".join(part for part, present in
                                  (("TLS", web.tls is not None),
                                   ("authentication", web.auth is not None)) if not present)
            log.warning("serving %s without %s to every host that reaches %s: use "
                        "--web.config.file with TLS and basic_auth_users (see "
                        "docs/deployment.md), or --listen 127.0.0.1:%d",
                        self.url, missing or "authentication", self.host, self.port)

    def stop(self) -> None:
        with self._lock:
            self._stopped.set()
            server, self._server = self._server, None
        if server:
            server.close()


class _PortBusy(Exception):
    def __init__(self, uids: set):
        self.uids = uids


def _open(request: Request, app) -> Response:
    return app(request)
