"""Markdown and JSON reports for bench/overhead (the plot is in plot.py).

    .venv/bin/python -m bench.overhead.report [DIR]    # re-render DIR/overhead.json
"""
from __future__ import annotations

import json
import statistics
from pathlib import Path

from bench.common import REPORT, verdict

CONDITIONS = ("baseline", "tracehound", "tracehound-every", "tracehound-latoff",
              "tracehound-gap1s", "empty", "empty-exit", "bpftrace")
# latency on is the agent's default: sampled timing; every: every call timed
LABELS = {"baseline": "baseline", "tracehound": "tracehound, latency on (sampled)",
          "tracehound-every": "tracehound, latency every call",
          "tracehound-latoff": "tracehound, latency off",
          # sampled timing with hardly a call timed: the entry hook and the
          # sampling decision, the part of latency on no gap can remove
          "tracehound-gap1s": "tracehound, latency on, a 1 s gap",
          "empty": "empty hooks, enter + exit",
          "empty-exit": "empty hook, exit only", "bpftrace": "bpftrace"}
# the empty condition whose programs sit on the same hooks as the tool's: its
# run time per program run is what bpf_stats reports for doing nothing there
FLOOR_OF = {"tracehound": "empty", "tracehound-every": "empty", "tracehound-latoff": "empty-exit",
            "tracehound-gap1s": "empty", "bpftrace": "empty"}
WORKLOADS = {
    "randread-4k": {"title": "4 KiB random read", "rw": "randread", "bs": "4k", "bytes": 4096,
                    "dir": "read", "unit": "IOPS"},
    "read-1m": {"title": "1 MiB sequential read", "rw": "read", "bs": "1M", "bytes": 1 << 20,
                "dir": "read", "unit": "MiB/s"},
    "write-1m": {"title": "1 MiB sequential write", "rw": "write", "bs": "1M", "bytes": 1 << 20,
                 "dir": "write", "unit": "MiB/s"},
}
MAIN = "randread-4k"
TARGET_NET_NS, ON_MARGIN_PCT, OFF_MARGIN_PCT = 60.0, 3.0, 2.0


def scale(w: str) -> float:
    """IOPS to the workload's display unit."""
    return 1.0 if WORKLOADS[w]["unit"] == "IOPS" else WORKLOADS[w]["bytes"] / (1 << 20)


def per_run(r: dict) -> float:
    return r["total_run_time_ns"] / r["program_runs"] if r["program_runs"] else 0.0


def add_floors(cs: dict) -> dict:
    """Per workload, what each empty condition's programs cost per run under
    bpf_stats (its own clock reads plus the call), the median of its cost
    rounds; each tool's run time is then also given net of the floor of the
    same round, per program run the tool made, as the median of its rounds'
    nets (so drift between rounds hits both sides of each difference)."""
    floors = {}
    for w in next(iter(cs.values()))["workloads"]:
        floors[w] = {e: statistics.median(per_run(r) for r in cs[e]["workloads"][w]["rounds"])
                     for e in ("empty", "empty-exit")}
        for t, e in FLOOR_OF.items():
            if t in cs:
                x = cs[t]["workloads"][w]
                floor_rounds = cs[e]["workloads"][w]["rounds"]
                x["net_rounds"] = [r["ns_per_io"] - per_run(f) * r["program_runs"] / r["total_ios"]
                                   for r, f in zip(x["rounds"], floor_rounds)]
                x["net_ns_per_io"] = statistics.median(x["net_rounds"])
    return floors


def noise(b: dict) -> str:
    return (f"baseline rounds −{b['noise_down_pct']:.2f}/+{b['noise_up_pct']:.2f} % around their "
            f"median, stdev {b['stdev_pct']:.2f} %")


def floor_pct(t: dict) -> str:
    return f"{t['loss_pct']:.2f} %" + (", taken as 0" if t["loss_pct"] < 0 else "")


