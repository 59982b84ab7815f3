"""Markdown, JSON and PNG reports for bench/scrape."""
from __future__ import annotations

import json
import statistics
from pathlib import Path

CG_PARENT = "tracehound-bench-scrape"
# targets of the exporter spec, for this 2-core VM
SCRAPE_8K_S, TEXT_8K_B, PROTO_8K_B = 0.25, 10e6, 2e6
SCRAPE_80K_S, PEAK_80K_MIB = 2.0, 150
RSS_1K_MIB, IDLE_PCT, HELD_SCRAPE_S, SIGTERM_S = 60, 2.0, 1.0, 2.0
# a busy node with no flags: 3,000 cgroups doing I/O on 2 mounts
BUSY_SERIES, BUSY_SCRAPE_S, BUSY_GZIP_B = 6000, 0.25, 1e6


def case(r: dict) -> str:
    kind = "real I/O" if r["kind"] == "io" else "fill"
    return (f"{r['size']} {kind}" + (f", --max-series {r['max_series']}" if r["max_series"] else "")
            + (f", --latency-histograms {h}" if (h := r.get("latency_histograms")) else ""))


def err(r: dict) -> str:
    """An error as one table cell: what failed, and the last thing the process said."""
    lines = [l for l in str(r.get("error", "no scrape")).splitlines() if l.strip()]
    text = lines[0] if len(lines) < 2 else f"{lines[0]} … {lines[-1]}"
    return text[:240].replace("|", "\\|")


def med(r: dict) -> float | None:
    return statistics.median(r["walls"]) if r.get("walls") else None


def done(r: dict) -> bool:
    return med(r) is not None and "samples" in r


def runs(res: dict, impl: str) -> list[dict]:
    return [r for r in res["runs"] if r["impl"] == impl]


def mib(kb: int | None) -> str:
    return "–" if kb is None else f"{kb / 1024:.0f}"


def mb(b: float | None) -> str:
    return "–" if b is None else f"{b / 1e6:.2f}" if b < 1e8 else f"{b / 1e6:.0f}"


def proto(r: dict) -> str:
    p = r.get("protobuf")
    if not p:
        return "–"
    if not p["offered"]:
        return f"not offered ({p['ctype'].split(';')[0]})"
    gz = p.get("gzip_bytes")
    return f"{mb(p['bytes'])} MB" + (f" ({mb(gz)} gzip)" if gz else "")


def at_size(res: dict, series: int, finished: bool = True) -> dict | None:
    """The new revision's case with this many workload series, all of them
    exported (fill cases with the raised --max-series)."""
    return next((r for r in runs(res, "new") if r["cgroups"] * r["mounts"] == series
                 and (r["kind"] == "io" or r["max_series"]) and not r.get("latency_histograms")
                 and (done(r) or not finished)), None)


