"""The two readers of the accuracy bench (bench/accuracy): this script's
own scrapes of the agent, and a real Prometheus scraping it, both every second.
"""
from __future__ import annotations

import json
import subprocess
import threading
import time
import urllib.parse
import urllib.request

from prometheus_client.parser import text_string_to_metric_families

from testbed.prometheus import free_port, launch

READ, WRITE, FILL = ("tracehound_io_read_bytes_total", "tracehound_io_write_bytes_total",
                     "tracehound_io_pagecache_fill_bytes_total")
METRICS = (READ, WRITE, FILL)
SAMPLE_S = 1.0          # this script's own scrape period (Prometheus: scrape_interval 1s)


class Sampler(threading.Thread):
    """Scrapes the agent every SAMPLE_S seconds; keeps, per scrape, the wall
    times around it and the byte counters of the cgroup `prefix` and those
    below it."""

    def __init__(self, url: str, prefix: str, phase: float | None = None):
        super().__init__(daemon=True)
        self.url, self.prefix, self.phase = url, prefix, phase
        self.samples: list[dict] = []
        self.errors: list[str] = []
        self.halt = threading.Event()

    def scrape(self) -> dict:
        t0 = time.time()
        with urllib.request.urlopen(self.url, timeout=10) as r:
            text = r.read().decode()
        t1 = time.time()
        values = {}
        for fam in text_string_to_metric_families(text):
            for s in fam.samples:
                cg = s.labels.get("cgroup", "")
                if s.name in METRICS and (cg == self.prefix or cg.startswith(self.prefix + "/")):
                    values[(s.name, s.labels["cgroup"], s.labels.get("mountpoint", ""))] = s.value
        # the io collector runs first in a collection: its maps are read within
        # a millisecond or two of the request, however long the rest takes
        return {"t0": t0, "t1": t1, "t": t0, "values": values}

    def run(self) -> None:
        if self.phase is not None:
            self.halt.wait((self.phase - time.time()) % 1.0)
        nxt = time.monotonic()
        while not self.halt.is_set():
            try:
                self.samples.append(self.scrape())
            except Exception as e:   # one failed scrape is a gap, not the end of the run
                self.errors.append(f"{time.time():.3f} {e}")
            nxt += SAMPLE_S
            self.halt.wait(max(0.0, nxt - time.monotonic()))

    def stop(self) -> None:
        self.halt.set()
        self.join(timeout=15)


def prometheus_series(url: str, cgroup_prefix: str, end: float, span_s: int) -> dict:
    """Raw samples of every counter of the phases' cgroups:
    {"metric|cgroup|mountpoint": [[t, value], ...]}."""
    out = {}
    for metric in METRICS:
        # the prefix is /thbench-accuracy-<hex>: nothing in it a regular expression reads
        q = f'{metric}{{cgroup=~"{cgroup_prefix}/.*"}}[{span_s}s]'
        qs = urllib.parse.urlencode({"query": q, "time": f"{end:.3f}"})
        with urllib.request.urlopen(f"{url}/api/v1/query?{qs}", timeout=30) as r:
            body = json.load(r)
        for s in body["data"]["result"]:
            lb = s["metric"]
            key = f"{metric}|{lb.get('cgroup', '')}|{lb.get('mountpoint', '')}"
            out[key] = [[float(t), float(v)] for t, v in s["values"]]
    return out


def start_prometheus(agent_url: str, work: str) -> tuple[subprocess.Popen, str]:
    """A real Prometheus scraping the agent every second (its process and URL;
    the caller waits for it, so a failed start is stopped too)."""
    target = agent_url.split("//", 1)[1].split("/", 1)[0]
    config = {"global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
              "scrape_configs": [{"job_name": "tracehound",
                                  "static_configs": [{"targets": [target]}]}]}
    port = free_port()
    return launch(work, config, port), f"http://127.0.0.1:{port}"


def prometheus_phase(url: str, timeout: float = 15.0) -> float | None:
    """Where in each second Prometheus scrapes the agent (from the timestamps
    of its `up` samples), or None if it has not scraped yet."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        qs = urllib.parse.urlencode({"query": "up[10s]", "time": f"{time.time():.3f}"})
        with urllib.request.urlopen(f"{url}/api/v1/query?{qs}", timeout=10) as r:
            result = json.load(r)["data"]["result"]
        if result and result[0]["values"]:
            return float(result[0]["values"][-1][0]) % 1.0
        time.sleep(0.5)
    return None