def verdicts(res: dict) -> list[tuple[str, str, bool | None]]:
    tp, cs, conds = res["throughput"], res["cost"], res["settings"]["conditions"]
    off = "tracehound-latoff" in conds
    no_off = "not measured: `tracehound run` has no `--latency` option in this tree"
    out = []
    if MAIN in tp:
        t, c = tp[MAIN], {k: v["workloads"][MAIN] for k, v in cs.items()}
        # a floor below zero is noise: no program makes the syscall faster
        e, x = max(t["empty"]["loss_pct"], 0.0), max(t["empty-exit"]["loss_pct"], 0.0)
        th, fl = c["tracehound"], res["floors"][MAIN]["empty"]
        out += [
            (f"4 KiB: BPF run time per I/O syscall, latency on, net of the empty-hook floor "
             f"≤ {TARGET_NET_NS:g} ns",
             net_text(th, fl),
             th["net_ns_per_io"] <= TARGET_NET_NS),
            (f"4 KiB: throughput loss, latency on ≤ floor + {ON_MARGIN_PCT:g} %",
             f"{t['tracehound']['loss_pct']:.2f} % (limit {e + ON_MARGIN_PCT:.2f} %; floor = "
             f"empty enter + exit, {floor_pct(t['empty'])})", t["tracehound"]["loss_pct"] <= e + ON_MARGIN_PCT)]
        if "tracehound-every" in conds:
            ev, cev = t["tracehound-every"], c["tracehound-every"]
            out.append(("4 KiB: sampled timing costs less than timing every call (run time net "
                         "of the floor, throughput loss)",
                         f"{th['net_ns_per_io']:.1f} vs {cev['net_ns_per_io']:.1f} ns; "
                         f"{t['tracehound']['loss_pct']:.2f} vs {ev['loss_pct']:.2f} %",
                         th["net_ns_per_io"] < cev["net_ns_per_io"]))
        if off:
            lo = t["tracehound-latoff"]["loss_pct"]
            out += [(f"4 KiB: throughput loss, latency off ≤ floor/2 + {OFF_MARGIN_PCT:g} %",
                     f"{lo:.2f} % (limit {e / 2 + OFF_MARGIN_PCT:.2f} %; floor {floor_pct(t['empty'])})",
                     lo <= e / 2 + OFF_MARGIN_PCT),
                    (f"… the same against the measured exit-only floor: ≤ floor(exit) + "
                     f"{OFF_MARGIN_PCT:g} %",
                     f"{lo:.2f} % (limit {x + OFF_MARGIN_PCT:.2f} %; exit-only floor "
                     f"{floor_pct(t['empty-exit'])})",
                     lo <= x + OFF_MARGIN_PCT)]
        else:
            out += [(f"4 KiB: throughput loss, latency off ≤ floor/2 + {OFF_MARGIN_PCT:g} %",
                     no_off, None)]
        out += floors_under_latency_on(t, c, e, x)
    else:
        out.append(("4 KiB targets (net run time, losses against the floor, bpftrace)",
                    f"not measured: `{MAIN}` left out of --workloads", None))
    for w in ("read-1m", "write-1m"):
        if w not in tp:
            continue
        ths = [k for k in ("tracehound", "tracehound-every", "tracehound-latoff") if k in conds]
        out.append((f"{WORKLOADS[w]['title']}: throughput loss within run-to-run noise",
                    ", ".join(f"{LABELS[k].split(', ')[1]} {tp[w][k]['loss_pct']:.2f} %" for k in ths)
                    + f"; noise: {noise(tp[w]['baseline'])}",
                    all(tp[w][k]["within_noise"] for k in ths)))
    if MAIN in tp:
        th, bt = cs["tracehound"]["workloads"][MAIN], cs["bpftrace"]["workloads"][MAIN]
        lt, lb = tp[MAIN]["tracehound"]["loss_pct"], tp[MAIN]["bpftrace"]["loss_pct"]
        out += [("4 KiB: cheaper than bpftrace, BPF run time per I/O syscall (latency on)",
                 f"{th['ns_per_io']:.1f} vs {bt['ns_per_io']:.1f} ns", th["ns_per_io"] < bt["ns_per_io"]),
                ("4 KiB: cheaper than bpftrace, throughput loss (latency on)",
                 f"{lt:.2f} vs {lb:.2f} %", lt < lb)]
    return out


