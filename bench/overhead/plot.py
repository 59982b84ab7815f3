"""overhead.png for bench/overhead: per workload, throughput per condition
(top) and BPF run time per I/O syscall (bottom)."""
from __future__ import annotations

from pathlib import Path

from bench.overhead.report import LABELS, MAIN, TARGET_NET_NS, WORKLOADS, scale

COLORS = {"baseline": "#666", "tracehound": "#2a7", "tracehound-every": "#175",
          "tracehound-latoff": "#9d8", "tracehound-gap1s": "#5b9",
          "empty": "#89b", "empty-exit": "#bcd", "bpftrace": "#c64"}
SHORT = {"baseline": "baseline", "tracehound": "th\nsampled", "tracehound-every": "th\nevery",
         "tracehound-latoff": "th\nlat off", "tracehound-gap1s": "th\n1 s gap",
         "empty": "empty\n×2", "empty-exit": "empty\nexit", "bpftrace": "bpftrace"}


def plot(path: Path, res: dict) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker

    tp, cs, a = res["throughput"], res["cost"], res["settings"]
    conds = a["conditions"]
    wls = list(tp)
    fig, axes = plt.subplots(2, len(wls), figsize=(4.6 * len(wls) + 1, 8.5), squeeze=False)
    for i, w in enumerate(wls):
        ax, k = axes[0][i], scale(w)
        t = tp[w]
        med = [t[c]["median"] * k for c in conds]
        err = [[m - t[c]["min"] * k for m, c in zip(med, conds)],
               [t[c]["max"] * k - m for m, c in zip(med, conds)]]
        b = t["baseline"]
        # the baseline's own min–max: a bar whose top lies inside the band is
        # within run-to-run noise
        ax.axhspan(b["min"] * k, b["max"] * k, color="#888", alpha=0.18, lw=0, label="baseline min–max")
        bars = ax.bar([SHORT[c] for c in conds], med, yerr=err, capsize=4, color=[COLORS[c] for c in conds],
                      edgecolor="k", lw=0.5)
        for bar, c in zip(bars, conds):
            if c != "baseline":  # above the error bar, which may reach past the bar
                ax.annotate(f"{-t[c]['loss_pct']:+.1f} %", (bar.get_x() + bar.get_width() / 2, t[c]["max"] * k),
                            ha="center", va="bottom", xytext=(0, 3), textcoords="offset points", fontsize=8)
        lo = min(t[c]["min"] for c in conds) * k
        ax.set_ylim(lo * 0.85 if w != MAIN else 0, max(t[c]["max"] for c in conds) * k * 1.08)
        ax.set_ylabel(f"{WORKLOADS[w]['unit']} (median, min–max)")
        ax.set_title(f"fio {WORKLOADS[w]['title']}, tmpfs, psync", fontsize=10)
        if WORKLOADS[w]["unit"] == "IOPS":
            ax.yaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda v, _: f"{v / 1e3:.0f}k"))
        ax.tick_params(axis="x", labelsize=8)
        ax.legend(fontsize=7, loc="lower left")

        ax = axes[1][i]
        tools = [c for c in conds if c != "baseline"]
        raw = [cs[c]["workloads"][w]["ns_per_io"] for c in tools]
        net = [cs[c]["workloads"][w].get("net_ns_per_io", 0.0) for c in tools]
        ax.bar([SHORT[c] for c in tools], raw, color=[COLORS[c] for c in tools], edgecolor="k", lw=0.5,
               label="measured")
        ax.bar([SHORT[c] for c in tools], net, color="none", edgecolor="k", hatch="//",
               label="net of empty-hook floor")
        if w == MAIN:
            ax.axhline(TARGET_NET_NS, ls="--", color="k", lw=1, label=f"target, net: {TARGET_NET_NS:g} ns")
        ax.set_ylabel("BPF run time per I/O syscall (ns)")
        ax.set_title("kernel bpf_stats", fontsize=10)
        ax.tick_params(axis="x", labelsize=8)
        ax.legend(fontsize=7)
    names = ", ".join(f"{SHORT[c].replace(chr(10), ' ')} = {LABELS[c]}" for c in conds if c != "baseline")
    fig.suptitle(f"tracehound overhead — {res['machine']['kernel']}, {res['machine']['date'][:10]}, "
                 f"{a['rounds']} rounds{', quick' if a['quick'] else ''}\n{names}", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
