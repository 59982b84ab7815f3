"""Analysis, Markdown, JSON and plot for bench/accuracy.

    .venv/bin/python -m bench.accuracy.report [DIR]    # re-render DIR/accuracy.json
"""
from __future__ import annotations

import json
import math
import os
import statistics
import sys

from bench import common

SKIP_S = 1.0        # left out at each end of fio's logged seconds: start-up burst, ramp down
TOLERANCE = 0.02
FILL = "tracehound_io_pagecache_fill_bytes_total"
MiB = 1 << 20


# ---------------------------------------------------------------- analysis

def fio_windows(rec: dict) -> list[tuple[float, float, float]]:
    """fio's bandwidth log as (start, end, bytes/s) in wall-clock seconds: an
    entry at time T (ms since the Unix epoch) is the rate since the entry
    before it (fio's samples slip a millisecond or so a second), or over
    (T - 1 s, T] for the first one and after a gap."""
    d = 1 if rec["rw"] == "write" else 0
    out, prev = [], None
    for t, kib, dd in rec["fio_log"]:
        if dd != d:
            continue
        end = t / 1000
        start = prev if prev is not None and 0.5 < end - prev < 1.5 else end - 1.0
        out.append((start, end, kib * 1024.0))
        prev = end
    return out


def fio_rate(windows, a: float, b: float) -> float:
    """fio's rate over [a, b]: its per-second rates weighted by overlap (0
    where it logged nothing)."""
    got = sum(max(0.0, min(b, we) - max(a, ws)) * r for ws, we, r in windows)
    return got / (b - a)


def selection(rec: dict, mount: str):
    """Which series count for this phase: the read and write counters on the
    scratch mount; the page-cache fill summed over the cgroup's mountpoints
    (the page cache belongs to a file system, not to one mount of it)."""
    cg = rec["cgroup"]

    def match(key: str) -> bool:
        m, c, mnt = key.split("|")
        return m == rec["metric"] and c == cg and (rec["metric"] == FILL or mnt == mount)
    return match


def agent_series(res: dict, rec: dict, match) -> list[tuple[float, float]]:
    lo, hi = rec["wall_start"] - 2.0, rec["wall_end"] + res["settings"]["settle_s"]
    return [(s["t"], sum(v for k, v in s["values"].items() if match(k)))
            for s in res["agent_samples"] if lo <= s["t"] <= hi]


def prom_series(res: dict, rec: dict, match) -> list[tuple[float, float]]:
    lo, hi = rec["wall_start"] - 2.0, rec["wall_end"] + res["settings"]["settle_s"]
    by_t: dict[float, float] = {}
    for key, vals in (res.get("prometheus_samples") or {}).items():
        if match(key):
            for t, v in vals:
                if lo <= t <= hi:
                    by_t[t] = by_t.get(t, 0.0) + v
    return sorted(by_t.items())


def intervals(series, windows, span: int, lo: float, hi: float) -> list[dict]:
    rows = []
    for (a, va), (b, vb) in zip(series, series[span:]):
        if a < lo or b > hi or b <= a:
            continue
        rate, ref = (vb - va) / (b - a), fio_rate(windows, a, b)
        rows.append({"from": a, "to": b, "rate": rate, "fio": ref,
                     "err": (rate - ref) / ref if ref > 0 else None})
    return rows


def stats(rows: list[dict]) -> dict:
    errs = [r["err"] for r in rows if r["err"] is not None]
    if not errs:
        return {"n": 0}
    ab = [abs(e) for e in errs]
    return {"n": len(errs), "median_abs": statistics.median(ab), "max_abs": max(ab),
            "median": statistics.median(errs), "within": max(ab) <= TOLERANCE}