def net_text(x: dict, floor: float) -> str:
    """How a net run time per syscall was taken: one round's raw less its
    floor, or the median of several rounds' nets, each against its own round."""
    if len(x["net_rounds"]) == 1:
        return (f"{x['net_ns_per_io']:.1f} ns ({x['ns_per_io']:.1f} raw − {floor:.1f} ns floor × "
                f"{x['program_runs'] / x['fio']['total_ios']:.2f} runs per syscall)")
    return (f"{x['net_ns_per_io']:.1f} ns (median of {len(x['net_rounds'])} rounds' nets, each its "
            f"run time less the same round's floor × runs per syscall: "
            + ", ".join(f"{n:.1f}" for n in x["net_rounds"]) + f"; all rounds pooled: "
            f"{x['ns_per_io']:.1f} raw, floor {floor:.1f} ns per run)")


def floors_under_latency_on(t: dict, c: dict, e: float, x: float) -> list[tuple[str, str, None]]:
    """Rows without a target: what the throughput target for latency on sits
    on, measured in the same run: counting with no clock (latency off, over
    its exit-only floor) and sampled timing with hardly a call timed (over
    the two-hook floor)."""
    out = []
    on = t["tracehound"]["loss_pct"] - e
    if "tracehound-latoff" in t:
        out.append(("the floor under that: counting alone, no clock and no entry hook "
                    "(latency off), over the exit-only floor",
                    f"{t['tracehound-latoff']['loss_pct'] - x:+.2f} points (latency on: "
                    f"{on:+.2f} over the two-hook floor)", None))
    if "tracehound-gap1s" in t and "tracehound-gap1s" in c:
        g = t["tracehound-gap1s"]["loss_pct"] - e
        out.append(("… and sampled timing with hardly a call timed (a 1 s gap): the entry hook "
                    "and the sampling decision, over the two-hook floor",
                    f"{g:+.2f} points, {c['tracehound-gap1s']['net_ns_per_io']:.1f} ns net per "
                    f"syscall (latency on: {on:+.2f} points, "
                    f"{c['tracehound']['net_ns_per_io']:.1f} ns)", None))
    return out


def floor_note(res: dict) -> list[str]:
    """What the empty conditions say about the targets in syscall mode."""
    tp, conds = res["throughput"], res["settings"]["conditions"]
    L = ["## What syscall-level hooks cost before doing anything", ""]
    if MAIN in tp:
        t = tp[MAIN]
        e, x = t["empty"], t["empty-exit"]
        L.append(
            f"Two empty programs on every syscall's entry and exit (the hooks of the tracepoint mode, "
            f"nothing in them) cost **{e['loss_pct']:.2f} %** of the 4 KiB workload's throughput, "
            f"{e['added_ns_per_io']:.0f} ns per read; the exit one alone **{x['loss_pct']:.2f} %**, "
            f"{x['added_ns_per_io']:.0f} ns. No syscall-level probe can go below that on this kernel, "
            "however little it does (only the VFS modes, fentry and kprobe, hook just the I/O "
            "functions), so the throughput targets are set above the floor rather than as a fixed "
            f"percentage. tracehound with latency on adds "
            f"{t['tracehound']['added_ns_per_io'] - e['added_ns_per_io']:.0f} ns per read on top of "
            "the two-hook floor" +
            (f"; with latency off, {t['tracehound-latoff']['added_ns_per_io'] - x['added_ns_per_io']:.0f}"
             " ns on top of the exit-only floor." if "tracehound-latoff" in conds else "."))
        L.append("")
    seq = [w for w in tp if w != MAIN]
    if seq:
        cs = res["cost"]
        L.append("At 1 MiB a call copies a megabyte, so a fixed cost per call shrinks beside it. What "
                 "the BPF run time per I/O syscall (cost phase) would take of a baseline call: " + "; ".join(
                     f"{WORKLOADS[w]['title']}, a {1e9 / tp[w]['baseline']['median'] / 1e3:.0f} µs call: " +
                     ", ".join(f"{LABELS[c]} {expected_pct(res, w, c):.2f} %"
                               for c in conds if c in cs and not c.startswith("empty"))
                     for w in seq) +
                 ". Dispatch adds to that (the 4 KiB floor above); whether a loss of this order can be "
                 "told from run-to-run noise, the noise line under each table says.")
        L.append("")
    return L