def verdicts(res: dict) -> list[tuple[str, str, bool | None]]:
    new = [r for r in runs(res, "new") if done(r)]
    io = [r for r in new if r["kind"] == "io"]
    out: list[tuple[str, str, bool | None]] = []
    busy = at_size(res, BUSY_SERIES)
    if busy:
        g = busy.get("gzip") or {}
        out += [(f"{busy['size']} with the defaults (a busy node): scrape <= "
                 f"{BUSY_SCRAPE_S * 1e3:g} ms", f"{med(busy) * 1e3:,.0f} ms (median, gzip as "
                 "Prometheus scrapes)", med(busy) <= BUSY_SCRAPE_S),
                (f"{busy['size']} with the defaults: on the wire (gzip) <= {BUSY_GZIP_B / 1e6:g} MB",
                 gzip(busy) + " MB", g.get("encoding") == "gzip" and g["bytes"] <= BUSY_GZIP_B)]
    r8 = at_size(res, 8000)
    if r8:
        pb = r8.get("protobuf", {}).get("wall_s")
        out += [(f"{r8['size']} (8,000 series): scrape <= {SCRAPE_8K_S * 1e3:g} ms",
                 f"{med(r8) * 1e3:,.0f} ms (median, gzip as Prometheus scrapes)" + (
                     f"; one protobuf scrape {pb * 1e3:,.0f} ms" if pb else ""), med(r8) <= SCRAPE_8K_S),
                (f"{r8['size']}: plain text <= {TEXT_8K_B / 1e6:g} MB",
                 f"{mb(r8['text_bytes'][-1])} MB", r8["text_bytes"][-1] <= TEXT_8K_B)]
        p = r8.get("protobuf", {})
        out.append((f"{r8['size']}: protobuf with native histograms <= {PROTO_8K_B / 1e6:g} MB",
                    proto(r8), bool(p.get("offered")) and p["bytes"] <= PROTO_8K_B))
    else:
        failed = at_size(res, 8000, finished=False)
        out.append(("8,000 series (2000x4) targets", f"failed: {err(failed)}" if failed else
                    "not measured", False if failed else None))
    for rh in (r for r in new if r.get("latency_histograms") and r["cgroups"] * r["mounts"] == 8000):
        h, p = rh["latency_histograms"], rh.get("protobuf", {})
        out += [(f"{rh['size']}, --latency-histograms {h}: scrape <= {SCRAPE_8K_S * 1e3:g} ms",
                 f"{med(rh) * 1e3:,.0f} ms (median)", med(rh) <= SCRAPE_8K_S),
                (f"{rh['size']}, --latency-histograms {h}: plain text <= {TEXT_8K_B / 1e6:g} MB",
                 f"{mb(rh['text_bytes'][-1])} MB", rh["text_bytes"][-1] <= TEXT_8K_B),
                (f"{rh['size']}, --latency-histograms {h}: protobuf <= {PROTO_8K_B / 1e6:g} MB",
                 proto(rh), bool(p.get("offered")) and p["bytes"] <= PROTO_8K_B)]
    for r in (r for r in (r8, *(x for x in new if x.get("latency_histograms"))) if r):
        p = r.get("protobuf", {})
        if p.get("gzip_bytes") and r["cgroups"] * r["mounts"] == 8000:
            h = r.get("latency_histograms")
            out.append((f"{r['size']}" + (f", --latency-histograms {h}" if h else "")
                        + f": protobuf on the wire (gzip, as Prometheus asks) <= "
                        f"{PROTO_8K_B / 1e6:g} MB", f"{mb(p['gzip_bytes'])} MB",
                        p["gzip_bytes"] <= PROTO_8K_B))
    capped = next((r for r in new if r["kind"] == "fill" and not r["max_series"]), None)
    if capped:
        out += [(f"{capped['size']} with the default --max-series ({capped['io_series']:,} series "
                 f"exported, the rest in __overflow__): scrape <= {SCRAPE_80K_S:g} s",
                 f"{med(capped):.2f} s (median)", med(capped) <= SCRAPE_80K_S),
                (f"{capped['size']} with the default --max-series: memory <= {PEAK_80K_MIB} MiB "
                 "(judged on the peak, VmHWM)",
                 f"peak {mib(capped['VmHWM'])} MiB, RSS after the scrapes {mib(capped['VmRSS'])} MiB",
                 capped["VmHWM"] / 1024 <= PEAK_80K_MIB)]
    r80 = at_size(res, 80000)
    if r80:
        out += [(f"10000x8 (80,000 series, all exported): scrape <= {SCRAPE_80K_S:g} s",
                 f"{med(r80):.2f} s (median)", med(r80) <= SCRAPE_80K_S),
                (f"10000x8: memory <= {PEAK_80K_MIB} MiB (judged on the peak, VmHWM)",
                 f"peak {mib(r80['VmHWM'])} MiB, RSS after the scrapes {mib(r80['VmRSS'])} MiB",
                 r80["VmHWM"] / 1024 <= PEAK_80K_MIB)]
    else:
        failed = at_size(res, 80000, finished=False)
        out.append(("10000x8 (80,000 series, all exported) targets", f"failed: {err(failed)}"
                    if failed else "not measured", False if failed else None))
    if io:
        r1 = min(io, key=lambda r: abs(r["cgroups"] * r["mounts"] - 1000))
        out.append((f"memory <= {RSS_1K_MIB} MiB at ~1,000 series (judged on the peak; nearest "
                    f"size: {r1['size']}, {r1['cgroups'] * r1['mounts']:,} series)",
                    f"peak {mib(r1['VmHWM'])} MiB, RSS after the scrapes {mib(r1['VmRSS'])} MiB",
                    r1["VmHWM"] / 1024 <= RSS_1K_MIB))
    idle = res["extras"].get("idle")
    out.append((f"idle CPU <= {IDLE_PCT:g} % of one core, a scrape every 15 s, 2,000 series",
                f"{idle['cpu_pct']:.2f} % ({idle['size']}, {idle['minutes']:g} min, a scrape every "
                f"{idle['interval_s']:g} s)" if idle else "not measured (--idle-minutes 0)",
                idle["cpu_pct"] <= IDLE_PCT if idle else None))
    held = next((r["held"] for r in new if r.get("held")), None)
    if not held:
        out.append((f"{HELD_SCRAPE_S:g} s scrape with idle connections held, SIGTERM exit "
                    f"<= {SIGTERM_S:g} s", "not measured (the first real-I/O case failed)", None))
    else:
        out += [(f"scrape with {held['connections']} idle connections held <= {HELD_SCRAPE_S:g} s",
                 f"{held['scrape_s']:.3f} s", held["scrape_s"] <= HELD_SCRAPE_S),
                (f"SIGTERM with the connections held: exit <= {SIGTERM_S:g} s",
                 "did not exit in 30 s" if held["exit_s"] is None else
                 f"{held['exit_s']:.2f} s (exit code {held['exit_code']}, "
                 f"{held['open_at_sigterm']} connections still open)",
                 held["exit_s"] is not None and held["exit_s"] <= SIGTERM_S)]
    return out