def analyze_phase(res: dict, rec: dict) -> dict:
    mount = res["scratch"]["dir"]
    match = selection(rec, mount)
    windows = fio_windows(rec)
    out = {"name": rec["name"], "metric": rec["metric"], "fio_bytes": rec["fio_io_bytes"],
           "runtime_s": rec["runtime_s"], "windows": windows}
    final = {k: v for k, v in rec["final"].items()
             if k.split("|")[0] == rec["metric"]
             and (rec["metric"] == FILL or k.split("|")[1] == mount)}
    out["counter_bytes"] = int(sum(final.values()))
    out["counter_by_mount"] = {k.split("|")[1]: v for k, v in rec["final"].items()
                               if k.split("|")[0] == rec["metric"]}
    out["other_counters"] = {k: v for k, v in rec["final"].items()
                             if k.split("|")[0] != rec["metric"]}
    out["diff_bytes"] = out["counter_bytes"] - rec["fio_io_bytes"]
    out["diff_pct"] = 100.0 * out["diff_bytes"] / rec["fio_io_bytes"] if rec["fio_io_bytes"] \
        else None
    out["step_bytes"] = out["step_pct_of_1s"] = None
    if not windows:
        return out
    w0, wend = windows[0][0], windows[-1][1]
    out["w0"], out["wend"] = w0, wend
    lo, hi = w0 + SKIP_S, wend - SKIP_S
    for src, series in (("agent", agent_series(res, rec, match)),
                        ("prometheus", prom_series(res, rec, match))):
        out[f"{src}_series"] = series
        inside = [t for t, _ in series if t >= w0]
        # where in fio's seconds this reader's readings fall
        out[f"{src}_offset_s"] = (inside[0] - w0) % 1.0 if inside else None
        if src == "prometheus" and not res["settings"]["prometheus"]:
            continue
        for span in (1, 2):
            rows = intervals(series, windows, span, lo, hi)
            out[f"{src}_{span}s"] = rows
            out[f"{src}_{span}s_stats"] = stats(rows)
        out[f"{src}_all"] = intervals(series, windows, 1, series[0][0] if series else 0,
                                      series[-1][0] if series else 0)
    out["step_bytes"] = step(rec, out)
    if out["step_bytes"]:
        out["step_pct_of_1s"] = 100.0 * out["step_bytes"] / (rec["rate_mib_s"] * MiB)
    return out


def step(rec: dict, p: dict) -> int | None:
    """How far the counter moves at once: fio's block for the read and write
    counters (one request, counted when it completes); for the page-cache
    fill with a read-ahead the phase set, the larger of fio's block (the
    rate limit pauses between requests) and one read-ahead window; else the
    largest size every difference between the values either reader saw
    inside the compared span is a multiple of (a read-ahead chunk; the last
    one, cut short where fio stopped, is outside). Readings that fall
    steadily half a second apart make that last one an overestimate."""
    num, unit = rec["bs"][:-1], rec["bs"][-1].lower()
    block = int(num) * {"k": 1024, "m": MiB}[unit] if unit in "km" else int(rec["bs"])
    if rec["metric"] != FILL:
        return block
    if rec.get("read_ahead_kb"):
        return max(block, rec["read_ahead_kb"] * 1024)
    if "w0" not in p:
        return None
    lo, hi = p["w0"] + SKIP_S, p["wend"] - SKIP_S
    vals = sorted({round(v) for t, v in p.get("agent_series", []) + p.get("prometheus_series", [])
                   if lo <= t <= hi})
    return math.gcd(*[b - a for a, b in zip(vals, vals[1:])]) if len(vals) > 1 else None


def verdicts(res: dict, phases: list[dict]) -> list[tuple[str, bool | None, str]]:
    long = [p for p in phases if p["runtime_s"] > 3]
    out = []
    rw = [p for p in phases if p["metric"] != FILL]
    if rw:
        bad = [f"{p['name']} {p['diff_bytes']:+d} B" for p in rw if p["diff_bytes"] != 0]
        out.append(("read/write counter totals equal fio's io_bytes", not bad,
                    ", ".join(bad) or "all exact"))
    for p in phases:
        if p["metric"] == FILL:
            out.append((f"{p['name']}: page-cache fill minus fio's bytes read", None,
                        f"{p['diff_bytes'] / MiB:+.1f} MiB"
                        + (f" ({p['diff_pct']:+.1f} %)" if p["diff_pct"] is not None else "")))
    sources = ["agent"] + (["prometheus"] if res["settings"]["prometheus"] else [])
    for src in sources:
        for span, key in ((1, "median_abs"), (1, "max_abs"), (2, "max_abs")):
            got = [(p["name"], p.get(f"{src}_{span}s_stats", {"n": 0})) for p in long]
            missing = [n for n, s in got if not s["n"]]
            bad = [f"{n} {100 * s[key]:.1f} %" for n, s in got if s["n"] and s[key] > TOLERANCE]
            what = "median" if key == "median_abs" else "every"
            ok = None if missing and not bad else not bad
            note = ", ".join(bad) if bad else "all within"
            if missing:
                note += f"; no interval in {', '.join(missing)}"
            out.append((f"{src}: {what} {span}-s interval within {100 * TOLERANCE:g} % of fio, "
                        "every phase > 3 s", ok, note))
    return out


