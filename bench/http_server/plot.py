"""The report's figure: each crowd's scrape p99 and the server's peak threads."""
from __future__ import annotations

from pathlib import Path

NAMES = {"agent": "agent (exporter/http.py)", "library": "prometheus_client (wsgiref)"}
SERVERS = tuple(NAMES)


def plot(s: dict, path: Path) -> Path | None:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        import matplotlib.ticker
    except ImportError:
        return None
    conds = list(s["beside"])
    x = range(len(conds))
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.6))
    for ax, field, title in ((axes[0], "steady_p99_ms", "scrape p99 beside them (ms)"),
                             (axes[1], "threads_peak", "server threads, peak")):
        for i, srv in enumerate(SERVERS):
            vals = [s["beside"][c][srv][field] or 0 for c in conds]
            ax.bar([j + (i - 0.5) * 0.4 for j in x], vals, 0.4, label=NAMES[srv])
        if field == "threads_peak":
            ax.set_yscale("log")
            ax.yaxis.set_major_formatter(matplotlib.ticker.ScalarFormatter())
        ax.set_ylim(bottom=1 if field == "threads_peak" else 0)
        ax.set_xticks(list(x))
        ax.set_xticklabels([c.replace("/", "\n") for c in conds], fontsize=7)
        ax.set_title(title, fontsize=9)
    axes[0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path
