"""The run's report: a JSON journal of everything that happened, a readable
Markdown summary, each detection's signal against its threshold (an SVG,
signal_svg.py) and a timeline plot when matplotlib is installed."""
from __future__ import annotations

import json
import os
import re

from . import signal_svg


def slug(title: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", title.lower()).strip("-")[:60] or "experiment"


# the longest text of an activity's output the JSON journal keeps: a probe of
# /metrics answers a whole scrape, megabytes on a busy node, and the
# tolerance was judged on all of it before the journal is written
KEPT_CHARS = 2000


def _bounded(value):
    """value, with every text longer than KEPT_CHARS cut to its head and its length."""
    if isinstance(value, str) and len(value) > KEPT_CHARS:
        return f"{value[:KEPT_CHARS]}... ({len(value):,} characters; the rest is not kept)"
    if isinstance(value, dict):
        return {k: _bounded(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_bounded(v) for v in value]
    return value


def write(record: dict, directory: str, plot: bool = True) -> dict[str, str]:
    os.makedirs(directory, exist_ok=True)
    base = os.path.join(directory, f"{slug(record['title'])}-{record['run_id']}")
    paths = {"journal": base + "-journal.json", "markdown": base + ".md"}
    clean = _bounded({**record, "faults": [{k: v for k, v in f.items() if k != "monotonic"}
                                           for f in record["faults"]]})
    with open(paths["journal"], "w") as f:
        json.dump(clean, f, indent=2, sort_keys=True, default=str)
    signals = None
    if plot:
        plot, plot_note = _plot(record, base + "-timeline.png")
        # no plotting library: on every node, whatever is installed
        signals = signal_svg.draw(record["detections"], base + "-signals.svg")
    else:
        plot, plot_note = None, "not requested (--no-plot)"
    if plot:
        paths["plot"] = plot
    if signals:
        paths["signals"] = signals
    with open(paths["markdown"], "w") as f:
        f.write(markdown(record, os.path.basename(plot) if plot else None, plot_note,
                         os.path.basename(signals) if signals else None))
    return paths


def _yes(flag) -> str:
    return "yes" if flag else "no"


def _reading(value) -> str:
    """A probe's reading: "-" where there was none."""
    return "-" if value is None else _cell(value)


def _cell(value) -> str:
    if isinstance(value, float):
        value = float(f"{value:.4g}")
    text = json.dumps(value, default=str) if not isinstance(value, str) else value
    text = text.replace("|", "\\|").replace("\n", " ")
    return text if len(text) <= 120 else text[:117] + "..."


def _hypothesis(lines: list[str], label: str, state) -> None:
    if state is None:
        lines.append(f"- **{label}**: not checked")
        return
    lines.append(f"- **{label}**: {'met' if state['met'] else 'NOT met'}")
    for probe in state["probes"]:
        out = probe.get("output")
        if isinstance(out, dict) and "status" in out:
            out = {"status": out["status"]}
        shown = out if probe["status"] == "succeeded" else probe.get("error")
        verdict = "ok" if probe.get("tolerance_met") else "failed"
        lines.append(f"  - `{probe['name']}`: {verdict} (output {_cell(shown)})")


def markdown(record: dict, plot: str | None, plot_note: str,
             signals: str | None = None) -> str:
    lines = [f"# Chaos experiment: {record['title']}", "", record.get("description", ""), "",
             "| | |", "|---|---|",
             f"| status | **{record['status']}** |",
             f"| run | `{record['run_id']}` |",
             f"| started | {record['start']} |",
             f"| duration | {record['duration']} s |",
             f"| experiment file | `{record['source']}` |",
             f"| fault journal | `{record['journal']}` |", ""]
    if record.get("interrupted_by"):
        lines += [f"Interrupted by {record['interrupted_by']}; faults were rolled back.", ""]
    if record.get("aborted_because"):
        lines += [f"Method aborted: {record['aborted_because']}", ""]
    lines += ["## Steady state", ""]
    states = record["steady_states"]
    _hypothesis(lines, "before the method", states.get("before"))
    _hypothesis(lines, "after the method (faults still applied)", states.get("after"))
    _hypothesis(lines, "after rollback", states.get("after_rollback"))
    lines += ["", "## Faults", ""]
    if not record["faults"]:
        lines.append("No fault was applied.")
    else:
        lines += ["| action | fault | targets | applied at | rolled back at | rollback | "
                  "fault's own counters |", "|---|---|---|---|---|---|---|"]
        for f in record["faults"]:
            rb = f["rollback"]
            if f.get("rollback_note"):
                rb += f" ({f['rollback_note']})"
            if f.get("rollback_error"):
                rb += f": {f['rollback_error']}"
            lines.append(f"| {f['action']} | `{f['fault']}` | {_cell('; '.join(f['targets']))} "
                         f"| {f['applied_at']} s | {f['rolled_back_at']} s | {_cell(rb)} | "
                         f"{_cell(f.get('observed') or '')} |")
        for f in record["faults"]:
            for note in f.get("notes", []):
                lines.append(f"\n> {f['action']}: {note}")
    lines += ["", "## Detection", ""]
    if not record["detections"]:
        lines.append("No detection probe ran.")
    else:
        lines += ["| probe | fault | source | query | signal | detected | seen by tracehound "
                  "| MTTD | before the fault | under the fault (last) | note |",
                  "|---|---|---|---|---|---|---|---|---|---|---|"]
        for d in record["detections"]:
            mttd = f"{d['mttd_seconds']:.2f} s" if d["mttd_seconds"] is not None else "-"
            signal = f"{d['signal']} {d['predicate']}" if d.get("predicate") else d["signal"]
            note = d.get("note") or ""
            if d.get("event"):      # the agent's own event: what it saw, and when
                note += " event: " + ", ".join(f"{k}={v}" for k, v in d["event"].items()
                                               if k != "seq")
            lines.append(
                f"| {d['probe']} | `{d['fault']}` | {d['source']} | `{_cell(d['query'] or '-')}` "
                f"| {_cell(signal)} | **{_yes(d['detected'])}** | "
                f"{_yes(d['detected'] and d['tracehound_signal'])} | {mttd} | "
                f"{_reading(d.get('before'))} | {_reading(d['value'])} | "
                f"{_cell(note.strip())} |")
    if signals:
        lines += ["", f"![each signal against its threshold, and before the fault]({signals})"]
    lines += ["", "## Activities", "", "| phase | activity | provider | start | duration | "
              "status | output |", "|---|---|---|---|---|---|---|"]
    runs = [r for s in ("before", "after", "after_rollback") if states.get(s)
            for r in states[s]["probes"]] + record["runs"] + record["rollbacks"]
    for r in sorted(runs, key=lambda r: r["start"]):
        out = r.get("output") if r["status"] == "succeeded" else r.get("error")
        if isinstance(out, dict) and "samples" in out:
            out = {k: v for k, v in out.items() if k != "samples"}
        lines.append(f"| {r['phase']} | {r['name']} | {r['provider']} | {r['start']} s | "
                     f"{r['duration']} s | {r['status']} | {_cell(out)} |")
    lines += ["", "## Timeline", ""]
    lines.append(f"![timeline]({plot})" if plot else f"No plot: {plot_note}.")
    if record.get("rollback_failures"):
        lines += ["", f"**{record['rollback_failures']} rollback(s) FAILED**: run "
                  "`tracehound chaos recover` after fixing the cause."]
    return "\n".join(lines) + "\n"


def _plot(record: dict, path: str) -> tuple[str | None, str]:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None, "matplotlib is not installed (pip install 'tracehound[bench]')"
    acts = [e for e in record["timeline"] if e["kind"] == "activity"]
    rows = list(dict.fromkeys(e["name"] for e in acts))
    faults = record["faults"]
    fig, ax = plt.subplots(figsize=(10, 1.2 + 0.35 * (len(rows) + len(faults))))
    end = max([record["duration"]] + [e["t"] for e in record["timeline"]])
    labels = []
    y = 0
    for f in faults:
        stop = f["rolled_back_at"] if f["rolled_back_at"] is not None else end
        if f["applied_at"] is not None:
            ax.barh(y, stop - f["applied_at"], left=f["applied_at"], color="#d62728",
                    alpha=0.6)
        for d in record["detections"]:
            if d["action"] == f["action"] and d["mttd_seconds"] is not None:
                ax.plot(f["applied_at"] + d["mttd_seconds"], y, marker="v", color="black")
        labels.append(f"fault {f['action']}")
        y += 1
    for name in rows:
        for e in acts:
            if e["name"] == name:
                color = "#2ca02c" if e["status"] == "succeeded" else "#ff7f0e"
                ax.barh(y, max(e["end"] - e["start"], end / 400), left=e["start"],
                        color=color)
        labels.append(name)
        y += 1
    ax.set_yticks(range(len(labels)))
    ax.set_yticklabels(labels, fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("seconds since start (red: fault applied, v: detected)")
    ax.set_title(record["title"], fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path, ""
