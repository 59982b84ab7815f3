"""What the benchmark does to a server: real scrapes (timed, body read),
crowds of slow clients, and the serving process's threads, memory and CPU
read from /proc."""
from __future__ import annotations

import errno
import http.client
import json
import os
import selectors
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

HOST = "127.0.0.1"
REPO = Path(__file__).resolve().parents[2]
CLK_TCK = os.sysconf("SC_CLK_TCK")

KINDS = {
    "half-head": "send half a request head, then nothing",
    "non-reader": "send GET /metrics, never read (1 KiB receive buffer)",
    "idle": "connect, send nothing",
}


# -- the server's process -----------------------------------------------------

class Server:
    """One server under test in its own process (serve.py); stderr goes to a
    file, so that what it prints per failed client can be counted."""

    def __init__(self, kind: str, label_sets: int, tls: tuple | None = None):
        self.kind = kind
        self.err = tempfile.TemporaryFile()
        env = dict(os.environ, PYTHONPATH=f"{REPO / 'src'}:{REPO}")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "bench.http_server.serve", kind, str(label_sets),
             *(tls or ())], cwd=REPO, env=env, stdin=subprocess.PIPE,
            stdout=subprocess.PIPE, stderr=self.err, text=True)
        line = self.proc.stdout.readline()
        if not line:
            self.err.seek(0)
            raise RuntimeError(f"{kind} server did not start: "
                               f"{self.err.read().decode(errors='replace')[-2000:]}")
        self.port = json.loads(line)["port"]
        self.pid = self.proc.pid

    def stats(self) -> dict:
        return proc_stats(self.pid)

    def tracebacks(self) -> int:
        self.err.seek(0)
        return self.err.read().count(b"Traceback (most recent call last)")

    def stop(self) -> None:
        try:
            self.proc.stdin.close()
            self.proc.wait(3)
        except (OSError, subprocess.TimeoutExpired):
            os.kill(self.pid, signal.SIGKILL)     # our own child, by its pid
            self.proc.wait()
        self.err.close()


def proc_stats(pid: int) -> dict:
    """Threads, resident memory (MB) and CPU seconds used so far."""
    out = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("Threads:"):
                out["threads"] = int(line.split()[1])
            elif line.startswith("VmRSS:"):
                out["rss_mb"] = int(line.split()[1]) / 1024
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rpartition(")")[2].split()
    out["cpu_s"] = (int(fields[11]) + int(fields[12])) / CLK_TCK
    return out


class Sampler:
    """The most threads and memory the process held, sampled every 50 ms
    from start() until peak() is read."""

    def __init__(self, pid: int):
        self.pid = pid
        self.threads = self.rss_mb = 0.0
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        while not self._stop.is_set():
            try:
                s = proc_stats(self.pid)
            except OSError:
                return
            self.threads = max(self.threads, s["threads"])
            self.rss_mb = max(self.rss_mb, s["rss_mb"])
            self._stop.wait(0.05)

    def start(self) -> "Sampler":
        self._t.start()
        return self

    def peak(self) -> dict:
        self._stop.set()
        self._t.join()
        return {"threads": self.threads, "rss_mb": self.rss_mb}


def wait_quiet(pid: int, limit: float, step: float = 0.2) -> float:
    """Seconds until the process stops using CPU (under 10% over two steps
    running), at most `limit`: the server has dealt with what just arrived."""
    start = time.monotonic()
    last, calm = proc_stats(pid)["cpu_s"], 0
    while time.monotonic() - start < limit:
        time.sleep(step)
        now = proc_stats(pid)["cpu_s"]
        calm = calm + 1 if now - last <= 0.1 * step + 1e-9 else 0
        last = now
        if calm >= 2:
            break
    return time.monotonic() - start


def wait_threads(pid: int, target: int, limit: float) -> float | None:
    """Seconds until the process is back to `target` threads (None: not within `limit`)."""
    start = time.monotonic()
    while time.monotonic() - start < limit:
        if proc_stats(pid)["threads"] <= target:
            return time.monotonic() - start
        time.sleep(0.05)
    return None


# -- real scrapes ---------------------------------------------------------------

def tls_client() -> ssl.SSLContext:
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    return ctx


