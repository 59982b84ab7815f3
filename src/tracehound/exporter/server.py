"""HTTP exporter: one registry per agent, collectors read maps at scrape time."""
from __future__ import annotations

import errno
import socket
import sys
import threading
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import CollectorRegistry, make_wsgi_app
from prometheus_client.core import GaugeMetricFamily, InfoMetricFamily

from .. import __version__
from ..errors import SetupError

DEFAULT_LISTEN = "127.0.0.1:9560"


def parse_listen(value: str) -> tuple[str, int]:
    """'HOST:PORT', '[v6]:PORT' or ':PORT' -> (host, port)."""
    host, sep, port = value.rpartition(":")
    # Port 0 asks the kernel for a free port; the printed URL shows which.
    if not sep or not port.isdigit() or not 0 <= int(port) < 65536:
        raise SetupError(f"--listen {value!r}: expected HOST:PORT, e.g. {DEFAULT_LISTEN}")
    host = host.strip("[]") or "0.0.0.0"
    return host, int(port)


class ProbeInfoCollector:
    """tracehound_probe_info{probe,mode} = 1 for every hook group in use."""

    def __init__(self, probes):
        self.probes = probes

    def collect(self):
        fam = GaugeMetricFamily("tracehound_probe_info",
                                "Hook mode each probe runs in (fentry, kprobe, tracepoint).",
                                labels=["probe", "mode"])
        for probe in self.probes:
            for name, mode in probe.modes().items():
                fam.add_metric([name, mode], 1)
        yield fam
        info = InfoMetricFamily("tracehound_build", "tracehound version.")
        info.add_metric([], {"version": __version__})
        yield info
        # RSS also moves with allocator fragmentation; the count of live
        # Python blocks only grows if the agent keeps what it should drop.
        blocks = GaugeMetricFamily("tracehound_agent_allocated_blocks",
                                   "Python memory blocks the agent holds (sys.getallocatedblocks).")
        blocks.add_metric([], sys.getallocatedblocks())
        yield blocks


class _Server(WSGIServer):
    daemon_threads = True

    def handle_error(self, request, client_address):  # a dropped scrape is not news
        pass


class _V6Server(_Server):
    address_family = socket.AF_INET6


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format, *args):  # scrapes are not worth a log line each
        pass


class Exporter:
    """/metrics from the registry, and any extra routes (path -> WSGI app)."""

    def __init__(self, registry: CollectorRegistry, listen: str = DEFAULT_LISTEN,
                 routes: dict | None = None):
        self.registry = registry
        self.routes = dict(routes or {})
        self.host, self.port = parse_listen(listen)
        self._server = None
        self._thread = None

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}/metrics"

    def start(self) -> "Exporter":
        metrics_app = make_wsgi_app(self.registry)

        def app(environ, start_response):
            route = self.routes.get(environ.get("PATH_INFO", ""), metrics_app)
            return route(environ, start_response)
        cls = _V6Server if ":" in self.host else _Server
        try:
            self._server = make_server(self.host, self.port, app, server_class=cls,
                                       handler_class=_QuietHandler)
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                raise SetupError(f"cannot listen on {self.host}:{self.port}: address already "
                                 "in use (another agent running? pick one with --listen "
                                 "HOST:PORT)") from None
            raise SetupError(f"cannot listen on {self.host}:{self.port}: {exc.strerror}") from None
        self.port = self._server.server_port
        self._thread = threading.Thread(target=self._server.serve_forever, name="exporter",
                                        daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._server:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