def gzip(r: dict) -> str:
    g = r.get("gzip")
    return "–" if not g else mb(g["bytes"]) if g["encoding"] == "gzip" else "not gzipped"


def size_table(rs: list[dict]) -> list[str]:
    L = ["| case | io series exported | series tracked | `tracehound_io_*` samples | all samples | "
         "scrape median (min–max) s | gzip, protobuf scrape s | plain MB | gzip MB | protobuf | "
         "CPU s / scrape | RSS MiB | peak MiB |",
         "|---|---:|---:|---:|---:|---|---|---:|---:|---|---:|---:|---:|"]
    for r in rs:
        if not done(r):
            L.append(f"| {case(r)} | | | | | **{err(r)}** | | | | | | "
                     f"{mib(r.get('VmRSS'))} | {mib(r.get('VmHWM'))} |")
            continue
        once = ", ".join(f"{r[k]['wall_s']:.3f}" if k in r else "–" for k in ("gzip", "protobuf"))
        L.append(f"| {case(r)} | {r['io_series']:,} | {r['series_tracked'] or 0:,.0f} | "
                 f"{r['io_samples']:,} | {r['samples']:,} | "
                 f"{med(r):.3f} ({min(r['walls']):.3f}–{max(r['walls']):.3f}) | {once} | "
                 f"{mb(r['text_bytes'][-1])} | {gzip(r)} | {proto(r)} | "
                 f"{r['cpu_per_scrape_s']:.3f} | {mib(r['VmRSS'])} | {mib(r['VmHWM'])} |")
    return L


def ratio_table(res: dict) -> list[str]:
    old = {(r["kind"], r["size"], r["max_series"]): r for r in runs(res, "baseline") if done(r)}
    L = ["| case | scrape time | plain bytes | gzip bytes | CPU / scrape | RSS | peak RSS |",
         "|---|---:|---:|---:|---:|---:|---:|"]
    for r in runs(res, "new"):
        o = old.get((r["kind"], r["size"], r["max_series"]))
        if not o or not done(r):
            continue

        def q(a, b):
            return f"{a / b:.2f}" if a is not None and b else "–"
        L.append(f"| {case(r)} | {q(med(r), med(o))} | {q(r['text_bytes'][-1], o['text_bytes'][-1])} | "
                 f"{q(r.get('gzip', {}).get('bytes'), o.get('gzip', {}).get('bytes'))} | "
                 f"{q(r['cpu_per_scrape_s'], o['cpu_per_scrape_s'])} | {q(r['VmRSS'], o['VmRSS'])} | "
                 f"{q(r['VmHWM'], o['VmHWM'])} |")
    return L if len(L) > 2 else ["No case ran for both revisions."]


