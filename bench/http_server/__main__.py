"""The agent's HTTP server (tracehound/exporter/http.py, behind the
Exporter the agent runs) against the library server it replaces
(prometheus_client.start_http_server: ThreadingWSGIServer, wsgiref), both
serving the same registry, on loopback, in the same run.

Each server runs in its own process (serve.py), started fresh for every
measurement, so that the threads and resident memory read from /proc are
its own and start from the same place. The two servers take turns within
each round, first one then the other, and the order flips every round and
condition, so that a load that drifts falls on both:

1. alone: --scrapes sequential scrapes (GET /metrics, whole body read, a new
   connection each), then --concurrency scrapers at once;
2. beside slow clients: for each K in --crowds and each kind (half a
   request head then nothing; a request never read, 1 KiB receive buffer;
   a bare connection), K connections attach; one scrape at once, then, once
   the server's CPU is quiet, --phase-scrapes more (client timeout
   --timeout); the server's threads and memory before, at their peak, and
   a second after the K have left (the K connect 1 ms apart);
3. once: gzip, HEAD, keep-alive, the OpenMetrics Accept a Prometheus
   sends, prometheus_client's app on the agent's server (the server's share
   apart from the renderer's); --burst connects in the same instant; the
   smallest crowd of half-head clients staying --hold seconds (does the
   server drop them by itself?); over HTTPS, a scrape beside one client
   that connects and never starts its handshake.

Writes http-server.md, .json and .png to --out (bench/report):

    python -m bench.http_server                  # 2 rounds, about 3-4 minutes on 2 CPUs
    python -m bench.http_server --quick          # a smoke test, under a minute
"""
from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

from bench.common import REPO, loadavg, log, stamp

from . import phases, report
from .clients import KINDS, ok

SERVERS = ("agent", "library")


def parse(argv) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.http_server",
                                description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=2, help="interleaved rounds (2)")
    p.add_argument("--label-sets", type=int, default=2000,
                   help="label sets in the registry (2000: about 1.7 MB of text)")
    p.add_argument("--scrapes", type=int, default=60, help="sequential scrapes alone (60)")
    p.add_argument("--concurrency", type=int, default=4, help="scrapers at once (4)")
    p.add_argument("--concurrent-scrapes", type=int, default=10,
                   help="scrapes each concurrent scraper makes (10)")
    p.add_argument("--crowds", default="50,500", help="slow clients attached at once (50,500)")
    p.add_argument("--kinds", default=",".join(KINDS),
                   help=f"slow client kinds ({','.join(KINDS)})")
    p.add_argument("--phase-scrapes", type=int, default=15,
                   help="scrapes beside each crowd once the server is quiet (15)")
    p.add_argument("--timeout", type=float, default=10.0, help="a scrape's client timeout (10 s)")
    p.add_argument("--settle-limit", type=float, default=20.0,
                   help="longest wait for the server's CPU to go quiet after a crowd attaches")
    p.add_argument("--recover-limit", type=float, default=5.0,
                   help="longest wait for the server's threads to come back")
    p.add_argument("--burst", type=int, default=200,
                   help="connects made in the same instant, once (200; 0: skip)")
    p.add_argument("--hold", type=float, default=12.0,
                   help="seconds the smallest crowd of half-head clients stays, once, to see "
                        "whether the server drops them by itself (12; 0: skip)")
    p.add_argument("--no-tls", action="store_true", help="skip the HTTPS check")
    p.add_argument("--quick", action="store_true",
                   help="1 round, 500 label sets, crowds 20,100, fewer scrapes: a smoke test")
    p.add_argument("--out", type=Path, default=REPO / "bench" / "report")
    a = p.parse_args(argv)
    if a.quick:
        a.rounds, a.label_sets, a.scrapes, a.concurrent_scrapes = 1, 500, 20, 5
        a.crowds, a.phase_scrapes, a.burst, a.hold = "20,100", 5, 100, 11.0
    a.crowds = [int(c) for c in a.crowds.split(",") if c]
    a.kinds = [k for k in a.kinds.split(",") if k]
    unknown = set(a.kinds) - set(KINDS)
    if unknown or a.rounds < 1 or not a.crowds:
        p.error(f"unknown kinds {sorted(unknown)}" if unknown else "need a round and a crowd")
    return a


def _line(r: dict) -> str:
    return f"{r['status']}" if ok(r) else f"{r['status'] or r['error']}"


def main(argv=None) -> int:
    args = parse(sys.argv[1:] if argv is None else argv)
    head = stamp()
    log(f"http-server at {head['commit']} on {head['machine']}: {args.rounds} round(s), "
        f"{args.label_sets} label sets, crowds {args.crowds} x {args.kinds}")
    t_start = time.monotonic()
    data: dict = {"alone": {s: [] for s in SERVERS}, "beside": {}, "tls": {}, "burst": {},
                  "hold": {}}
    conditions = [(kind, k) for k in args.crowds for kind in args.kinds]
    for rnd in range(args.rounds):
        order = SERVERS if rnd % 2 == 0 else SERVERS[::-1]
        for srv in order:
            res = phases.alone(srv, args, extras=rnd == 0)
            data["alone"][srv].append(res)
            seq = sorted(r["s"] for r in res["sequential"] if ok(r))
            log(f"round {rnd + 1} {srv} alone: median {1000 * seq[len(seq) // 2]:.1f} ms "
                f"({len(seq)}/{len(res['sequential'])} ok), {res['body_bytes']} bytes")
        for ci, (kind, k) in enumerate(conditions):
            order = SERVERS if (rnd + ci) % 2 == 0 else SERVERS[::-1]
            for srv in order:
                res = phases.beside(srv, kind, k, args)
                data["beside"].setdefault(f"{kind}/{k}", {s: [] for s in SERVERS})[srv].append(res)
                st = sorted(r["s"] for r in res["steady"] if ok(r))
                med = f"{1000 * st[len(st) // 2]:.1f} ms" if st else "-"
                log(f"round {rnd + 1} {srv} beside {k} {kind}: first {_line(res['first'])} in "
                    f"{res['first']['s']:.2f} s, then median {med} "
                    f"({len(st)}/{len(res['steady'])} ok); threads {res['before']['threads']}"
                    f" -> {res['peak']['threads']:.0f} -> {res['after']['threads']}, RSS "
                    f"{res['before']['rss_mb']:.0f} -> {res['peak']['rss_mb']:.0f} -> "
                    f"{res['after']['rss_mb']:.0f} MB")
    if args.burst:
        data["burst"] = {srv: phases.burst(srv, args.burst, args) for srv in SERVERS}
    if args.hold:
        data["hold"] = {srv: phases.hold(srv, min(args.crowds), args.hold, args)
                        for srv in SERVERS}
    if not args.no_tls:
        with tempfile.TemporaryDirectory() as tmp:
            cert = phases.make_cert(Path(tmp))
            for srv in SERVERS:
                data["tls"][srv] = phases.tls_silent(srv, cert, args)
    head["loadavg_end"] = loadavg()
    head["run_s"] = round(time.monotonic() - t_start, 1)
    md, js, png = report.write(head, data, args)
    log(f"wrote {md}, {js}" + (f", {png}" if png else "") + f" in {head['run_s']:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