# ---------------------------------------------------------------- Markdown

def pct(x) -> str:
    return "–" if x is None else f"{100 * x:.1f} %"


def st(s: dict, key: str) -> str:
    return pct(s.get(key)) if s and s.get("n") else "–"


def size(n: int) -> str:
    for unit, k in (("MiB", MiB), ("KiB", 1024)):
        if n % k == 0:
            return f"{n // k} {unit}"
    return f"{n} B"


def mib(x: float) -> str:
    return f"{x / MiB:.2f}"


def markdown(res: dict, phases: list[dict], verdict: list) -> str:
    h, s = res["host"], res["settings"]
    prom = s["prometheus"]
    modes = ", ".join(f"{k} {v}" for k, v in res.get("hook_modes", {}).items()
                      if k.startswith("io.")) or "not reported"
    lines = [
        "# Accuracy of the I/O byte counters over time, against fio", "",
        f"Generated by `bench/accuracy` on {h['date']}"
        + (" (`--quick`: a smoke test, not a measurement)" if s["quick"] else "") + ".", "",
        "| host | |", "|---|---|",
        f"| kernel | {h['kernel']} |", f"| CPU | {h['cpus']} × {h['cpu_model']} |",
        f"| agent hook modes (its start-up lines; `--hook-mode {s['hook_mode']}`) | {modes} |",
        f"| fio | {h.get('fio')} |", f"| Prometheus | {h.get('prometheus') if prom else 'not run'} |",
        f"| scratch | {h.get('scratch_fs')}, read_ahead_kb {h.get('read_ahead_kb', '?')} |",
        f"| load average at start / end | {h.get('loadavg_start', '?')} / "
        f"{h.get('loadavg_end', '?')} |", "",
        "## What ran", "",
        f"One agent from this checkout (`PYTHONPATH=src tracehound run --hook-mode {s['hook_mode']}`)"
        + (", a Prometheus scraping it every 1 s" if prom else "")
        + f", and this script reading its `/metrics` every {s['sample_s']:g} s (\"agent\" in "
        "the tables). Each phase is one "
        f"fio job of {s['phase_seconds']:g} s (`--time_based`, `--rate` per phase, "
        "`--write_bw_log --log_avg_msec=1000 --log_unix_epoch=1`) in a fresh cgroup "
        f"`{res['scratch']['cgroup_parent']}/<phase>` on a directory of the root ext4 under "
        "/var/tmp, bind-mounted onto itself so the phase's data has a mountpoint of its own "
        "(fio's dynamic loader reads library files on `/` after the shell joined the cgroup: the "
        "`read_bytes_total` on / under each phase's other counters). The read and write counters are taken on that mountpoint; the page-cache fill "
        "is summed over the cgroup's mountpoints. Read phases read the file the write phase "
        "before them left; `mmap-read` reads a fresh, fsynced file whose cache fio drops "
        "first (`invalidate=1`; resident bytes by `fincore` before and after are in its "
        "section), with the scratch device's read-ahead set to the kernel's default of 128 KiB "
        "for the phase (its section says; the old value is put back after): the fill moves one "
        "read-ahead window at a time, and 16 MiB windows, what 8 MiB of read-ahead gives an "
        "mmap reader, are 40 % of a second's bytes at 40 MiB/s. With `--time_based`, fio "
        "starts over at the end of a file.",
        "",
        "Per-interval rates: the counter's increase between two consecutive readings over their "
        "time difference (this script: when it sent the request, as the agent reads the I/O maps "
        "first in a collection; Prometheus: its sample timestamps), against fio's logged rate "
        "over the same wall-clock interval (each log entry at T covers the time since the entry "
        "before, about 1 s; an interval spanning two entries gets their overlap-weighted mean). "
        f"Only intervals inside fio's logged seconds, less {SKIP_S:g} s at "
        "each end, count. The 2-s column uses every pair of consecutive intervals. Errors are "
        "(counter − fio) / fio.", "",
        "## Summary", "",
        "| phase | fio | counter | fio bytes | counter bytes | diff | counter step (share of 1 s) "
        "| agent 1 s median / max (n) | agent 2 s max"
        + (" | Prometheus 1 s median / max (n) | Prometheus 2 s max |" if prom else " |"),
        "|---|---|---|---:|---:|---:|---:|---|---:" + ("|---|---:|" if prom else "|"),
    ]
    for p, rec in zip(phases, res["phases"]):
        a1, a2 = p.get("agent_1s_stats", {}), p.get("agent_2s_stats", {})
        quantum = "–" if p["step_bytes"] is None else \
            f"{size(p['step_bytes'])} ({p['step_pct_of_1s']:.2f} %)"
        row = (f"| {p['name']} | {rec['engine']} {rec['rw']} {rec['bs']} @ {rec['rate_mib_s']} MiB/s "
               f"| `{p['metric'].replace('tracehound_io_', '')}` | {p['fio_bytes']:,} "
               f"| {p['counter_bytes']:,} | {p['diff_bytes']:+,} "
               f"| {quantum} "
               f"| {st(a1, 'median_abs')} / {st(a1, 'max_abs')} ({a1.get('n', 0)}) | {st(a2, 'max_abs')}")
        if prom:
            p1, p2 = p.get("prometheus_1s_stats", {}), p.get("prometheus_2s_stats", {})
            row += (f" | {st(p1, 'median_abs')} / {st(p1, 'max_abs')} ({p1.get('n', 0)}) "
                    f"| {st(p2, 'max_abs')} |")
        else:
            row += " |"
        lines.append(row)
    lines += ["", "Counter step: how far the counter moves at once, and its share of one "
              "second's bytes at the phase's rate. For the read and write counters it is fio's "
              "block (one request, counted when it completes); for the page-cache fill, fio's block "
              "or the read-ahead window the phase set, the larger (without one: the largest size "
              "every difference between the values either reader saw in the compared span is a "
              "multiple of, the read-ahead chunk). A reading that lands just before instead of just after "
              "a step moves a 1-s rate by that share; fio's own per-second log is quantised by "
              "its requests the same way.", "", "## Verdicts", ""]
    for title, ok, note in verdict:
        mark = "n/a" if ok is None else ("**yes**" if ok else "**no**")
        lines.append(f"- {title}: {mark} ({note})")
    lines += ["", "## Phases", ""]
    for p, rec in zip(phases, res["phases"]):
        lines += [f"### {p['name']}", "", f"`{rec['fio_cmd']}`", "",
                  f"fio: {p['fio_bytes']:,} B in {rec['fio_runtime_ms']} ms (error "
                  f"{rec['fio_error']}); counter `{p['metric']}`: {p['counter_bytes']:,} B "
                  f"(by mountpoint: {json.dumps(p['counter_by_mount'])})."]
        offs = [f"{who} {p[key]:.2f} s" for who, key in (("this script", "agent_offset_s"),
                                                           ("Prometheus", "prometheus_offset_s"))
                if p.get(key) is not None]
        if offs:
            lines.append("Readings fall this far into each of fio's seconds: "
                         + ", ".join(offs) + ".")
        if rec.get("read_ahead_kb") is not None:
            lines.append(f"The scratch device's read-ahead during the phase: "
                         f"{rec['read_ahead_kb']} KiB.")
        if "resident_before" in rec:
            lines.append(f"Resident in the page cache before / after: "
                         f"{rec['resident_before']} / {rec['resident_after']} B of "
                         f"{rec['size']:,}.")
        others = {k: v for k, v in p["other_counters"].items() if v}
        if others:
            lines.append("Other counters of this cgroup: " + ", ".join(
                f"`{k.split('|')[0].replace('tracehound_io_', '')}` on {k.split('|')[1]} "
                f"{int(v):,} B" for k, v in sorted(others.items())) + ".")
        rows = [("agent", r) for r in p.get("agent_1s", [])]
        rows += [("Prometheus", r) for r in p.get("prometheus_1s", [])]
        if not rows:
            lines += ["", "No interval inside the compared span.", ""]
            continue
        lines += ["", "| reader | from s | to s | counter MiB/s | fio MiB/s | error |",
                  "|---|---:|---:|---:|---:|---:|"]
        for src, r in sorted(rows, key=lambda x: (x[1]["from"], x[0])):
            lines.append(f"| {src} | {r['from'] - p['w0']:.2f} | {r['to'] - p['w0']:.2f} "
                         f"| {mib(r['rate'])} | {mib(r['fio'])} | {pct(r['err'])} |")
        lines.append("")
    lines += ["## Notes", "",
              "- Times in the phase tables are seconds since fio's first logged second began.",
              f"- This script's scrape took median {1000 * statistics.median(res['scrape_seconds']):.0f} ms, "
              f"max {1000 * max(res['scrape_seconds']):.0f} ms, request to last byte; "
              f"{len(res.get('scrape_errors', []))} scrapes failed. It reads half a second away "
              "from Prometheus"
              + (f" (Prometheus scrapes at {res['prometheus_phase']:.3f} s past each second)"
                 if res.get("prometheus_phase") is not None else "")
              + ": the agent hands a scrape that arrives during another's collection that "
              "collection's values, which would make the later one's timestamp too late."
              if res.get("scrape_seconds") else "- No scrape timings.",
              "- Prometheus stamps a sample with the start of its scrape, before the agent reads "
              "its maps: a constant offset cancels in a rate, only its jitter remains.",
              "- A counter that moves in steps that are a large share of a second's bytes (the "
              "counter step column) swings from one second to the next by about that share even "
              "when every byte is counted; over 2 s the swing halves. Its total still has to "
              "match.",
              "", "## How to run", "", "```sh",
              "sudo .venv/bin/python -m bench.accuracy                    # 7 phases of 10 s, about 2 minutes",
              "sudo .venv/bin/python -m bench.accuracy --quick            # 6-s phases: smoke test",
              "#   --phase-seconds S  --hook-mode auto|fentry|kprobe|tracepoint  --no-prometheus",
              "#   --only psync-write,psync-read  --out DIR (default bench/report)",
              ".venv/bin/python -m bench.accuracy.report [DIR]            # re-render from accuracy.json",
              "```", ""]
    return "\n".join(lines)


# ---------------------------------------------------------------- plot

def write_reports(out: str, res: dict) -> list[str]:
    phases = [analyze_phase(res, rec) for rec in res.get("phases", [])]
    verdict = verdicts(res, phases)
    res["analysis"] = {"phases": phases, "verdicts": verdict}
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "accuracy.json"), "w") as f:
        json.dump(res, f, indent=1)
    with open(os.path.join(out, "accuracy.md"), "w") as f:
        f.write(markdown(res, phases, verdict))
    summary = []
    try:
        from bench.accuracy.plot import plot     # matplotlib: only here
        plot(os.path.join(out, "accuracy.png"), res, phases)
    except ImportError as e:
        summary.append(f"accuracy.png not written: {e} (.venv/bin/pip install matplotlib)")
    for title, ok, note in verdict:
        summary.append(f"{common.verdict(ok)} {title}: {note}")
    return summary


if __name__ == "__main__":
    where = sys.argv[1] if len(sys.argv) > 1 else str(common.REPORT)
    with open(os.path.join(where, "accuracy.json")) as f:
        data = json.load(f)
    data.pop("analysis", None)
    for line in write_reports(where, data):
        print(line)
