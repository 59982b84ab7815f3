"""`explain --plot FILE.png`: the timeline as a picture, for a ticket or a
post-mortem. One panel per signal that moved, one line per node on a shared
scale, and each finding's onset as a numbered line across every panel.
Needs matplotlib (the `bench` extra); without it the answer says so and the
rest of it stands."""
from __future__ import annotations

import datetime

from . import timeline
from .answer import Answer, ExplainError


def _pyplot():
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise ExplainError("--plot needs matplotlib: pip install 'tracehound[bench]'") from None
    return plt


def write(answer: Answer, path: str) -> None:
    fig = figure(answer)
    fig.savefig(path, dpi=110)
    _pyplot().close(fig)


def figure(answer: Answer):
    """The picture, as a matplotlib figure (write saves it)."""
    plt = _pyplot()
    moved = {name: rows for name, rows in answer.timeline.items()
             if any(v for row in rows.values() for v in row if v is not None)}
    if not moved:
        raise ExplainError(f"--plot: job {answer.job} moved nothing in the window to draw")
    start, step = answer.timeline_start, answer.timeline_step
    times = [datetime.datetime.fromtimestamp(start + i * step) for i in range(timeline.COLUMNS)]
    fig, axes = plt.subplots(len(moved), 1, sharex=True, squeeze=False,
                             figsize=(10, 1.2 + 1.6 * len(moved)))
    for ax, (name, rows) in zip((a[0] for a in axes), moved.items()):
        for node, values in sorted(rows.items()):
            ax.plot(times, [float("nan") if v is None else v for v in values], label=node,
                    lw=1.2)
        ax.set_ylabel(f"{name}\n({timeline.SIGNALS[name][1] or 'count'})", fontsize=8)
        for i, f in enumerate(answer.findings, 1):
            if f.since is not None:
                ax.axvline(datetime.datetime.fromtimestamp(f.since), color="red", ls="--",
                           lw=0.8)
                ax.annotate(str(i), (datetime.datetime.fromtimestamp(f.since), 1.0),
                            xycoords=("data", "axes fraction"), color="red", fontsize=8,
                            va="top")
    axes[0][0].legend(fontsize=7, loc="upper left")
    top = answer.findings[0].says if answer.findings else "nothing abnormal"
    axes[0][0].set_title(f"job {answer.job}, last {answer.window}: 1. {top}"[:120], fontsize=9)
    fig.tight_layout()
    return fig
