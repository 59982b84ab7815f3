"""The fleet report on disk: fleet.json, fleet.md and fleet.png."""
from __future__ import annotations

import json
import os


def _s(value) -> str:
    return "—" if value is None else f"{value:.2f} s"


def _rate(row: dict) -> str:
    if not row["asked"]:
        return "not asked"
    return f"{row['detected']}/{row['asked']}"


def _cell(text) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")[:160]


def markdown(fleet: dict, plot: str | None, plot_note: str) -> str:
    plan = fleet["plan"]
    lines = [f"# Fleet chaos: {fleet['title']}", "",
             f"- run `{fleet['run_id']}`, experiment `{fleet['experiment']}`",
             f"- status: **{fleet['status']}**"
             + (f" ({fleet['stop_reason']})" if fleet.get("stop_reason") else ""),
             f"- selection: {plan['how']}"
             + (f" (seed {plan['seed']})" if plan.get("seed") is not None else "")
             + (f", job {plan['job_id']}" if plan.get("job_id") else "")
             + f", partition {plan['partition']}: {len(plan['nodes'])} of "
               f"{plan['partition_size']} nodes ({plan['share']:.0%})",
             f"- **landed on {len(fleet['landed'])} of {len(plan['nodes'])}** nodes: "
             + (", ".join(fleet["landed"]) or "none"),
             "- detection per instance: "
             + (f"{fleet['prometheus']} (label `{fleet['node_label']}`)" if fleet["prometheus"]
                else "not asked (no --prometheus)"),
             f"- fleet journal: `{fleet['fleet_journal']}`", ""]
    if plan.get("skipped"):
        lines += ["Not taken: " + "; ".join(f"{n}: {why}" for n, why in plan["skipped"].items()),
                  ""]
    lines += ["## Per fault", "",
              "| fault | landed | agent detected | agent MTTD p50 / p95 / max | "
              "Prometheus detected | Prometheus MTTD p50 / p95 / max |",
              "|---|---|---|---|---|---|"]
    for row in fleet["summary"]:
        a, p = row["agent"], row["prometheus"]
        lines.append(f"| {row['fault']} | {row['landed']} | {_rate(a)} | "
                     f"{_s(a['mttd_p50'])} / {_s(a['mttd_p95'])} / {_s(a['mttd_max'])} | "
                     f"{_rate(p)} | {_s(p['mttd_p50'])} / {_s(p['mttd_p95'])} / "
                     f"{_s(p['mttd_max'])} |")
    lines += ["", "## Per node", "",
              "| node | status | fault | rolled back | agent: detected (MTTD) | "
              "Prometheus: detected (MTTD) | why / note |", "|---|---|---|---|---|---|---|"]
    for node, info in fleet["nodes"].items():
        if not info["faults"]:
            lines.append(f"| {node} | {_cell(info['status'])} | — | — | — | — | "
                         f"{_cell(info.get('why', ''))} |")
        for f in info["faults"]:
            agent = [d for d in info["detections"] if d.get("action") == f["action"]]
            prom = [d for d in info.get("prometheus", []) if d.get("action") == f["action"]]
            lines.append(
                f"| {node} | {_cell(info['status'])} | {f['fault']} | {f['rolled_back']} | "
                + ("; ".join(f"{'yes' if d['detected'] else 'NO'} ({_s(d['mttd_seconds'])})"
                             for d in agent) or "not asked") + " | "
                + ("; ".join(f"{'yes' if d['detected'] else 'NO'} ({_s(d['mttd_seconds'])})"
                             for d in prom) or "not asked") + " | "
                + _cell("; ".join(d["note"] for d in prom if d.get("note"))) + " |")
    lines += ["", f"![timeline]({plot})" if plot else f"No plot: {plot_note}.", ""]
    return "\n".join(lines)


def _plot(fleet: dict, path: str) -> tuple[str | None, str]:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None, "matplotlib is not installed (pip install 'tracehound[bench]')"
    nodes = list(fleet["nodes"])
    t0 = fleet["start"]
    fig, ax = plt.subplots(figsize=(9, 1.2 + 0.5 * len(nodes)))
    for y, node in enumerate(nodes):
        info = fleet["nodes"][node]
        for f in info["faults"]:
            if f["applied_wall"] is None:
                continue
            end = f["rolled_back_wall"] or fleet["end"]
            ax.barh(y, end - f["applied_wall"], left=f["applied_wall"] - t0, height=0.4,
                    color="#f4a261")
            for d, marker, colour in [(d, "o", "#2a9d8f") for d in info["detections"]] + \
                    [(d, "D", "#264653") for d in info.get("prometheus", [])]:
                if d.get("action") == f["action"] and d.get("detected"):
                    ax.plot(f["applied_wall"] - t0 + d["mttd_seconds"], y, marker, color=colour)
        if not info["faults"]:
            ax.text(0, y, f"  {info.get('why', info['status'])}", va="center", fontsize=8)
    ax.set_yticks(range(len(nodes)), nodes)
    ax.set_xlabel("seconds since the fleet run started (bar: fault in place; "
                  "o: node's agent saw it; ◆: Prometheus saw it on that instance)")
    ax.set_title(fleet["title"])
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path, ""


def write(fleet: dict, report_dir: str, plot: bool = True) -> dict[str, str]:
    os.makedirs(report_dir, exist_ok=True)
    paths = {"json": os.path.join(report_dir, "fleet.json"),
             "markdown": os.path.join(report_dir, "fleet.md")}
    with open(paths["json"], "w") as f:
        json.dump(fleet, f, indent=2, sort_keys=True, default=str)
    png, note = _plot(fleet, os.path.join(report_dir, "fleet.png")) if plot else \
        (None, "not requested (--no-plot)")
    if png:
        paths["plot"] = png
    with open(paths["markdown"], "w") as f:
        f.write(markdown(fleet, os.path.basename(png) if png else None, note))
    return paths
