"""From the rounds' results to figures, targets and ratios (library ÷
agent, this run only), written as http-server.md, .json and .png."""
from __future__ import annotations

import json
import math
import statistics
from pathlib import Path

from .clients import KINDS, ok
from .plot import NAMES, SERVERS, plot

# the targets: what an exporter must hold to, whatever serves it
ALONE_P99_MS = 500
CONCURRENT_P99_MS = 1000
BESIDE_P99_MS = 1000
THREADS_MAX = 100
RSS_GROWTH_MB = 100
RSS_LEFT_MB = 50


def pct(xs, q: float):
    """Nearest-rank percentile (q in 0..100); None for no values."""
    xs = sorted(xs)
    if not xs:
        return None
    return xs[min(len(xs) - 1, max(0, math.ceil(q / 100 * len(xs)) - 1))]


def _ms(results) -> list[float]:
    return [1000 * r["s"] for r in results if ok(r)]


def _failed(results) -> int:
    return sum(not ok(r) for r in results)


def _alone(runs: list) -> dict:
    seq = [r for run in runs for r in run["sequential"]]
    conc = [r for run in runs for r in run["concurrent"]]
    wall = sum(run["concurrent_wall_s"] for run in runs)
    return {"seq_p50_ms": pct(_ms(seq), 50), "seq_p99_ms": pct(_ms(seq), 99),
            "seq_n": len(seq), "seq_failed": _failed(seq),
            "conc_p50_ms": pct(_ms(conc), 50), "conc_p99_ms": pct(_ms(conc), 99),
            "conc_n": len(conc), "conc_failed": _failed(conc),
            "conc_per_s": sum(ok(r) for r in conc) / wall if wall else None,
            "round_seq_p50_ms": [pct(_ms(run["sequential"]), 50) for run in runs],
            "rss_mb": statistics.median(run["stats"]["rss_mb"] for run in runs),
            "threads": max(run["stats"]["threads"] for run in runs),
            "body_bytes": runs[0]["body_bytes"], "chunked": runs[0]["chunked"],
            "tracebacks": sum(run["tracebacks"] for run in runs)}


def _beside(runs: list) -> dict:
    steady = [r for run in runs for r in run["steady"]]
    back = [run["threads_back_s"] for run in runs]
    return {
        "first": [{k: run["first"][k] for k in ("s", "status", "error")} for run in runs],
        "first_ok": all(ok(run["first"]) for run in runs),
        "first_max_s": max(run["first"]["s"] for run in runs),
        "steady_p50_ms": pct(_ms(steady), 50), "steady_p99_ms": pct(_ms(steady), 99),
        "steady_max_ms": max(_ms(steady), default=None),
        "steady_n": len(steady), "steady_failed": _failed(steady),
        "steady_errors": sorted({str(r["status"] or r["error"]) for r in steady if not ok(r)}),
        "attach_s": max(run["attach_s"] for run in runs),
        "attach_failed": sum(run["attach_failed"] for run in runs),
        "settle_s": max(run["settle_s"] for run in runs),
        "threads_before": max(run["before"]["threads"] for run in runs),
        "threads_held": max(run["held"]["threads"] for run in runs),
        "threads_peak": max(run["peak"]["threads"] for run in runs),
        "threads_after": max(run["after"]["threads"] for run in runs),
        "threads_back_s": None if None in back else max(back),
        "rss_before_mb": max(run["before"]["rss_mb"] for run in runs),
        "rss_peak_mb": max(run["peak"]["rss_mb"] for run in runs),
        "rss_after_mb": max(run["after"]["rss_mb"] for run in runs),
        "rss_growth_mb": max(run["peak"]["rss_mb"] - run["before"]["rss_mb"] for run in runs),
        "rss_left_mb": max(run["after"]["rss_mb"] - run["before"]["rss_mb"] for run in runs),
        "after_ok": all(ok(run["after_scrape"]) for run in runs),
        "cpu_after_leave_s": max(run["cpu_after_leave_s"] for run in runs),
        "tracebacks": sum(run["tracebacks"] for run in runs),
    }


def _extras(run: dict) -> dict:
    ex = run.get("extras") or {}
    if not ex:
        return {}
    out = {"gzip_p50_ms": pct(_ms(ex["gzip"]), 50), "gzip_bytes": ex["gzip"][0]["bytes"],
           "gzip_encoding": ex["gzip"][0].get("encoding"),
           "head_status": ex["head"]["status"], "head_bytes": ex["head"]["bytes"],
           "keepalive_kept": ex["keepalive_kept"],
           "keepalive_p50_ms": pct(_ms(ex["keepalive"]), 50),
           "openmetrics_type": ex["openmetrics"].get("type")}
    if "library_app_on_agent_server" in ex:
        out["library_app_p50_ms"] = pct(_ms(ex["library_app_on_agent_server"]), 50)
    return out


