"""Every client of an agent's answers (top, explain's node mode, the chaos
detection probe) reads at most 64 MiB, whole within its timeout: against a
real HTTP server on loopback that answers without end, with one huge line,
or a byte at a time, each gives up with the cause; `tracehound top --once`
against the endless one exits 1 and stays under 256 MB."""
import http.server
import os
import subprocess
import sys
import threading
import time

import pytest

from tracehound.chaos.metrics import QueryError, fetch
from tracehound.clients.agent_client import MAX_ANSWER_BYTES, AnswerError, read_agent
from tracehound.explain.answer import ExplainError
from tracehound.explain.node import _read
from tracehound.top.source import MetricsSource, SourceError

LINE = b"x" * (1 << 20)        # 1 MiB without a newline


class Hostile(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.0"

    def do_GET(self):
        self.send_response(200)
        self.send_header("Content-Type", "text/plain")
        if self.path.startswith("/huge"):
            self.send_header("Content-Length", str(MAX_ANSWER_BYTES + len(LINE)))
        self.end_headers()
        try:
            if self.path.startswith("/trickle"):
                while True:
                    self.wfile.write(b"x")
                    self.wfile.flush()
                    time.sleep(0.1)
            for _ in range(MAX_ANSWER_BYTES // len(LINE) + (1 if self.path.startswith("/huge")
                                                           else 10**6)):
                self.wfile.write(LINE)
        except OSError:
            pass                # the client gave up: what is asserted

    def log_message(self, *args):
        pass


@pytest.fixture(scope="module")
def server():
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Hostile)
    srv.daemon_threads = True
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{srv.server_address[1]}"
    srv.shutdown()
    srv.server_close()


@pytest.mark.parametrize("path", ["/endless/metrics", "/huge/metrics"])
def test_an_answer_past_the_bound_is_refused_by_every_client(server, path):
    url = server + path
    with pytest.raises(AnswerError, match="exceeds 64 MiB"):
        read_agent(url, 30)
    with pytest.raises(SourceError, match="exceeds 64 MiB"):
        MetricsSource(url, timeout=30).scrape()
    with pytest.raises(ExplainError, match="exceeds 64 MiB"):
        _read(url, "text/plain")
    with pytest.raises(QueryError, match="exceeds 64 MiB"):
        fetch(url, 30)


def test_a_trickling_answer_is_given_up_at_the_timeout(server):
    with pytest.raises(AnswerError, match="no whole answer within 1 s"):
        read_agent(server + "/trickle/metrics", 1)
    with pytest.raises(SourceError, match="no whole answer within 1 s"):
        MetricsSource(server + "/trickle/metrics", timeout=1).scrape()


def test_top_against_an_endless_metrics_exits_with_the_cause_and_stays_small(server):
    proc = subprocess.Popen([sys.executable, "-m", "tracehound", "top", "--once",
                             "--url", server + "/endless/metrics"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    err = proc.stderr.read()
    _pid, status, usage = os.wait4(proc.pid, 0)        # this child's own peak
    proc.returncode = os.waitstatus_to_exitcode(status)
    assert proc.returncode == 1 and "exceeds 64 MiB" in err, err[-2000:]
    assert usage.ru_maxrss < 256 << 10, f"{usage.ru_maxrss} KiB"
