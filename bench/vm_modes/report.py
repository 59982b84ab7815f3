"""Markdown, JSON and plot for bench/vm_modes: ratios only, since the
emulated VM inflates every absolute number."""
from __future__ import annotations

import json
import re
import statistics
from pathlib import Path

LABELS = {
    "baseline": "no tracing",
    "th-fentry": "tracehound fentry", "th-fentry-nolat": "tracehound fentry, latency off",
    "th-fentry-gap1s": "tracehound fentry, latency on, a 1 s gap",
    "th-kprobe": "tracehound kprobe", "th-kprobe-nolat": "tracehound kprobe, latency off",
    "th-tracepoint": "tracehound tracepoint", "th-tracepoint-nolat": "tracehound tracepoint, latency off",
    "empty-fentry": "empty fentry + fexit on vfs_read/vfs_write",
    "empty-tp": "empty tp_btf sys_enter + sys_exit",
    "bpftrace": "bpftrace baseline.bt", "ceems": "CEEMS bpf_vfs (fexit)",
}
TITLES = {"randread-4k": "4 KiB random reads (psync, one pread64 each)",
          "seqread-1m": "1 MiB sequential reads (psync)",
          "seqwrite-1m": "1 MiB sequential writes (psync)"}
REF, PEER = "th-tracepoint", "ceems"
FENTRY_VS_TP, FENTRY_VS_CEEMS = 0.40, 0.50

COUNTS = [
    ("tracehound", "fentry/fexit or kprobe/kretprobe on vfs_read, vfs_readv, vfs_write, vfs_writev, "
     "vfs_open, vfs_unlink, vfs_mkdir, vfs_rmdir, vfs_rename, vfs_fsync_range (+ the fdatasync "
     "syscall tracepoints); tracepoint mode: tp_btf sys_enter/sys_exit",
     "(cgroup, mount)",
     "bytes read and written (return value); calls and errors of read, write, open, create, unlink, "
     "mkdir, rmdir, rename, fsync; log2 latency histograms of read, write, fsync (latency on)"),
    ("CEEMS", "fexit on vfs_read, vfs_write, vfs_readv, vfs_writev, vfs_open, vfs_create, vfs_mkdir, "
     "vfs_unlink, vfs_rmdir",
     "read/write: (cgroup id, mount path ≤ 64 bytes); the rest: cgroup id",
     "bytes, calls, errors of read and write; calls and errors of open, of create+mkdir (one counter) "
     "and of unlink+rmdir (one counter). No latency, fsync or rename; the root cgroup and /dev, /sys, "
     "/proc mounts are skipped; the mount path is resolved by walking dentries on every read/write. "
     "On 6.1 vfs_readv/vfs_writev take five arguments and its programs declare four, so what they take "
     "for the return value is the flags argument: readv/writev calls are counted, their bytes and errors "
     "are not (fio's psync workloads here make none)"),
    ("bpftrace", "syscall tracepoints of read, pread64, readv, preadv, preadv2 and the write twins",
     "(cgroup, mount id, op)", "calls, errors, bytes and a log2 latency histogram of reads and writes only"),
]


def gist(error: str) -> str:
    """The lines of a tool's failure that say why (libbpf's and the verifier's), not its banner."""
    lines = [l.strip() for l in error.splitlines() if l.strip()]
    why = [l for l in lines if re.search(r"fail|error|invalid|unbounded|denied|not found|no such", l, re.I)
           and not l.endswith("did not get ready:")]
    return "; ".join(why[-2:]) or (lines[-1] if lines else "?")


def pct(x: float | None) -> str:
    return "–" if x is None else f"{x:.1f} %"


def times(x: float | None) -> str:
    return "–" if x is None else f"{x:.2f}×"