def _ratio(a, b):
    return round(b / a, 2) if a and b is not None else None


def summarize(data: dict) -> dict:
    s = {"alone": {srv: _alone(data["alone"][srv]) for srv in SERVERS},
         "beside": {c: {srv: _beside(v[srv]) for srv in SERVERS}
                    for c, v in data["beside"].items()},
         "extras": {srv: _extras(data["alone"][srv][0]) for srv in SERVERS},
         "tls": {srv: {k: {f: v[f] for f in ("s", "status", "error")} for k, v in t.items()}
                 for srv, t in data["tls"].items()},
         "burst": {srv: {"first": {f: b["first"][f] for f in ("s", "status", "error")},
                         "connected": b["connected"], "all_s": b["all_s"]}
                   for srv, b in data.get("burst", {}).items()},
         "hold": data.get("hold", {}),
         "tcp_wmem_max": int(Path("/proc/sys/net/ipv4/tcp_wmem").read_text().split()[2])}
    a, lib = s["alone"]["agent"], s["alone"]["library"]
    r = {"alone_seq_p50": _ratio(a["seq_p50_ms"], lib["seq_p50_ms"]),
         "alone_seq_p99": _ratio(a["seq_p99_ms"], lib["seq_p99_ms"]),
         "alone_seq_p50_per_round": [_ratio(x, y) for x, y in
                                     zip(a["round_seq_p50_ms"], lib["round_seq_p50_ms"])],
         "concurrent_p50": _ratio(a["conc_p50_ms"], lib["conc_p50_ms"]),
         "concurrent_per_s": _ratio(lib["conc_per_s"], a["conc_per_s"])}
    for c, v in s["beside"].items():
        for f in ("steady_p50_ms", "steady_p99_ms", "threads_peak", "rss_growth_mb"):
            r[f"{c} {f}"] = _ratio(v["agent"][f], v["library"][f])
    s["ratios"] = r
    return s


def _v(passed: bool, figure: str) -> str:
    return ("pass" if passed else "**FAIL**") + f" ({figure})"


def _f(x, unit="", nd=0) -> str:
    return "-" if x is None else f"{x:,.{nd}f}{unit}"