def expected_pct(res: dict, w: str, c: str) -> float:
    """Share of a baseline call that the condition's BPF run time is."""
    return res["cost"][c]["workloads"][w]["ns_per_io"] * res["throughput"][w]["baseline"]["median"] / 1e7


def within(t: dict, c: str) -> str:
    if c == "baseline":
        return "–"
    if not t[c]["within_noise"]:
        return "no"
    # a gain past the baseline's fastest round is no loss, but a sign that
    # the rounds did not see the same machine
    return "yes (median faster than every baseline round)" if -t[c]["loss_pct"] > t["baseline"]["noise_up_pct"] else "yes"


def throughput_tables(res: dict) -> list[str]:
    tp, conds = res["throughput"], res["settings"]["conditions"]
    L = ["## Throughput (bpf_stats off)", ""]
    for w, t in tp.items():
        u, k = WORKLOADS[w]["unit"], scale(w)
        L += [f"### {WORKLOADS[w]['title']}", "",
              f"| condition | median {u} | min | max | loss vs baseline | paired loss, median (min … max) "
              f"| added ns per I/O | within baseline noise |",
              "|---|---:|---:|---:|---:|---:|---:|---|"]
        for c in conds:
            r = t[c]
            L.append(f"| {LABELS[c]} | {r['median'] * k:,.0f} | {r['min'] * k:,.0f} | {r['max'] * k:,.0f} | "
                     f"{r['loss_pct']:.2f} % | {r['loss_pct_paired']:.2f} % ({r['loss_pct_paired_min']:.2f} … "
                     f"{r['loss_pct_paired_max']:.2f}) | {r['added_ns_per_io']:.0f} | "
                     + within(t, c) + " |")
        L += ["", f"Noise: {noise(t['baseline'])}.", ""]
    L += ["*Loss* compares medians; *paired* is each round's condition/baseline ratio (median and "
          "range over rounds). *Added ns per I/O* is 1/IOPS(condition) − 1/IOPS(baseline): "
          "everything the condition costs per syscall, hook dispatch included, which BPF run times "
          "below do not show. *Noise* is how far the baseline's own rounds stray from their median; "
          "a loss is *within* it when the condition's median is no slower than the slowest baseline "
          "round (loss ≤ the baseline's downward spread).", ""]
    return L


