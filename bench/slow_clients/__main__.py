"""The exporter under clients that read slowly or not at all: whether a real
scrape is still answered, how long it takes, and the server's memory.

Starts the exporter alone (no probes) in a child process, from this
checkout's src/ or from another tree's (--src, e.g. an older commit
exported with `git archive`), serving a registry of about --megabytes of
text, then:

1. non-readers: --non-readers connections ask for /metrics and never read
   (a 1 KiB receive buffer); for --seconds while they hold on, a real
   scrape is made every half second (status and seconds), then how long
   until a scrape is answered again once they hang up (at most 60 s);
2. concurrent readers: --readers clients read /metrics at full speed at
   once while a real scrape is timed; the server's resident memory is
   sampled before, at its peak, and a few seconds after.

    .venv/bin/python -m bench.slow_clients [--src DIR] [--megabytes 31]
        [--readers 32] [--non-readers 64] [--seconds 15] [--phase both]

Writes slow-clients.md, .json and .png to --out (bench/report), each
stamped with commit and machine; the same clients against the library's
server (prometheus_client) are bench/http_server's. Only 127.0.0.1 is used.
"""
from __future__ import annotations

import argparse
import http.client
import json
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

from bench.common import REPO, REPORT, log, stamp, verdict

SERVER = r"""
import sys, threading
from prometheus_client import CollectorRegistry
from prometheus_client.core import GaugeMetricFamily
from tracehound.exporter.server import Exporter

samples = int(sys.argv[1])

class Wide:
    def collect(self):
        fam = GaugeMetricFamily("bench_wide", "Many series.", labels=["i", "pad"])
        for i in range(samples):
            fam.add_metric([str(i), "p" * 40], float(i))
        yield fam

registry = CollectorRegistry()
registry.register(Wide())
exporter = Exporter(registry, "127.0.0.1:0").start()
exporter.set_ready(True)
print(exporter.port, flush=True)
threading.Event().wait()
"""
LINE_BYTES = 74          # bench_wide{i="123456",pad="ppp...40"} 123456.0


def rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def scrape(port: int, timeout: float = 120.0) -> tuple[int, float, int]:
    began = time.monotonic()
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        conn.request("GET", "/metrics")
        resp = conn.getresponse()
        size = len(resp.read())
        return resp.status, time.monotonic() - began, size
    except OSError:
        return 0, time.monotonic() - began, 0
    finally:
        conn.close()


def non_reader(port: int) -> socket.socket:
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1024)
    sock.connect(("127.0.0.1", port))
    sock.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
    return sock


def non_readers(port: int, args) -> dict:
    """A real scrape every half second while the non-readers hold on."""
    held = []
    rounds = []
    try:
        held = [non_reader(port) for _ in range(args.non_readers)]
        began = time.monotonic()
        while time.monotonic() - began < args.seconds:
            status, took, _ = scrape(port)
            rounds.append((round(time.monotonic() - began, 1), status, round(took, 2)))
            time.sleep(0.5)
    finally:
        for sock in held:
            sock.close()
    # until the server has let go of them
    began = time.monotonic()
    while scrape(port)[0] != 200 and time.monotonic() - began < 60:
        time.sleep(0.2)
    answered = [r for r in rounds if r[1] == 200]
    return {"non_readers": args.non_readers, "rounds": len(rounds),
            "free_again_after_s": round(time.monotonic() - began, 2),
            "answered_200": len(answered), "refused_503": sum(r[1] == 503 for r in rounds),
            "first_200_at_s": answered[0][0] if answered else None,
            "slowest_200_s": max((r[2] for r in answered), default=None),
            "timeline": rounds}


def readers(port: int, pid: int, args) -> dict:
    """--readers full-speed reads at once, and a real scrape beside them."""
    before = rss_mb(pid)
    peak = [before]
    done = threading.Event()

    def sample():
        while not done.wait(0.05):
            peak.append(rss_mb(pid))
    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    results = []
    threads = [threading.Thread(target=lambda: results.append(scrape(port)))
               for _ in range(args.readers)]
    for t in threads:
        t.start()
    time.sleep(0.5)
    status, took, _ = scrape(port)
    for t in threads:
        t.join()
    time.sleep(3)
    done.set()
    sampler.join()
    return {"readers": args.readers, "all_200": all(r[0] == 200 for r in results),
            "slowest_reader_s": round(max(r[1] for r in results), 2),
            "scrape_beside_them": {"status": status, "seconds": round(took, 2)},
            "rss_mb_before": round(before, 1), "rss_mb_peak": round(max(peak), 1),
            "rss_mb_3s_after": round(rss_mb(pid), 1)}


def targets(res: dict) -> list[tuple[str, str, bool | None]]:
    """(target, measured, met): what a Prometheus scraping this node expects."""
    alone = res["alone"]["seconds"]
    rows = []
    nr = res.get("beside_non_readers")
    if nr:
        first = nr["first_200_at_s"]
        rows.append((f"{nr['non_readers']} non-readers held: a scrape answered 200 within 10 s "
                     "(Prometheus' default scrape timeout)",
                     "never" if first is None else f"first 200 at {first} s", first is not None and first <= 10))
        rows.append(("once they hang up: answered again within 2x a scrape alone",
                     f"{nr['free_again_after_s']} s (alone {alone} s)", nr["free_again_after_s"] <= 2 * alone))
    cr = res.get("concurrent_readers")
    if cr:
        took = cr["scrape_beside_them"]["seconds"]
        rows.append((f"beside {cr['readers']} full-speed readers: a scrape within 1.5x alone",
                     f"{took} s (alone {alone} s)", cr["scrape_beside_them"]["status"] == 200 and took <= 1.5 * alone))
        grew, text = cr["rss_mb_peak"] - cr["rss_mb_before"], res["alone"]["mb"]
        rows.append((f"readers share one rendering: the server grows by at most 2x the text "
                     f"({2 * text:.0f} MB) while they read",
                     f"{grew:.0f} MB ({cr['rss_mb_before']} -> {cr['rss_mb_peak']} MB)", grew <= 2 * text))
    return rows


