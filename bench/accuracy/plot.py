"""The plot of bench/accuracy's report (matplotlib)."""
from __future__ import annotations

from bench.accuracy.report import MiB, SKIP_S


def plot(path: str, res: dict, phases: list[dict]) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    n = len(phases)
    cols = 2 if n > 1 else 1
    rows = (n + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(7 * cols, 3.2 * rows), squeeze=False)
    for ax, p in zip([a for r in axes for a in r], phases):
        ax.set_title(f"{p['name']} ({p['metric'].replace('tracehound_io_', '')})", fontsize=10)
        if "w0" not in p:
            ax.text(0.5, 0.5, "fio logged nothing", ha="center", transform=ax.transAxes)
            continue
        w0 = p["w0"]
        xs, ys = [], []
        for ws, we, r in p["windows"]:
            xs += [ws - w0, we - w0]
            ys += [r / MiB, r / MiB]
        ax.plot(xs, ys, color="black", lw=2, label="fio bw log")
        for src, color, style in (("agent", "#2a7", "-"), ("prometheus", "#d62", "--")):
            rs = p.get(f"{src}_all", [])
            if rs:
                ax.hlines([r["rate"] / MiB for r in rs], [r["from"] - w0 for r in rs],
                          [r["to"] - w0 for r in rs], colors=color, linestyles=style, lw=1.6,
                          label="agent (1 s readings)" if src == "agent" else "Prometheus")
        ax.axvspan(min(xs) - 2, min(xs) + SKIP_S, color="#ddd", zorder=0)
        ax.axvspan(max(xs) - SKIP_S, max(xs) + 3, color="#ddd", zorder=0)
        ax.set_xlim(min(xs) - 1.5, max(xs) + 2.5)
        ax.set_xlabel("s since fio's first logged second")
        ax.set_ylabel("MiB/s")
        ax.legend(fontsize=7, loc="lower center")
    for ax in [a for r in axes for a in r][n:]:
        ax.axis("off")
    fig.suptitle("Per-second rate: fio vs tracehound (grey: not compared)", fontsize=11)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


# ---------------------------------------------------------------- output