def summarize(res: dict) -> dict:
    """Per workload and condition: BPF time per I/O syscall as ratios, programs
    run per syscall, throughput against the baseline, and what was counted."""
    out = {}
    for w, tput in res["throughput"].items():
        cost = {c: v[w] for c, v in res["cost"].items() if w in v}
        ns = {c: v["ns_per_io"] for c, v in cost.items()}
        base = [x for x in tput.get("baseline", []) if x]
        rows = {}
        for c, iops in tput.items():
            got = [x for x in iops if x]
            row = rows[c] = {}
            if c in ns:
                row["vs_tracepoint"] = ns[c] / ns[REF] if ns.get(REF) else None
                row["vs_ceems"] = ns[c] / ns[PEER] if ns.get(PEER) else None
                row["runs_per_io"] = cost[c]["runs_per_io"]
                row["share"] = {p: v["ns"] / cost[c]["total_ns"] for p, v in cost[c]["programs"].items()
                                if cost[c]["total_ns"]}
                got_n = res["counts"].get(c, {}).get(w)
                if got_n:
                    n = got_n["counted"]["read"] + got_n["counted"]["write"]
                    row["counted_pct"] = 100 * n / got_n["fio"]["ios"]
                runs = [x["ns_per_io"] for x in res["cost_runs"].get(c, {}).get(w, [])]
                if len(runs) > 1:
                    row["cost_spread_pct"] = 100 * (max(runs) - min(runs)) / statistics.median(runs)
            if got and base and c != "baseline":
                row["loss_pct"] = 100 * (1 - statistics.median(got) / statistics.median(base))
                paired = [100 * (1 - x / b) for x, b in zip(iops, tput["baseline"]) if x and b]
                if paired:
                    row["paired_loss_pct"] = [statistics.median(paired), min(paired), max(paired)]
            if got:
                row["rounds"] = len(got)
                row["spread_pct"] = 100 * (max(got) - min(got)) / statistics.median(got)
        out[w] = rows
    return out


def verdicts(res: dict, s: dict) -> list[tuple[str, str, bool | None]]:
    out = []
    for w, rows in s.items():
        fe = rows.get("th-fentry", {})
        for key, limit, other in (("vs_tracepoint", FENTRY_VS_TP, "tracepoint mode"),
                                  ("vs_ceems", FENTRY_VS_CEEMS, "CEEMS")):
            what = f"{w}: fentry mode BPF ns per I/O syscall ≤ {limit:.0%} of {other}'s"
            v = fe.get(key)
            if v is None:
                gone = [LABELS[c] for c in ("th-fentry", REF if key == "vs_tracepoint" else PEER)
                        if c not in rows or c in res["skipped"]]
                msg = "not measured" + (f": no {' and no '.join(gone)} in this run" if gone else "")
            else:
                msg = f"{v:.0%}"
            out.append((what, msg, None if v is None else v <= limit))
        floors = [(c, rows[c]) for c in ("th-fentry-gap1s", "th-fentry-nolat", "empty-fentry")
                  if rows.get(c, {}).get("vs_tracepoint") is not None]
        if floors and fe.get("vs_tracepoint") is not None:
            out.append((f"{w}: the floor under those, fentry with less timing or none (no target)",
                        "; ".join(f"{LABELS[c]} {r['vs_tracepoint']:.0%} of tracepoint mode"
                                  + (f", {r['vs_ceems']:.0%} of CEEMS" if r.get("vs_ceems") else "")
                                  for c, r in floors), None))
    return out