def write_report(out: Path, res: dict) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "slow-clients.json").write_text(json.dumps(res, indent=1) + "\n")
    st, rows = res["stamp"], targets(res)
    for target, got, ok in rows:
        log(f"{verdict(ok)} {target}: {got}")
    lines = ["# The exporter under slow and non-reading clients", "",
             f"Commit {st['commit']}, {st['machine']}, {st['date']}; load average "
             f"{' '.join(st['loadavg_start'])} at the start. `python -m bench.slow_clients`: the "
             f"exporter alone (no probes) in its own process, serving {res['samples']:,} samples "
             f"({res['alone']['mb']} MB of text) rendered as one family; a scrape alone took "
             f"{res['alone']['seconds']} s, the server's RSS idle {res['rss_mb_idle']} MB.", "",
             "| target | measured | met |", "|---|---|---|"]
    lines += [f"| {t} | {g} | {'yes' if ok else 'no'} |" for t, g, ok in rows]
    nr = res.get("beside_non_readers")
    if nr:
        lines += ["", f"While {nr['non_readers']} clients asked and never read (1 KiB receive buffer): "
                  f"{nr['rounds']} scrapes, {nr['answered_200']} answered 200, {nr['refused_503']} refused "
                  f"with 503 (the server sheds what it cannot serve rather than queue it), slowest 200 "
                  f"{nr['slowest_200_s']} s."]
    cr = res.get("concurrent_readers")
    if cr:
        lines += ["", f"{cr['readers']} full-speed readers at once: all answered 200: {cr['all_200']}; "
                  f"slowest {cr['slowest_reader_s']} s; RSS before / peak / 3 s after: "
                  f"{cr['rss_mb_before']} / {cr['rss_mb_peak']} / {cr['rss_mb_3s_after']} MB."]
    lines += ["", "The same kinds of client against prometheus_client's own server, with the "
              "agent's registry: [http-server](http-server.md)."]
    if nr and plot(out / "slow-clients.png", nr):
        lines += ["", "![slow clients](slow-clients.png)"]
    (out / "slow-clients.md").write_text("\n".join(lines) + "\n")


def plot(path: Path, nr: dict) -> bool:
    """Each scrape's seconds against when it was made, by its answer."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    fig, ax = plt.subplots(figsize=(7, 3.2))
    for status, colour, label in ((200, "tab:green", "200"), (503, "tab:orange", "503"), (0, "tab:red", "no answer")):
        pts = [(t, s) for t, st, s in nr["timeline"] if st == status]
        if pts:
            ax.scatter(*zip(*pts), color=colour, label=label, s=18)
    ax.set_xlabel(f"seconds since {nr['non_readers']} non-readers attached")
    ax.set_ylabel("scrape (s)")
    ax.legend(title="answer")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def main() -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.slow_clients",
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("--src", default=os.path.join(REPO, "src"),
                    help="the tree whose exporter serves (default this checkout's)")
    ap.add_argument("--out", type=Path, default=REPORT)
    ap.add_argument("--megabytes", type=float, default=31.0)
    ap.add_argument("--readers", type=int, default=32)
    ap.add_argument("--non-readers", type=int, default=64)
    ap.add_argument("--seconds", type=float, default=15.0,
                    help="how long the non-readers hold on (a scrape every 0.5 s)")
    ap.add_argument("--phase", choices=("both", "non-readers", "readers"), default="both",
                    help="each in a fresh server process for clean figures")
    args = ap.parse_args()
    samples = int(args.megabytes * 1e6 / LINE_BYTES)
    env = dict(os.environ, PYTHONPATH=os.path.abspath(args.src))
    child = subprocess.Popen([sys.executable, "-c", SERVER, str(samples)], env=env,
                             stdout=subprocess.PIPE, text=True)
    out: dict = {"stamp": stamp(), "src": args.src, "samples": samples,
                 "settings": {k: v for k, v in vars(args).items() if k != "out"}}
    log(f"serving {samples:,} samples from {args.src}")
    try:
        port = int(child.stdout.readline())
        status, took, size = scrape(port)
        out["alone"] = {"status": status, "seconds": round(took, 2), "mb": round(size / 1e6, 1)}
        time.sleep(2)
        out["rss_mb_idle"] = round(rss_mb(child.pid), 1)
        if args.phase in ("both", "non-readers"):
            log(f"{args.non_readers} non-readers for {args.seconds:g} s, a scrape every 0.5 s")
            out["beside_non_readers"] = non_readers(port, args)
        if args.phase in ("both", "readers"):
            log(f"{args.readers} concurrent readers and a scrape beside them")
            out["concurrent_readers"] = readers(port, child.pid, args)
    finally:
        child.kill()
        child.wait()
    write_report(args.out, out)
    return 0 if all(ok is not False for _, _, ok in targets(out)) else 1


if __name__ == "__main__":
    sys.exit(main())