def scrape(port: int, path: str = "/metrics", method: str = "GET", headers: dict | None = None,
           timeout: float = 10.0, tls: ssl.SSLContext | None = None,
           conn: http.client.HTTPConnection | None = None) -> dict:
    """One request, its whole body read: seconds, status, body bytes and
    headers of note; `error` names what went wrong (a timeout is one)."""
    t0 = time.perf_counter()
    own = conn is None
    if own:
        conn = (http.client.HTTPSConnection(HOST, port, timeout=timeout, context=tls) if tls
                else http.client.HTTPConnection(HOST, port, timeout=timeout))
    out = {"status": None, "bytes": 0, "error": None}
    try:
        conn.request(method, path, headers=headers or {})
        r = conn.getresponse()
        body = r.read()
        out.update(status=r.status, bytes=len(body), will_close=r.will_close,
                   encoding=r.getheader("Content-Encoding"),
                   type=r.getheader("Content-Type"), chunked=r.chunked)
    except (OSError, http.client.HTTPException) as exc:
        out["error"] = type(exc).__name__
        conn.close()
    finally:
        if own:
            conn.close()
    out["s"] = time.perf_counter() - t0
    if out["error"] is None and out["s"] > timeout:
        out["error"] = "slower than the client timeout"
    return out


def ok(result: dict) -> bool:
    return result["error"] is None and result["status"] == 200


def concurrent(port: int, clients: int, each: int, timeout: float) -> tuple[list, float]:
    """`clients` threads scraping `each` times at once: every result, and the wall time."""
    results: list = []
    lock = threading.Lock()

    def one():
        mine = [scrape(port, timeout=timeout) for _ in range(each)]
        with lock:
            results.extend(mine)

    threads = [threading.Thread(target=one) for _ in range(clients)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results, time.perf_counter() - t0


# -- slow clients ---------------------------------------------------------------

HALF_HEAD = b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\nAccept: text/plain\r\n"
FULL = b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"


class Crowd:
    """K connections of one kind (KINDS), held open until leave()."""

    def __init__(self, port: int, kind: str, count: int):
        self.port, self.kind, self.count = port, kind, count
        self.socks: list[socket.socket] = []
        self.failed = 0
        self._pending: dict = {}
        self._sel = selectors.DefaultSelector()

    def connect(self, pace: float = 0.001) -> None:
        """Start every connect without waiting for any, `pace` seconds apart:
        slow clients arrive over time, not all in the same millisecond (0:
        a burst; one that must wait for a full listen queue waits alone)."""
        for _ in range(self.count):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            if self.kind == "non-reader":
                s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1024)
            s.setblocking(False)
            if s.connect_ex((HOST, self.port)) not in (0, errno.EINPROGRESS):
                self.failed += 1
                s.close()
                continue
            self._sel.register(s, selectors.EVENT_WRITE)
            self._pending[s] = True
            if pace:
                time.sleep(pace)

    def wait(self, limit: float) -> int:
        """Wait up to `limit` seconds for the connects to complete (each
        sends its part of a request once connected); the number still
        pending, which are then given up (counted as failed)."""
        end = time.monotonic() + limit
        payload = {"half-head": HALF_HEAD, "non-reader": FULL}.get(self.kind, b"")
        while self._pending and time.monotonic() < end:
            for key, _ in self._sel.select(timeout=min(0.1, max(end - time.monotonic(), 0))):
                s = key.fileobj
                self._sel.unregister(s)
                del self._pending[s]
                try:
                    if s.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR):
                        raise OSError("connect failed")
                    if payload:
                        s.send(payload)
                    self.socks.append(s)
                except OSError:
                    self.failed += 1
                    s.close()
        left = len(self._pending)
        for s in list(self._pending):
            self._sel.unregister(s)
            s.close()
        self.failed += left
        self._pending.clear()
        return left

    def attach(self, limit: float = 20.0) -> float:
        t0 = time.perf_counter()
        self.connect()
        self.wait(limit)
        return time.perf_counter() - t0

    def closed_by_server(self) -> int:
        """How many of the held connections the server has closed (or answered)."""
        n = 0
        for s in self.socks:
            try:
                s.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT)
                n += 1
            except BlockingIOError:
                pass
            except OSError:
                n += 1
        return n

    def leave(self) -> None:
        for s in self.socks:
            s.close()
        self.socks = []
        self._sel.close()
