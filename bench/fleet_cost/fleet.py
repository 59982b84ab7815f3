"""A fleet of N nodes for one real Prometheus: every node serves the
recorded node's exposition (node.py) from one HTTP server, a target of its
own (its own path, its `node` label), each counter moving on at every
scrape as the recorded one would, each node's job its own group's."""
from __future__ import annotations

import re
import threading
import time
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

# a sample line: name{labels} value (the agent writes no timestamps)
SAMPLE = re.compile(rb"^([^ ]+) ([^ ]+)$")


class Exposition:
    """The recorded text as (line head, value) pairs; the job's id a slot
    to fill. A counter or a histogram's sample grows by its recorded value
    at each scrape of a node; a gauge stays."""

    def __init__(self, text: str, job: str):
        self.lines: list[tuple[bytes, float, bool]] = []
        growing: set[bytes] = set()
        for raw in text.encode().splitlines():
            if raw.startswith(b"# TYPE "):
                _t, _type, name, kind = raw.split(b" ", 3)
                if kind in (b"counter", b"histogram"):
                    growing.add(name)
                continue
            m = SAMPLE.match(raw)
            if not m or raw.startswith(b"#"):
                continue
            head, value = m.group(1), float(m.group(2))
            name = head.split(b"{", 1)[0]
            grows = name in growing or re.sub(rb"_(total|bucket|sum|count)$", b"", name) in growing
            self.lines.append((head.replace(f'job_id="{job}"'.encode(), b'job_id="%s"'),
                               value, grows))

    def render(self, job: str, turn: int) -> bytes:
        jid = job.encode()
        out = []
        for head, value, grows in self.lines:
            if b"%s" in head:
                head = head % jid
            out.append(b"%s %r\n" % (head, value * (turn + 1) if grows else value))
        return b"".join(out)


class Fleet:
    """Nodes n0000.. served at /node/<name>/metrics; jobs are assigned in
    groups (first `sizes[0]` nodes the first job, and so on; the rest one
    more job of their own)."""

    def __init__(self, exposition: Exposition, nodes: int, jobs: dict[str, int]):
        self.exposition = exposition
        self.names = [f"n{i:04d}" for i in range(nodes)]
        self.job_of: dict[str, str] = {}
        at = 0
        for job, size in jobs.items():
            for name in self.names[at:at + size]:
                self.job_of[name] = job
            at += size
        for name in self.names[at:]:
            self.job_of[name] = "rest"
        self.turns: dict[str, int] = {n: 0 for n in self.names}
        self.lock = threading.Lock()
        self.server: ThreadingHTTPServer | None = None

    def new_jobs(self, suffix: str) -> None:
        """Every node's job ends and the next one starts (new job ids)."""
        with self.lock:
            self.job_of = {n: f"{j}{suffix}" for n, j in self.job_of.items()}
            self.turns = {n: 0 for n in self.names}

    def start(self) -> int:
        fleet = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):
                parts = self.path.split("/")
                name = parts[2] if len(parts) == 4 and parts[1] == "node" else ""
                if name not in fleet.turns:
                    self.send_error(404)
                    return
                with fleet.lock:
                    turn = fleet.turns[name]
                    fleet.turns[name] = turn + 1
                    job = fleet.job_of[name]
                body = fleet.exposition.render(job, turn)
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self.server.server_address[1]

    def stop(self) -> None:
        if self.server:
            self.server.shutdown()
            self.server.server_close()

    def config(self, port: int, interval: str) -> dict:
        """One target per node: its path and its node label."""
        return {"global": {"scrape_interval": interval, "scrape_timeout": interval},
                "scrape_configs": [{
                    "job_name": "tracehound",
                    "static_configs": [{"targets": [f"127.0.0.1:{port}"],
                                        "labels": {"node": n,
                                                   "__metrics_path__": f"/node/{n}/metrics"}}
                                       for n in self.names]}]}


def own_metrics(url: str) -> dict[str, float]:
    """Prometheus's own gauges this benchmark reports."""
    want = ("prometheus_tsdb_head_series", "process_resident_memory_bytes",
            "prometheus_tsdb_head_series_created_total")
    out = {}
    with urllib.request.urlopen(url + "/metrics", timeout=30) as r:
        for line in r.read().decode().splitlines():
            name, _, value = line.partition(" ")
            if name in want:
                out[name] = float(value)
    return out


def wait_turns(fleet: Fleet, rounds: int, timeout: float) -> None:
    """Until every node was scraped ROUNDS times since its turns began."""
    deadline = time.monotonic() + timeout
    while min(fleet.turns.values()) < rounds:
        if time.monotonic() > deadline:
            raise RuntimeError(f"{len(fleet.names)} nodes were not scraped {rounds} times "
                               f"in {timeout:.0f} s")
        time.sleep(1)