def per_sample(res: dict) -> list[str]:
    L = ["| exporter, case | samples | scrape median s | samples / s | bytes / sample (plain) | "
         "bytes / sample (gzip) | protobuf |", "|---|---:|---:|---:|---:|---:|---|"]
    ne = dict(res["peer"], kind="peer")
    for r in [ne] + [r for r in runs(res, "new") if done(r)]:
        if not done(r):
            L.append(f"| node_exporter | **{err(r)}** | | | | | |")
            continue
        name = f"node_exporter ({r['version']})" if r["kind"] == "peer" else f"tracehound, {case(r)}"
        gz = f"{r['gzip']['bytes'] / r['samples']:.1f}" if r.get("gzip") else "–"
        L.append(f"| {name} | {r['samples']:,} | {med(r):.3f} | {r['samples'] / med(r):,.0f} | "
                 f"{r['text_bytes'][-1] / r['samples']:.0f} | {gz} | {proto(r)} |")
    return L


def workload_table(res: dict) -> list[str]:
    L = ["| revision | case | workload | workload series seen / made | map entries | folded into "
         "`__overflow__` | io collector s | warm-up s | agent command |",
         "|---|---|---|---:|---:|---:|---:|---:|---|"]
    for r in res["runs"]:
        w = r.get("workload", {})
        how = (f"real I/O, {w['seconds']:.1f} s" if w.get("how") == "real I/O" else
               f"{w['entries']:,} entries ({w['update']} update, {w['seconds']:.2f} s)" if w else "–")
        seen = f"{r['bench_series']:,} / {r['cgroups'] * r['mounts']:,}" if "bench_series" in r else "–"

        def v(k, f="{:,.0f}"):
            return "–" if r.get(k) is None else f.format(r[k])
        L.append(f"| {r['impl']} | {case(r)} | {how} | {seen} | {v('map_entries')} | "
                 f"{v('overflow_total')} | {v('collector_s', '{:.3f}')} | {v('warmup_s', '{:.3f}')} | "
                 f"`{r['command']}` |")
    return L


def floors(res: dict) -> list[str]:
    """Why the size targets at 8,000 series are out of reach, from this
    run's own figures: what one label set costs once the renderer only
    formats numbers."""
    r8 = at_size(res, 8000)
    mount = next((r for r in runs(res, "new") if done(r) and r.get("latency_histograms")
                  and r["cgroups"] * r["mounts"] == 8000), None)
    if not r8:
        return []
    n = r8["io_series"]
    per_text = r8["text_bytes"][-1] / n
    per_sample = r8["text_bytes"][-1] / r8["samples"]
    p = r8.get("protobuf", {})
    L = ["## Floors", "",
         f"- **Plain text.** A label set is {r8['samples'] / n:.0f} samples (with "
         f"`{r8['command']}`), fixed by the metric names and labels users query. Here that is "
         f"{per_text / 1e3:,.1f} kB "
         f"per label set ({per_sample:.0f} bytes per sample: the name, the label block, the "
         f"value), so {n:,} label sets are {mb(r8['text_bytes'][-1])} MB whatever writes them; "
         f"{TEXT_8K_B / 1e6:g} MB would allow {TEXT_8K_B / n:,.0f} bytes, about "
         f"{TEXT_8K_B / n / per_sample:.0f} samples, per label set. On the "
         f"wire Prometheus asks for gzip: {gzip(r8)} MB."]
    if mount:
        L.append(f"- **`--latency-histograms mount`** keeps the 20 counters per label set and "
                 f"one histogram per mount: {mb(mount['text_bytes'][-1])} MB, "
                 f"{med(mount) * 1e3:,.0f} ms. The rest of the gap is the counters themselves; "
                 "leaving out the zero ones would break `increase()` on their first non-zero "
                 "value (Prometheus cannot know they were 0), which the error counters' alerts "
                 "rely on.")
    if p.get("offered"):
        L.append(f"- **Protobuf.** Native histograms cost a few bytes per non-empty bucket, but "
                 f"each metric repeats its label pairs, and 20 of the 23 per label set are "
                 f"counters: {mb(p['bytes'])} MB"
                 + (f", {mb(p['gzip_bytes'])} MB gzipped on the wire" if p.get("gzip_bytes")
                    else "") + ".")
    L.append(f"- **Time.** {r8['samples']:,} samples in {med(r8) * 1e3:,.0f} ms with gzip "
             f"({med(r8) / r8['samples'] * 1e9:,.0f} ns per sample, collection included) on this "
             "machine; the pure-Python floor is one %-format per histogram row and one per "
             "counter sample.")
    return L + [""]