def markdown(res: dict, s: dict, verdict: list) -> str:
    g, cfg, vm, h = res["guest"], res["settings"], res.get("vm", {}), res.get("host", {})
    conds = [c for c in LABELS if any(c in rows for rows in s.values())]
    n_cost = cfg.get("cost_rounds", 1)
    L = ["# I/O probe per-event cost in Debian 6.1 (VM tier, emulated)", ""]
    if cfg.get("quick"):
        L += ["**Quick smoke run (`--quick`): too short to draw conclusions from.**", ""]
    L += [f"Kernel {vm.get('kernel', g['kernel'])} under QEMU without KVM (TCG), {g['nproc']} vCPUs, "
         f"started {g['started']}; commit {h.get('commit', '?')}. Emulation "
         "inflates every absolute number and not evenly, so this report gives **ratios measured in this "
         "one run only**; the raw figures are in vm-modes.json. "
         f"{cfg['rounds']} interleaved round(s) of {cfg['runtime']} s per workload, BPF cost over "
         f"{cfg['window']:g} s windows in {n_cost} of them, {cfg['size_mib']} MiB files on a tmpfs; "
         f"source tree {cfg.get('tree', '?')}; VM {vm.get('total_s', 0) / 60:.1f} min in all. "
         f"The emulated vCPUs are host threads, so anything else running on the host ({h.get('nproc', '?')} "
         f"CPUs; load average {' '.join(h.get('loadavg_start', ['?']))} at the start, "
         f"{' '.join(h.get('loadavg_end', ['?']))} at the end) shows up as noise here.", "",
         "## Targets", "", "| target | measured | met |", "|---|---|---|"]
    for what, msg, ok in verdict:
        L.append(f"| {what} | {msg} | {'–' if ok is None else 'yes' if ok else '**no**'} |")
    L.append("")
    notes = list(res["notes"]) + [f"{LABELS.get(c, c)} left out: {gist(why)}"
                                  for c, why in res["skipped"].items()]
    notes += [f"round {e['round']}, {LABELS.get(e['condition'], e['condition'])}: {gist(e['error'])}"
              for e in res["errors"] if e["condition"] not in res["skipped"]]
    if notes:
        L += ["## Notes", ""] + [f"- {n}" for n in notes] + [""]
    bt = res["counts"].get("bpftrace", {}).get("session")
    bt_cell = (f"{pct(100 * sum(bt['counted'].values()) / sum(bt['fio'].values()))} (session)"
               if bt and sum(bt["fio"].values()) else "–")
    for w, rows in s.items():
        L += [f"## {TITLES.get(w, w)}", "",
              "BPF run time of the condition's own programs per read/write syscall of fio (bpf_stats"
              + (f", the median of {n_cost} runs" if n_cost > 1 else "") + "), as a ratio; throughput "
              "loss is fio's IOPS against no tracing (bpf_stats off), from the medians over rounds, then "
              "the median and range of the per-round paired losses.", "",
              "| condition | BPF ns/syscall ÷ tracehound tracepoint | ÷ CEEMS | program runs per syscall "
              + ("| cost spread over runs " if n_cost > 1 else "")
              + "| throughput loss | paired loss, median (min … max) | counted ÷ fio's I/Os |",
              "|---|---:|---:|---:|" + "---:|" * (n_cost > 1) + "---:|---:|---:|"]
        for c in conds:
            r = rows.get(c)
            if r is None or c == "baseline" or c in res["skipped"]:
                continue
            pl = r.get("paired_loss_pct")
            cells = [LABELS[c]]
            cells += ([times(r.get("vs_tracepoint")), times(r.get("vs_ceems")), f"{r['runs_per_io']:.2f}"]
                      if "runs_per_io" in r else ["–"] * 3)
            if n_cost > 1:
                cells.append(pct(r.get("cost_spread_pct")))
            cells += [pct(r.get("loss_pct")),
                      f"{pl[0]:.1f} % ({pl[1]:.1f} … {pl[2]:.1f})" if pl and r.get("rounds", 0) > 1
                      else "–",
                      pct(r.get("counted_pct")) if c != "bpftrace" else bt_cell]
            L.append("| " + " | ".join(cells) + " |")
        base = rows.get("baseline", {})
        if base.get("spread_pct") is not None and base.get("rounds", 0) > 1:
            L.append(f"\nBaseline rounds spread {base['spread_pct']:.1f} % (max − min over median): "
                     "losses below that are noise.")
        L.append("")
    L += ["## Where the time goes (share of each condition's BPF run time, 4 KiB reads)", ""]
    w0 = "randread-4k" if "randread-4k" in s else next(iter(s), None)
    for c in conds:
        share = s.get(w0, {}).get(c, {}).get("share")
        if share:
            top = sorted(share.items(), key=lambda kv: -kv[1])[:8]
            L.append(f"- {LABELS[c]}: " + ", ".join(f"{p} {v:.0%}" for p, v in top))
    L += ["", "## What each tool counts", "", "| tool | hooks | keyed by | counts |", "|---|---|---|---|"]
    L += [f"| {t} | {h} | {k} | {c} |" for t, h, k, c in COUNTS]
    modes = {c: t["status"] for c, t in res["tools"].items() if c.startswith("th-")}
    if modes:
        L += ["", "Hook modes (and the sampling of its timed calls) the agent reported:", ""]
        L += [f"- {LABELS[c]}: " + "; ".join(x.split("tracehound: ")[-1] for x in st)
              for c, st in modes.items()]
    L += ["", "## Did they count?", "",
          "After each cost run the agent's `tracehound_io_{read,write}_requests_total` for the tmpfs and "
          "CEEMS's read/write accumulators for (fio's cgroup, the tmpfs path) were read; the tables give "
          "them as a share of fio's I/Os." + (
              f" bpftrace's `@calls` for the tmpfs over its whole first session: "
              f"{bt['counted']['read']:,} of {bt['fio']['read']:,} reads and {bt['counted']['write']:,} "
              f"of {bt['fio']['write']:,} writes." if bt else "")]
    ceems = res["counts"].get("ceems", {})
    if ceems:
        L += ["", "CEEMS, per workload (calls in its maps next to fio's I/Os): " + "; ".join(
            f"{w} {c['counted']['read'] + c['counted']['write']:,} of {c['fio']['ios']:,}"
            for w, c in ceems.items()) + "."]
        c0 = cfg["ceems"]
        L += ["", f"CEEMS was built with `{c0.get('make')}` ({c0.get('clang')}) in a copy of its source; "
              f"`{c0.get('object')}` is the object its exporter picks for this kernel. It was loaded and "
              "attached through tracehound's libbpf layer, with `conf_map` set as the exporter sets it "
              "on cgroup v2 (fs magic CGROUP2_SUPER_MAGIC, so bpf_get_current_cgroup_id()); fio runs in a "
              "child cgroup because CEEMS drops the root cgroup's I/O."]
    L += ["", "## Method", "",
          "One VM boot. Each condition is started fresh for each round and stopped after it; the order "
          "rotates every round. "
          + ("In its first round" if n_cost == 1 else f"In each of its first {n_cost} rounds")
          + " a condition is measured with `kernel.bpf_stats_enabled=1`: per workload one fio run, "
          "and once fio moves data, a window of "
          f"{cfg['window']:g} s over which run_time_ns and run_cnt of the programs the process holds "
          "(their fds' /proc/PID/fdinfo) and fio's read/write syscalls (/proc/PID/io) are diffed, so "
          "fio's start-up and exit stay out. Then, like every round, one fio run of all workloads back to "
          "back with bpf_stats off gives throughput. fio runs with `--thread --clocksource=cpu`, pinned "
          "to the last vCPU, in a child cgroup: the emulated machine has no TSC clocksource, so fio's "
          "default clock would make several clock_gettime syscalls per I/O that the tracepoint hooks "
          "would be charged for and a real machine does not make (vDSO). Programs fire for every "
          "process, so other syscalls during a window are charged to fio's I/Os: more so for the "
          "tracepoint hooks, which see every syscall (program runs per syscall shows it). bpf_stats "
          "measures the program body only, not the trampoline or tracepoint dispatch; the empty-hook "
          "conditions show what it reports for doing nothing on those hooks. Under emulation a program "
          "that runs right after a 1 MiB copy measures several times slower than after a 4 KiB one, "
          "the empty programs too, and the more memory a program touches the more so (most likely "
          "QEMU's software TLB being refilled): compare tools within a workload, and read the 1 MiB "
          "ratios as an emulation's, not a real CPU's.", ""]
    return "\n".join(L)