def cost_tables(res: dict) -> list[str]:
    cs, floors = res["cost"], res["floors"]
    conds = [c for c in res["settings"]["conditions"] if c != "baseline"]
    wls = list(floors)
    rounds = res["settings"].get("cost_rounds", 1)
    L = ["## Per-event cost (BPF run-time statistics on; " +
         ("per condition one fresh start, every workload under it)" if rounds == 1 else
          f"{rounds} rounds, each a fresh start of every condition in an order rotated every round, "
          "every workload under it; counts and run times below are the rounds' sums, *net of "
          "floor* the median of the rounds' nets, each against the floor of its own round)"), "",
         "| workload | condition | fio I/Os | program runs | runs per I/O | BPF run time | "
         "ns per I/O syscall | net of floor |", "|---|---|---:|---:|---:|---:|---:|---:|"]
    for w in wls:
        for c in conds:
            x = cs[c]["workloads"][w]
            n = x["fio"]["total_ios"]
            net = f"{x['net_ns_per_io']:.1f}" if "net_ns_per_io" in x else "(floor)"
            L.append(f"| {WORKLOADS[w]['title']} | {LABELS[c]} | {n:,} | {x['program_runs']:,} | "
                     f"{x['program_runs'] / n:.2f} | {x['total_run_time_ns'] / 1e6:.1f} ms | "
                     f"{x['ns_per_io']:.1f} | {net} |")
    L += ["", "| condition | program | type | " + " | ".join(
        f"{WORKLOADS[w]['title']}: runs | ns per run" for w in wls) + " |",
        "|---|---|---|" + "---:|---:|" * len(wls)]
    for c in conds:
        progs = {}
        for w in wls:
            for p in cs[c]["workloads"][w]["programs"]:
                progs.setdefault((p["id"], p["name"], p["type"]), {})[w] = p
        idle = 0
        for (pid, name, typ), per in progs.items():
            if not any(p["run_cnt"] for p in per.values()):
                idle += 1
                continue
            L.append(f"| {LABELS[c]} | {name} (id {pid}) | {typ} | " + " | ".join(
                f"{per[w]['run_cnt']:,} | " + (f"{per[w]['ns_per_run']:.1f}" if per[w]["run_cnt"] else "–")
                for w in wls) + " |")
        if idle:
            L.append(f"| {LABELS[c]} | {idle} more (other syscalls) | | " + " | ".join("0 | –" for _ in wls) + " |")
    L += ["", "| condition | fio reads | reads it counted on the bench mount | fio writes | "
          "writes it counted |", "|---|---:|---:|---:|---:|"]
    for c in conds:
        x = cs[c]
        if x["counted"] is None:
            continue
        cells = []
        for d in ("read", "write"):
            n, k = x["fio_ios"][d], x["counted"][d]
            cells += [f"{n:,}", f"{k:,} ({100 * k / n:.1f} %)" if n else f"{k:,}"]
        L.append(f"| {LABELS[c]} | " + " | ".join(cells) + " |")
    L += ["", "*ns per I/O syscall* = run time of all of a condition's programs ÷ fio's I/O count, "
          "the fair comparison when tools use different numbers of programs per syscall. Programs "
          "see every process, so other processes' syscalls during the run are charged to fio's I/O "
          "(a small upward bias, larger at 1 MiB where fio makes fewer calls per second). *Floor*: "
          "the empty tp_btf programs measure " + "; ".join(
              f"{WORKLOADS[w]['title']}: " + ", ".join(f"{floors[w][e]:.1f} ns per run ({LABELS[e]})"
                                                        for e in floors[w]) for w in wls) +
          " — bpf_stats' own clock reads and the call, not work. *Net of floor* subtracts that per "
          "program run: the two-hook floor for latency on and bpftrace, the exit-only floor for "
          "latency off. Runs that were not fio's I/O calls (other processes, fio's other syscalls), "
          "from the two-hook programs' count: " + ", ".join(
              f"{WORKLOADS[w]['title']} {other_pct(cs['empty']['workloads'][w]):.1f} %" for w in wls) +
          "; where this is large the per-I/O figures of that workload are inflated by the rest of "
          "the machine. The count check: the agent's exported counters after the cost runs, "
          "bpftrace's `@calls` map at exit.", ""]
    return L


def other_pct(x: dict) -> float:
    """Share of an enter + exit pair's runs not made by fio's I/O calls."""
    return 100 * (1 - 2 * x["fio"]["total_ios"] / x["program_runs"]) if x["program_runs"] else 0.0