def markdown(res: dict) -> str:
    f, s = res["machine"], res["settings"]
    mark = {True: "yes", False: "**no**", None: "–"}
    L = ["# tracehound scrape cost", "",
         f"{f['date']}; Linux {f['kernel']}, {f['nproc']} × {f['cpu']}, {f['memory_gib']} GiB, "
         f"Python {f['python']}. Agent `{f['agent_revision']}` ({f['agent_tree']}); baseline "
         f"`{f['baseline_revision'] or 'not run'}`. {s['scrapes']} timed scrapes per case after one "
         f"warm-up, a fresh agent per case, {s['scrape_timeout']:g} s per-scrape timeout"
         f"{'; **quick run: smoke test, not a result**' if s['quick'] else ''}. "
         f"Took {res['elapsed_s'] / 60:.1f} min; load average {' '.join(f['loadavg_start'])} at the "
         f"start, {' '.join(f['loadavg_end'])} at the end.", "",
         "A *series* is one (cgroup, mount) label set of the I/O collector; it is exported as "
         "many *samples* (text lines: 20 counters, and 3 histograms of 25 lines each for the label "
         "sets `--latency-histograms` keeps one for: every one with `cgroup-mount`, one per "
         "workload and mount by default). "
         "MB = 10^6 bytes; memory in MiB from /proc/PID/status.", "",
         "## Targets", "", "| target | measured | met |", "|---|---|---|"]
    L += [f"| {t} | {m} | {mark[ok]} |" for t, m, ok in res["verdicts"]]
    L += [""] + floors(res)
    L += ["## Agent under test", ""] + size_table(runs(res, "new"))
    L += ["", "*Scrape*: as Prometheus scrapes (`Accept: text/plain;version=0.0.4`, "
          "`Accept-Encoding: gzip`), timed from connect to the last byte; plain text and protobuf "
          "are scraped once each after them. *plain MB*: the uncompressed text. *gzip*: bytes on "
          "the wire with `Accept-Encoding: gzip`. *protobuf*: "
          "asked for as Prometheus does (delimited MetricFamily, text at lower quality); "
          "*not offered* when the agent answered text. *CPU*: the agent's utime+stime over the "
          "timed scrapes ÷ their number (clock ticks of 10 ms). *RSS* after all scrapes of the case; "
          "*peak* is VmHWM over the agent's life.", ""]
    if runs(res, "baseline"):
        L += [f"## Baseline `{f['baseline_revision']}`", ""] + size_table(runs(res, "baseline"))
        L += ["", "### New ÷ baseline", ""] + ratio_table(res) + [""]
    L += ["## Per sample, next to node_exporter", ""] + per_sample(res)
    L += ["", "node_exporter runs with its default collectors on this machine; it is the yardstick "
          "for what an exporter of this machine's size costs per sample.", ""]
    idle = res["extras"].get("idle")
    if idle:
        L += ["## Idle", "", f"{idle['size']} real I/O, a scrape every {idle['interval_s']:g} s for "
              f"{idle['minutes']:g} min: {idle['scrapes']} scrapes (median {idle['scrape_median_s']:.3f} s), "
              f"{idle['cpu_s']:.2f} CPU s = **{idle['cpu_pct']:.2f} %** of one core; RSS "
              f"{mib(idle['VmRSS'])} MiB, peak {mib(idle['VmHWM'])} MiB.", ""]
    capped = [r for r in res["runs"] if r["kind"] == "io" and r["max_series"]]
    L += ["## Workloads", ""] + workload_table(res) + ["",
          "*Real I/O*: one process joins each cgroup in turn and opens, writes 4 KiB, reads it back "
          "(and fsyncs, in every 4th cgroup) a file on each tmpfs, then returns to the parent "
          "cgroup. *Fill*: bench/scrape/fill.py writes the entries into the agent's own io_stats map "
          "(found through the map fds the agent holds) in that revision's layout. Series of other "
          "processes on the machine are exported too, so *io series exported* is a little more "
          f"than the workload's. Default `--max-series` is {res['default_max_series']:,}"
          + ("; " + ", ".join(f"{case(r)} passed `--max-series {r['max_series']}`" for r in capped)
             if capped else "; no real-I/O case needed more") + ".", ""]
    L += ["## Machine", ""] + [f"- {k}: {v}" for k, v in f.items()] + [""]
    return "\n".join(L)


