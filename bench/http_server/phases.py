"""The measurements, each against one server started fresh for it (so that
the memory and threads before are that server's own, not what an earlier
phase left behind)."""
from __future__ import annotations

import http.client
import socket
import subprocess
import time
from pathlib import Path

from bench.common import log

from .clients import (HOST, Crowd, Sampler, Server, concurrent, scrape, tls_client, wait_quiet,
                      wait_threads)

PROMETHEUS_ACCEPT = ("application/openmetrics-text;version=1.0.0;q=0.5,"
                     "text/plain;version=0.0.4;q=0.2,*/*;q=0.1")


def _warm(srv: Server, timeout: float) -> None:
    for _ in range(3):
        scrape(srv.port, timeout=timeout)
    time.sleep(0.2)


def alone(kind: str, args, extras: bool) -> dict:
    """Sequential scrapes, then `args.concurrency` scrapers at once; with
    `extras`, what else an exporter's user meets (gzip, HEAD, keep-alive,
    OpenMetrics, and for the agent prometheus_client's app on its server)."""
    srv = Server(kind, args.label_sets)
    try:
        _warm(srv, args.timeout)
        seq = [scrape(srv.port, timeout=args.timeout) for _ in range(args.scrapes)]
        conc, wall = concurrent(srv.port, args.concurrency, args.concurrent_scrapes,
                                args.timeout)
        out = {"sequential": seq, "concurrent": conc, "concurrent_wall_s": wall,
               "stats": srv.stats(), "body_bytes": seq[0]["bytes"],
               "chunked": seq[0].get("chunked")}
        if extras:
            out["extras"] = _extras(srv, args)
        out["tracebacks"] = srv.tracebacks()
        return out
    finally:
        srv.stop()