def targets(s: dict, args) -> list[tuple[str, dict]]:
    rows = []
    k = max(args.crowds)
    at_k = {c: v for c, v in s["beside"].items() if c.endswith(f"/{k}")}
    for srv_rows in [
        (f"a scrape alone: p99 within {ALONE_P99_MS} ms",
         lambda srv: (s["alone"][srv]["seq_failed"] == 0
                      and s["alone"][srv]["seq_p99_ms"] <= ALONE_P99_MS,
                      f"{_f(s['alone'][srv]['seq_p99_ms'], ' ms')}")),
        (f"{args.concurrency} scrapers at once: each answered, p99 within {CONCURRENT_P99_MS} ms",
         lambda srv: (s["alone"][srv]["conc_failed"] == 0
                      and (s["alone"][srv]["conc_p99_ms"] or 1e9) <= CONCURRENT_P99_MS,
                      f"{_f(s['alone'][srv]['conc_p99_ms'], ' ms')}"))]:
        rows.append((srv_rows[0], {srv: _v(*srv_rows[1](srv)) for srv in SERVERS}))
    for c, v in at_k.items():
        kind = c.split("/")[0]
        rows.append((f"beside {k} {kind} clients: every scrape answered 200, p99 within "
                     f"{BESIDE_P99_MS / 1000:.0f} s",
                     {srv: _v(v[srv]["steady_failed"] == 0
                              and (v[srv]["steady_p99_ms"] or 1e9) <= BESIDE_P99_MS,
                              f"{_f(v[srv]['steady_p99_ms'], ' ms')}, "
                              f"{v[srv]['steady_failed']}/{v[srv]['steady_n']} failed")
                          for srv in SERVERS}))
    rows.append((f"the scrape made as {k} slow clients arrive: 200 within the "
                 f"{args.timeout:.0f} s client timeout (every kind, every round)",
                 {srv: _v(all(v[srv]["first_ok"] for v in at_k.values()),
                          "slowest " + ", ".join(
                              f"{c.split('/')[0]} {_first(v[srv])}" for c, v in at_k.items()))
                  for srv in SERVERS}))
    rows.append((f"threads stay bounded: at most {THREADS_MAX} while {k} slow clients are attached",
                 {srv: _v(max(v[srv]["threads_peak"] for v in at_k.values()) <= THREADS_MAX,
                          f"{max(v[srv]['threads_peak'] for v in at_k.values()):.0f}")
                  for srv in SERVERS}))
    rows.append((f"memory stays bounded: at most {RSS_GROWTH_MB} MB more while {k} slow clients "
                 "are attached",
                 {srv: _v(max(v[srv]["rss_growth_mb"] for v in at_k.values()) <= RSS_GROWTH_MB,
                          f"+{max(v[srv]['rss_growth_mb'] for v in at_k.values()):.0f} MB")
                  for srv in SERVERS}))
    every = s["beside"].values()
    rows.append((f"after slow clients leave: threads back within {args.recover_limit:.0f} s "
                 "and a scrape answered (every crowd)",
                 {srv: _v(all(v[srv]["threads_back_s"] is not None and v[srv]["after_ok"]
                              for v in every),
                          _back(max((v[srv]["threads_back_s"] or math.inf for v in every)),
                                args.recover_limit))
                  for srv in SERVERS}))
    rows.append((f"after they leave, at most {RSS_LEFT_MB} MB more memory than before "
                 "(every crowd)",
                 {srv: _v(max(v[srv]["rss_left_mb"] for v in every) <= RSS_LEFT_MB,
                          f"+{max(v[srv]['rss_left_mb'] for v in every):.0f} MB")
                  for srv in SERVERS}))
    if s["hold"]:
        h = s["hold"]
        rows.append((f"a client that never finishes its request head is dropped by the server "
                     f"(checked {h['agent']['seconds']:.0f} s after {h['agent']['count']} came)",
                     {srv: _v(h[srv]["dropped_by_server"] == h[srv]["count"],
                              f"{h[srv]['dropped_by_server']}/{h[srv]['count']} dropped, "
                              f"{h[srv]['threads_after_hold']} threads")
                      for srv in SERVERS}))
    if s["burst"]:
        b = s["burst"]
        rows.append((f"a scrape made as {args.burst} connections arrive at once: answered 200 "
                     f"within {BESIDE_P99_MS / 1000:.0f} s",
                     {srv: _v(ok(b[srv]["first"]) and b[srv]["first"]["s"] <= BESIDE_P99_MS / 1000,
                              _first(b[srv]["first"], one=True)) for srv in SERVERS}))
    if s["tls"]:
        rows.append(("HTTPS: a scrape beside one client that never starts its handshake, "
                     f"answered within {args.timeout:.0f} s",
                     {srv: _v(s["tls"][srv]["beside_silent"]["status"] == 200
                              and s["tls"][srv]["beside_silent"]["error"] is None,
                              _first(s["tls"][srv]["beside_silent"], one=True))
                      for srv in SERVERS}))
    return rows


def _back(x: float, limit: float) -> str:
    return f"slowest {x:.2f} s" if x != math.inf else f"not all within {limit:.0f} s"


def _first(v: dict, one: bool = False) -> str:
    firsts = [v] if one else v["first"]
    worst = max(firsts, key=lambda r: (r["status"] != 200, r["s"]))
    return f"{worst['status'] or worst['error']} in {worst['s']:.2f} s"