def markdown(res: dict) -> str:
    f, a = res["machine"], res["settings"]
    conds = a["conditions"]
    L = ["# tracehound overhead: page-cache reads, sequential 1 MiB reads and writes", "",
         f"{f['date']} on Linux {f['kernel']}, {f['nproc']} × {f['cpu']} (a VM). "
         f"{a['rounds']} interleaved rounds; per condition and round "
         f"{a['runtime_s']} s of 4 KiB random reads and {a['seq_runtime_s']} s of each 1 MiB workload"
         f"{' (quick run: smoke test, not a result)' if a['quick'] else ''}; fio pinned to CPU {a['cpu']}; "
         f"hook mode `{a['hook_mode']}`; files of {a['size_mib']} MiB on a private tmpfs.", "",
         "Conditions: " + "; ".join(LABELS[c] for c in conds) + "." +
         ("" if a["latency_off"] else " *tracehound, latency off* is left out: `tracehound run --help` "
          "lists no `--latency` option in this tree."), "",
         "Throughput numbers are **medians of interleaved rounds** (conditions in an order rotated "
         "every round, the workloads of a condition back to back under one start of its tool, their "
         "order rotated too), so drift and other work on this VM hit all conditions alike; the "
         "spread is min–max over rounds. Tools are idle in userspace during their rounds (nothing "
         "scrapes the agent).", ""]
    if a.get("stats_on_during_throughput"):
        L += [f"**kernel.bpf_stats_enabled was on during {a['stats_on_during_throughput']} throughput "
              "runs**: the BPF conditions in those runs paid for its clock reads (the script leaves "
              "the sysctl alone, since other tools may be using it).", ""]
    L += ["## Targets", "", "| target | measured | met |", "|---|---|---|"]
    L += [f"| {t} | {m} | {'n/a' if ok is None else 'yes' if ok else '**no**'} |"
          for t, m, ok in res["verdicts"]]
    L += [""] + floor_note(res) + parts_floor(res) + throughput_tables(res) + cost_tables(res)
    L += ["## Machine", ""] + [f"- {k}: {v}" for k, v in f.items()]
    L += ["", "## Commands", "", "```"]
    L += [" ".join(f"'{w}'" if " " in w else w for w in c) for c in res["commands"].values()]
    L += ["```", ""]
    for c, modes in res["agent_modes"].items():
        L.append(f"{LABELS[c]} reported: " + ("; ".join(modes) or "no probe modes") + ".")
    L.append("")
    return "\n".join(L)


def parts_floor(res: dict) -> list[str]:
    """What the latency-on target is up against, from bench/hotpath_parts'
    report beside this one (same machine, measured step by step)."""
    p = res.get("parts")
    if not p:
        return []
    c = p["cost_ns"]
    need = ("clock_read", "array_lookup_3_atomic_adds", "fd_mount_typed_loads", "cgroup_id_loads",
            "current_task")
    if any(k not in c for k in need):
        return []
    clocks = 2 * c["clock_read"]
    # each part fetches the current task itself: count that once
    cgroup = max(0.0, c["cgroup_id_loads"] - c["current_task"])
    least = clocks + c["array_lookup_3_atomic_adds"] + c["fd_mount_typed_loads"] + cgroup
    return ["## The floor under the net target, step by step", "",
            f"`bench/hotpath_parts` on this machine ({p['machine']['date']}, report "
            "`hotpath-parts.md`) measures each step a timed read must take. Two clock reads "
            f"(entry and exit) cost {clocks:.0f} ns here; with the accounting through an array "
            f"slot ({c['array_lookup_3_atomic_adds']:.0f} ns), the fd's mount by typed loads "
            f"({c['fd_mount_typed_loads']:.0f} ns, fetching the current task included) and the "
            f"cgroup id from the same task ({cgroup:.0f} ns more), no program that times every "
            f"call and counts it per (cgroup, mount) can take less than about {least:.0f} ns net "
            f"here: the ≤ {TARGET_NET_NS:g} ns target is below the two clock reads alone. Sampled "
            "timing (latency on) pays them for about one call in 2^k when calls come fast, "
            "which is what leaves room under the target. Without timing (latency off) the same "
            f"steps leave about {least - clocks:.0f} ns: what a counters-only program must add "
            "to the exit-only floor here. (That report is of its own run: compare its figures "
            "with this one's only as orders of magnitude.)", ""]


def write_reports(out: Path, res: dict) -> list[tuple[str, str, bool | None]]:
    from bench.overhead.plot import plot

    parts = out / "hotpath-parts.json"
    if parts.exists():
        res["parts"] = json.loads(parts.read_text())
    res["floors"] = add_floors(res["cost"])
    res["verdicts"] = verdicts(res)
    out.mkdir(parents=True, exist_ok=True)
    (out / "overhead.json").write_text(json.dumps(res, indent=2) + "\n")
    (out / "overhead.md").write_text(markdown(res))
    plot(out / "overhead.png", res)
    return res["verdicts"]


if __name__ == "__main__":
    import sys
    # re-render a run's report (e.g. after bench/hotpath_parts wrote its own beside it)
    where = Path(sys.argv[1]) if len(sys.argv) > 1 else REPORT
    for t, m, ok in write_reports(where, json.loads((where / "overhead.json").read_text())):
        print(f"{verdict(ok)} {t}: {m}")