def plot(path: Path, s: dict, skipped: dict) -> bool:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    ws = list(s)
    conds = [c for c in LABELS if c != "baseline" and c not in skipped and any(c in s[w] for w in ws)]
    # ratios to tracepoint mode where it ran, else to CEEMS
    key, ref = ("vs_tracepoint", "tracehound tracepoint mode") if any(
        s[w].get(REF, {}).get("vs_tracepoint") for w in ws) else ("vs_ceems", "CEEMS")
    fig, axes = plt.subplots(1, 2, figsize=(14, 0.45 * len(conds) * len(ws) / 2 + 3))
    h = 0.8 / max(len(ws), 1)
    for i, w in enumerate(ws):
        ys = [k + i * h for k in range(len(conds))]
        r = [s[w].get(c, {}).get(key) or 0 for c in conds]
        axes[0].barh(ys, r, height=h, label=w)
        loss = [s[w].get(c, {}).get("loss_pct") or 0 for c in conds]
        paired = [s[w].get(c, {}).get("paired_loss_pct") or [0, 0, 0] for c in conds]
        err = [[max(x - p[1], 0) for x, p in zip(loss, paired)],
               [max(p[2] - x, 0) for x, p in zip(loss, paired)]]
        axes[1].barh(ys, loss, height=h, label=w, xerr=err, error_kw={"lw": 0.8, "alpha": 0.6})
    for ax in axes:
        ax.set_yticks([k + 0.4 - h / 2 for k in range(len(conds))], [LABELS[c] for c in conds])
        ax.invert_yaxis()
        ax.grid(axis="x", alpha=0.3)
    target = FENTRY_VS_TP if key == "vs_tracepoint" else FENTRY_VS_CEEMS
    axes[0].axvline(target, color="k", ls="--", lw=1, label=f"fentry target {target:.0%}")
    axes[0].set_title(f"BPF ns per I/O syscall ÷ {ref}")
    axes[1].set_title("throughput loss vs no tracing (%), bars: paired min … max")
    axes[1].set_yticklabels([])
    axes[0].legend(fontsize=8)
    fig.suptitle("Debian 6.1 under emulation: ratios within one run")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def write_reports(out: Path, res: dict) -> list[tuple[str, str, bool | None]]:
    out.mkdir(parents=True, exist_ok=True)
    s = summarize(res)
    verdict = verdicts(res, s)
    res = dict(res, summary=s, targets=[{"target": t, "measured": m, "met": ok} for t, m, ok in verdict])
    (out / "vm-modes.json").write_text(json.dumps(res, indent=1) + "\n")
    md = markdown(res, s, verdict)
    if plot(out / "vm-modes.png", s, res["skipped"]):
        md += "\n![ratios](vm-modes.png)\n"
    (out / "vm-modes.md").write_text(md)
    return verdict