def markdown(head: dict, s: dict, args) -> str:
    al = s["alone"]
    L = ["# The agent's HTTP server against prometheus_client's", "",
         f"`python -m bench.http_server`; {head['machine']}; commit {head['commit']}; "
         f"{head['date']}; load {' '.join(head['loadavg_start'])} at the start, "
         f"{' '.join(head['loadavg_end'])} at the end; {head['run_s']:.0f} s.",
         f"One prometheus_client registry of {args.label_sets:,} label sets (per-cgroup I/O "
         f"counters, per-pod GPU gauges, per-device latency histograms; "
         f"{al['agent']['body_bytes'] / 1e6:.2f} MB of text from the agent, "
         f"{al['library']['body_bytes'] / 1e6:.2f} MB from prometheus_client), served by the "
         "agent's Exporter (exporter/http.py, its defaults: 64 connections, 10 s idle deadline) "
         "and by `prometheus_client.start_http_server`, each in its own process started fresh "
         f"for every measurement; {args.rounds} round(s), the two in turn, the order flipped "
         "every round and condition. Loopback only; a scrape is a new connection, "
         f"GET /metrics, the whole body read, client timeout {args.timeout:.0f} s.", "",
         "## Targets", "", f"| target | {NAMES['agent']} | {NAMES['library']} |", "|---|---|---|"]
    rows = targets(s, args)
    L += [f"| {t} | {v['agent']} | {v['library']} |" for t, v in rows]
    fails = {srv: sum("FAIL" in v[srv] for _, v in rows) for srv in SERVERS}
    L += ["", f"Targets failed: agent {fails['agent']} of {len(rows)}, prometheus_client "
          f"{fails['library']} of {len(rows)}."]
    r = s["ratios"]
    L += ["", "## Alone", "", "| | agent | prometheus_client | ÷ agent |", "|---|---:|---:|---:|",
          f"| sequential scrape p50 / p99 (ms, n={al['agent']['seq_n']}) | "
          f"{_f(al['agent']['seq_p50_ms'], '', 1)} / {_f(al['agent']['seq_p99_ms'], '', 1)} | "
          f"{_f(al['library']['seq_p50_ms'], '', 1)} / {_f(al['library']['seq_p99_ms'], '', 1)}"
          f" | {r['alone_seq_p50']}x / {r['alone_seq_p99']}x |",
          f"| {args.concurrency} at once: scrape p50 / p99 (ms) | "
          f"{_f(al['agent']['conc_p50_ms'], '', 1)} / {_f(al['agent']['conc_p99_ms'], '', 1)} | "
          f"{_f(al['library']['conc_p50_ms'], '', 1)} / "
          f"{_f(al['library']['conc_p99_ms'], '', 1)} | {r['concurrent_p50']}x |",
          f"| {args.concurrency} at once: scrapes per second | {_f(al['agent']['conc_per_s'], '', 1)}"
          f" | {_f(al['library']['conc_per_s'], '', 1)} | {r['concurrent_per_s']}x slower |",
          f"| server RSS after (MB) / threads | {al['agent']['rss_mb']:.0f} / "
          f"{al['agent']['threads']} | {al['library']['rss_mb']:.0f} / "
          f"{al['library']['threads']} | |", "",
          "Per-round ratio of the sequential medians: "
          + ", ".join(f"{x}x" for x in r["alone_seq_p50_per_round"]) + ".", "",
          "## Beside slow clients", "",
          "Kinds: " + "; ".join(f"**{k}**: {d}" for k, d in KINDS.items() if k in args.kinds)
          + ". First: the scrape made as soon as they are attached (slowest of the rounds). "
          "Then: once the server's CPU is quiet, "
          f"{args.phase_scrapes} scrapes a round. Threads and RSS: before / peak / a second "
          "after they left. Quiet after: until the server's CPU went quiet once they had "
          "attached. CPU after: the server's CPU seconds from their leaving until its threads "
          "were back (at most the limit) and a second more.", "",
          "| crowd | server | first | then p50 / p99 ms | failed | threads | RSS MB | "
          "threads back in | quiet after | CPU after |",
          "|---|---|---|---:|---:|---|---|---:|---:|---:|"]
    for c, v in s["beside"].items():
        kind, k = c.split("/")
        for srv in SERVERS:
            b = v[srv]
            L.append(f"| {k} {kind} | {srv} | {_first(b)} | {_f(b['steady_p50_ms'], '', 1)} / "
                     f"{_f(b['steady_p99_ms'], '', 1)} | {b['steady_failed']}/{b['steady_n']}"
                     + (f" ({', '.join(b['steady_errors'])})" if b["steady_errors"] else "")
                     + f" | {b['threads_before']} / {b['threads_peak']:.0f} / "
                     f"{b['threads_after']} | {b['rss_before_mb']:.0f} / {b['rss_peak_mb']:.0f}"
                     f" / {b['rss_after_mb']:.0f} | "
                     + (_f(b['threads_back_s'], ' s', 2) if b['threads_back_s'] is not None
                        else f"> {args.recover_limit:.0f} s")
                     + f" | {b['settle_s']:.1f} s | {b['cpu_after_leave_s']:.2f} s |")
    L += ["", "## Ratios in this run (prometheus_client ÷ agent)", "",
          "| crowd | then p50 | then p99 | peak threads | RSS growth |", "|---|---:|---:|---:|---:|"]
    for c in s["beside"]:
        kind, k = c.split("/")
        L.append(f"| {k} {kind} | " + " | ".join(
            f"{r[f'{c} {f}']}x" if r[f"{c} {f}"] is not None else "-"
            for f in ("steady_p50_ms", "steady_p99_ms", "threads_peak", "rss_growth_mb")) + " |")
    L += ["", "## What else separates them", "", "| | agent | prometheus_client |", "|---|---|---|"]
    ea, el = s["extras"]["agent"], s["extras"]["library"]
    if ea and el:
        L += [f"| gzip (Accept-Encoding: gzip): p50, bytes | {_f(ea['gzip_p50_ms'], ' ms', 1)}, "
              f"{ea['gzip_bytes']:,} | {_f(el['gzip_p50_ms'], ' ms', 1)}, {el['gzip_bytes']:,} |",
              f"| HEAD /metrics | {ea['head_status']}, {ea['head_bytes']} bytes | "
              f"{el['head_status']}, {el['head_bytes']} bytes |",
              f"| keep-alive (scrapes through one client connection) | "
              f"{'kept' if ea['keepalive_kept'] else 'closed each time'}, p50 "
              f"{_f(ea['keepalive_p50_ms'], ' ms', 1)} | "
              f"{'kept' if el['keepalive_kept'] else 'closed each time'}, p50 "
              f"{_f(el['keepalive_p50_ms'], ' ms', 1)} |",
              f"| Prometheus's Accept (OpenMetrics first) | {ea['openmetrics_type']} | "
              f"{el['openmetrics_type']} |",
              f"| plain body | {'chunked, streamed' if al['agent']['chunked'] else 'Content-Length'}"
              f" | {'chunked' if al['library']['chunked'] else 'Content-Length, built whole'} |"]
        if "library_app_p50_ms" in ea:
            L.append(f"| prometheus_client's own app on each server: scrape p50 | "
                     f"{_f(ea['library_app_p50_ms'], ' ms', 1)} | "
                     f"{_f(al['library']['seq_p50_ms'], ' ms', 1)} |")
    tb = {srv: al[srv]["tracebacks"] + sum(v[srv]["tracebacks"] for v in s["beside"].values())
          for srv in SERVERS}
    L.append(f"| tracebacks printed on stderr over the whole run | {tb['agent']} | "
             f"{tb['library']} |")
    if s["burst"]:
        b = s["burst"]
        L.append(f"| {args.burst} connects at once: all connected after | "
                 + " | ".join(f"{b[srv]['connected']}/{args.burst} in {b[srv]['all_s']:.2f} s"
                              for srv in SERVERS) + " |")
    if s["hold"]:
        h = s["hold"]
        L.append(f"| {h['agent']['count']} half-head clients that stay: threads before / with "
                 f"them / {h['agent']['seconds']:.0f} s later; dropped by the server | "
                 + " | ".join(f"{h[srv]['threads_before']} / {h[srv]['threads_held']} / "
                              f"{h[srv]['threads_after_hold']}; {h[srv]['dropped_by_server']}"
                              for srv in SERVERS) + " |")
    for srv_key, label in (("alone", "HTTPS alone"), ("beside_silent",
                                                      "HTTPS beside one silent client"),
                           ("after", "HTTPS after it left")):
        if s["tls"]:
            L.append(f"| {label} | {_first(s['tls']['agent'][srv_key], one=True)} | "
                     f"{_first(s['tls']['library'][srv_key], one=True)} |")
    L += ["", "Beside non-readers the agent's scrapes can be faster than alone: once "
          "MAX_BODIES bodies are alive, scrape.py serves a new scrape the newest body still "
          "held by the stalled readers instead of rendering another (its data then as old as "
          "that body, at most a write deadline). prometheus_client's server (http.server) "
          "takes the end of a connection for the end of a request head, so a client that "
          "leaves in the middle of one still has /metrics rendered for it: the CPU after column.",
          "", "Whether a non-reader keeps a thread of a server that closes after each answer "
          "depends on whether the kernel takes the whole answer into the socket's send buffer "
          f"(up to {s['tcp_wmem_max'] / 2**20:.0f} MiB here, net.ipv4.tcp_wmem, within the "
          "machine's tcp_mem): the threads columns show what it did in this run. Each such "
          "thread also holds its own copy of the rendered body until its write ends.",
          "", "![http server](http-server.png)", ""]
    return "\n".join(L)


def write(head: dict, data: dict, args) -> tuple[Path, Path, Path | None]:
    args.out.mkdir(parents=True, exist_ok=True)
    s = summarize(data)
    md, js = args.out / "http-server.md", args.out / "http-server.json"
    png = plot(s, args.out / "http-server.png")
    text = markdown(head, s, args)
    if png is None:
        text = text.replace("![http server](http-server.png)\n", "")
    md.write_text(text)
    opts = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()}
    js.write_text(json.dumps({"stamp": head, "options": opts, "summary": s,
                              "targets": [{"target": t, **v} for t, v in targets(s, args)],
                              "raw": data}, indent=1, default=str))
    return md, js, png