def _extras(srv: Server, args) -> dict:
    n = max(5, args.scrapes // 4)
    gz = [scrape(srv.port, headers={"Accept-Encoding": "gzip"}, timeout=args.timeout)
          for _ in range(n)]
    head = scrape(srv.port, method="HEAD", timeout=args.timeout)
    om = scrape(srv.port, headers={"Accept": PROMETHEUS_ACCEPT}, timeout=args.timeout)
    # keep-alive: n scrapes through one client connection; a server that
    # closes after each answer costs a new TCP connection per scrape
    conn = http.client.HTTPConnection(HOST, srv.port, timeout=args.timeout)
    kept = [scrape(srv.port, conn=conn, timeout=args.timeout) for _ in range(n)]
    conn.close()
    out = {"gzip": gz, "head": head, "openmetrics": om, "keepalive": kept,
           "keepalive_kept": not any(r.get("will_close", True) for r in kept)}
    if srv.kind == "agent":
        # prometheus_client's own WSGI app, served by the agent's server:
        # the server's share of a scrape apart from the renderer's
        out["library_app_on_agent_server"] = [
            scrape(srv.port, path="/plain", timeout=args.timeout) for _ in range(n)]
    return out


def beside(kind: str, crowd_kind: str, count: int, args) -> dict:
    """K slow clients of one kind attach; a first real scrape at once, then
    (once the server's CPU is quiet) `args.phase_scrapes` more; they leave;
    how soon the server's threads are back, its memory a second later, and
    the CPU it spent meanwhile (work done for clients that are gone)."""
    srv = Server(kind, args.label_sets)
    try:
        _warm(srv, args.timeout)
        before = srv.stats()
        sampler = Sampler(srv.pid).start()
        crowd = Crowd(srv.port, crowd_kind, count)
        attach_s = crowd.attach(args.settle_limit)
        first = scrape(srv.port, timeout=args.timeout)
        settle_s = wait_quiet(srv.pid, args.settle_limit)
        held = srv.stats()
        steady = [scrape(srv.port, timeout=args.timeout) for _ in range(args.phase_scrapes)]
        peak = sampler.peak()
        at_leave = srv.stats()
        crowd.leave()
        back_s = wait_threads(srv.pid, before["threads"], args.recover_limit)
        time.sleep(1.0)
        after = srv.stats()
        answered = scrape(srv.port, timeout=args.timeout)
        return {"attach_s": attach_s, "attach_failed": crowd.failed, "first": first,
                "settle_s": settle_s, "steady": steady, "before": before, "held": held,
                "peak": peak, "threads_back_s": back_s, "after": after,
                "cpu_after_leave_s": after["cpu_s"] - at_leave["cpu_s"],
                "after_window_s": (back_s if back_s is not None else args.recover_limit) + 1.0,
                "after_scrape": answered, "tracebacks": srv.tracebacks()}
    finally:
        srv.stop()


def burst(kind: str, count: int, args) -> dict:
    """`count` connects in the same instant (bare connections, as a scanner
    or a restarting fleet of pollers makes): a real scrape made at once, and
    how long until every one of them is connected (at most 10 s)."""
    srv = Server(kind, args.label_sets)
    try:
        _warm(srv, args.timeout)
        crowd = Crowd(srv.port, "idle", count)
        t0 = time.perf_counter()
        crowd.connect(pace=0)
        first = scrape(srv.port, timeout=args.timeout)
        left = crowd.wait(10.0)
        all_s = time.perf_counter() - t0
        crowd.leave()
        log(f"  burst of {count} at {kind}: scrape {_fmt(first)}, "
            f"{count - left}/{count} connected in {all_s:.2f} s")
        return {"first": first, "connected": count - left, "all_s": all_s}
    finally:
        srv.stop()


def hold(kind: str, count: int, seconds: float, args) -> dict:
    """`count` clients send half a request head and stay: after `seconds`
    (past the agent's 10 s idle deadline), how many the server has dropped
    by itself, and the threads it still holds for them."""
    srv = Server(kind, args.label_sets)
    try:
        _warm(srv, args.timeout)
        before = srv.stats()["threads"]
        crowd = Crowd(srv.port, "half-head", count)
        crowd.attach()
        held = srv.stats()["threads"]
        time.sleep(seconds)
        out = {"threads_before": before, "threads_held": held,
               "threads_after_hold": srv.stats()["threads"],
               "dropped_by_server": crowd.closed_by_server(), "count": count,
               "seconds": seconds}
        crowd.leave()
        log(f"  {count} half-head clients that stay, {kind}: threads {before} -> {held} -> "
            f"{out['threads_after_hold']} after {seconds:.0f} s, "
            f"{out['dropped_by_server']} dropped by the server")
        return out
    finally:
        srv.stop()


def make_cert(folder: Path) -> tuple[str, str]:
    cert, key = folder / "tls.crt", folder / "tls.key"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt",
                    "ec_paramgen_curve:prime256v1", "-nodes", "-days", "2", "-subj",
                    "/CN=127.0.0.1", "-keyout", str(key), "-out", str(cert)],
                   check=True, capture_output=True)
    return str(cert), str(key)


def tls_silent(kind: str, cert: tuple[str, str], args) -> dict:
    """HTTPS: a scrape alone, one beside a client that connects and never
    starts its TLS handshake, and one after that client has gone."""
    srv = Server(kind, args.label_sets, cert)
    ctx = tls_client()
    try:
        alone_ = scrape(srv.port, tls=ctx, timeout=args.timeout)
        silent = socket.create_connection((HOST, srv.port), timeout=3)
        time.sleep(0.2)
        beside_ = scrape(srv.port, tls=ctx, timeout=args.timeout)
        silent.close()
        time.sleep(0.2)
        after = scrape(srv.port, tls=ctx, timeout=args.timeout)
        log(f"  tls {kind}: alone {_fmt(alone_)}, beside a silent client {_fmt(beside_)}, "
            f"after it left {_fmt(after)}")
        return {"alone": alone_, "beside_silent": beside_, "after": after}
    finally:
        srv.stop()


def _fmt(r: dict) -> str:
    return f"{r['status'] or r['error']} in {r['s']:.3f} s"