def plot(path: Path, res: dict) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(12, 4.8))
    styles = {"new": dict(color="#2a7", marker="o", ls="-"),
              "baseline": dict(color="#c64", marker="s", ls="--")}
    revs = {"new": res["machine"]["agent_revision"], "baseline": res["machine"]["baseline_revision"]}
    for impl, st in styles.items():
        rs = sorted((r for r in runs(res, impl) if done(r)), key=lambda r: r["samples"])
        if not rs:
            continue
        xs, label = [r["samples"] for r in rs], f"tracehound {impl} ({revs[impl]})"
        axes[0].plot(xs, [med(r) for r in rs], label=label, **st)
        axes[1].plot(xs, [r["text_bytes"][-1] / 1e6 for r in rs], label=label, **st)
        for r in rs if impl == "new" else []:
            for ax, y in ((axes[0], med(r)), (axes[1], r["text_bytes"][-1] / 1e6)):
                ax.annotate(case(r).replace(" real I/O", ""), (r["samples"], y), fontsize=7,
                            xytext=(5, -9), textcoords="offset points")
    ne = res["peer"]
    if done(ne):
        for ax, y in ((axes[0], med(ne)), (axes[1], ne["text_bytes"][-1] / 1e6)):
            ax.plot([ne["samples"]], [y], "k*", ms=12, label="node_exporter, defaults")
    # a target holds at one size: a point at the sample count of that size
    r8, r80 = at_size(res, 8000), at_size(res, 80000)
    if r8:
        axes[0].plot([r8["samples"]], [SCRAPE_8K_S], "rx", ms=10, mew=2, label="target at 8,000 series")
        axes[1].plot([r8["samples"]], [TEXT_8K_B / 1e6], "rx", ms=10, mew=2, label="target at 8,000 series")
    if r80:
        axes[0].plot([r80["samples"]], [SCRAPE_80K_S], "r+", ms=12, mew=2, label="target at 80,000 series")
    for ax, y in zip(axes, ("scrape wall time, median (s)", "plain-text response (MB)")):
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("samples in the scrape (text lines)")
        ax.set_ylabel(y)
        ax.grid(True, which="both", lw=0.3)
        ax.legend(fontsize=7)
    fig.suptitle(f"tracehound scrape cost — {res['machine']['nproc']} CPUs, {res['machine']['kernel']}, "
                 f"{res['machine']['date'][:10]}{' (quick)' if res['settings']['quick'] else ''}")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def write_reports(out: Path, res: dict) -> list[tuple[str, str, bool | None]]:
    res["verdicts"] = verdicts(res)
    out.mkdir(parents=True, exist_ok=True)
    (out / "scrape.json").write_text(json.dumps(res, indent=2) + "\n")
    (out / "scrape.md").write_text(markdown(res))
    plot(out / "scrape.png", res)
    return res["verdicts"]


if __name__ == "__main__":
    # re-render a report from its JSON: python -m bench.scrape.report bench/report
    import sys
    from bench.common import REPORT
    folder = Path(sys.argv[1] if len(sys.argv) > 1 else REPORT)
    write_reports(folder, json.loads((folder / "scrape.json").read_text()))
