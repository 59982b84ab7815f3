"""How bench/scrape asks for a scrape and measures it: the request (text
or protobuf, gzip as Prometheus asks), its size in samples and bytes, and
the serving process's CPU and memory around it."""
from __future__ import annotations

import contextlib
import http.client
import os
import re
import socket
import time
from pathlib import Path
from typing import NamedTuple
from urllib.parse import urlsplit

from bench.scrape.report import CG_PARENT


TEXT = "text/plain;version=0.0.4"
PROTO = ("application/vnd.google.protobuf;proto=io.prometheus.client.MetricFamily;"
         "encoding=delimited;q=0.7,text/plain;version=0.0.4;q=0.3")
TICK = os.sysconf("SC_CLK_TCK")


# ---- reading one scrape ------------------------------------------------------

def lines_starting(body: bytes, prefix: bytes) -> int:
    return body.count(b"\n" + prefix) + body.startswith(prefix)


def value_of(body: bytes, series: bytes) -> float | None:
    i = body.find(b"\n" + series + b" ")
    if i < 0:
        return None
    return float(body[i + len(series) + 2:body.find(b"\n", i + 1)].split()[0])


def text_facts(body: bytes) -> dict:
    """What one plain-text scrape holds, counted without parsing it whole (the
    largest sizes answer with gigabytes)."""
    lines = body.count(b"\n") + (bool(body) and not body.endswith(b"\n"))
    mark, needle, bench, i = f'cgroup="/{CG_PARENT}/'.encode(), b"\ntracehound_io_read_bytes_total{", 0, 0
    while (i := body.find(needle, i)) >= 0:
        end = body.find(b"\n", i + 1)
        bench += mark in body[i:end]
        i = end
    return {"samples": lines - lines_starting(body, b"#") - body.count(b"\n\n"),
            "io_samples": lines_starting(body, b"tracehound_io_"),
            # every exported label set has a read-bytes counter
            "io_series": lines_starting(body, b"tracehound_io_read_bytes_total{"),
            "bench_series": bench,
            "series_tracked": value_of(body, b'tracehound_series_tracked{collector="io"}'),
            "overflow_total": value_of(body, b'tracehound_series_overflow_total{collector="io"}'),
            "map_entries": value_of(body, b'tracehound_map_entries{map="io_stats"}'),
            "collector_s": value_of(body, b'tracehound_collector_duration_seconds{collector="io"}')}


# ---- the report ---------------------------------------------------------------


def size_of(text: str) -> tuple[int, int]:
    n, m = text.lower().split("x")
    return int(n), int(m)


# ---- the measured process ------------------------------------------------------

def cpu_seconds(pid: int) -> float:
    # fields after the command name, which may itself hold spaces or ')'
    f = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(f[11]) + int(f[12])) / TICK


def memory_kb(pid: int) -> dict:
    st = Path(f"/proc/{pid}/status").read_text()
    return {k: int(re.search(rf"^{k}:\s+(\d+) kB", st, re.M).group(1)) for k in ("VmRSS", "VmHWM")}


class Reply(NamedTuple):
    status: int
    ctype: str
    encoding: str
    body: bytes
    wall: float


def get(url: str, headers: dict, timeout: float) -> Reply:
    """One request on a fresh connection, timed from connect to the last byte."""
    u = urlsplit(url)
    t0 = time.perf_counter()
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=timeout)
    try:
        conn.request("GET", u.path or "/", headers=headers)
        r = conn.getresponse()
        body = r.read()
        return Reply(r.status, r.getheader("Content-Type", ""), r.getheader("Content-Encoding", ""),
                     body, time.perf_counter() - t0)
    finally:
        conn.close()


def scrape_series(url: str, pid: int, n: int, timeout: float) -> dict:
    """Warm-up, n timed scrapes as Prometheus makes them (text, gzip; CPU
    across them), one plain-text and one protobuf scrape, then memory. A
    timeout ends the series: every further scrape of that agent would only
    wait as long."""
    out: dict = {"walls": [], "text_bytes": []}
    step = "warm-up"
    gzipped = {"Accept": TEXT, "Accept-Encoding": "gzip"}
    try:
        out["warmup_s"] = get(url, gzipped, timeout).wall
        cpu0 = cpu_seconds(pid)
        for i in range(n):
            step = f"scrape {i + 1}"
            r = get(url, gzipped, timeout)
            if r.status != 200:
                raise RuntimeError(f"/metrics answered {r.status}")
            out["walls"].append(r.wall)
        out["cpu_per_scrape_s"] = (cpu_seconds(pid) - cpu0) / n
        out["gzip"] = {"bytes": len(r.body), "encoding": r.encoding or "identity", "wall_s": r.wall}
        step = "plain text"
        r = get(url, {"Accept": TEXT}, timeout)
        out["text_bytes"].append(len(r.body))
        out["plain_wall_s"] = r.wall
        out["text_ctype"] = r.ctype
        out.update(text_facts(r.body))
        r = None
        step = "protobuf"
        r = get(url, {"Accept": PROTO}, timeout)
        out["protobuf"] = {"bytes": len(r.body), "ctype": r.ctype, "wall_s": r.wall,
                           "offered": r.ctype.startswith("application/vnd.google.protobuf")}
        step = "protobuf, gzip"
        r = get(url, {"Accept": PROTO, "Accept-Encoding": "gzip"}, timeout)
        out["protobuf"]["gzip_bytes"] = len(r.body) if r.encoding == "gzip" else None
    except (socket.timeout, TimeoutError):
        out["error"] = f"{step} timed out after {timeout:g} s"
    except (OSError, http.client.HTTPException, RuntimeError) as e:
        out["error"] = f"{step}: {e}"
    with contextlib.suppress(OSError):
        out.update(memory_kb(pid))
    return out


# ---- processes and workloads -------------------------------------------------
