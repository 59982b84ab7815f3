"""The job's signals over the window, per node, for `explain --timeline`: one
range query per signal for all the job's nodes, drawn as a row of blocks
per node with the findings marked where they began.

Every node's row of one signal shares one scale, so the node unlike the
others stands out (a throttled rank's latency row is high where the others
are flat). A step with no sample is a blank, not a zero.
"""
from __future__ import annotations

import datetime
import re

from .answer import Finding
from .rules import mean_latency

# name -> (PromQL, what one unit is); JOB (the job's series), NODE (the
# series of the job's nodes), BY and RANGE are filled in per question
SIGNALS = {
    "write": ("sum by (BY) (rate(tracehound_io_write_bytes_total{JOB}[RANGE]))", "B/s"),
    "read": ("sum by (BY) (rate(tracehound_io_read_bytes_total{JOB}[RANGE]))", "B/s"),
    "write latency": (mean_latency("tracehound_io_write_latency_seconds", "JOB", "RANGE")
                      .replace("{by}", "BY"), "s"),
    # the node's, every socket's: see the node_tcp_retransmits rule
    "node retransmits": ("sum by (BY) (rate(tracehound_net_node_tcp_retransmitted_segments_total"
                         "{NODE}[RANGE]))", "/s"),
    "stopped": ('sum by (BY) (tracehound_cgroup_processes{JOB,state="stopped"})', ""),
}
COLUMNS = 60
BLOCKS = " ▁▂▃▄▅▆▇█"


def step_of(span: float) -> float:
    """Seconds per column: the window in COLUMNS steps, at least 1 s."""
    return max(span / COLUMNS, 1.0)


def query(signal: str, job_sel: str, node_sel: str, label: str, step: float) -> str:
    expr, _unit = SIGNALS[signal]
    # a rate needs two samples in its range: twice the step, at least 30 s
    rng = f"{max(int(2 * step), 30)}s"
    values = {"JOB": job_sel, "NODE": node_sel, "BY": label, "RANGE": rng}
    # one pass: a label named RANGE must not be filled in again
    return re.sub(r"\b(JOB|NODE|BY|RANGE)\b", lambda m: values[m.group(1)], expr)


def collect(series, start: float, step: float, label: str) -> dict[str, list]:
    """node -> its values, one per column (None where there is no sample)."""
    out: dict[str, list] = {}
    for labels, points in series:
        row = out.setdefault(labels.get(label, "?"), [None] * COLUMNS)
        for t, v in points:
            col = int(round((t - start) / step))
            if 0 <= col < COLUMNS and v == v:       # not NaN
                row[col] = v
    return out


def bar(values: list, top: float) -> str:
    """One row: a blank where there is no sample, the lowest block for zero,
    and seven levels up to `top` (the signal's highest over all nodes)."""
    out = []
    for v in values:
        if v is None:
            out.append(" ")
        elif v <= 0 or top <= 0:
            out.append(BLOCKS[1])
        else:
            out.append(BLOCKS[2 + min(6, int(v / top * 6 + 0.5))])
    return "".join(out)


def draw(timeline: dict, start: float, step: float, findings: list[Finding]) -> list[str]:
    """The rows: per signal that moved, per node, then the findings' marks
    (their rank's number) on a row of their own."""
    nodes = sorted({n for rows in timeline.values() for n in rows})
    width = max([len(n) for n in nodes] + [4])
    first = datetime.datetime.fromtimestamp(start).strftime("%H:%M:%S")
    lines = [f"timeline from {first}, {step:g} s per column; marks: where a finding began"]
    for signal, rows in timeline.items():
        top = max((v for row in rows.values() for v in row if v is not None), default=0.0)
        if top <= 0:
            continue                # flat everywhere: nothing to see
        unit = SIGNALS[signal][1]
        lines.append(f"  {signal} (top {_amount(top, unit)})")
        for node in nodes:
            if node in rows:
                lines.append(f"    {node:<{width}} |{bar(rows[node], top)}|")
    marks = [" "] * COLUMNS
    for i, f in enumerate(findings, 1):
        if f.since is not None:
            col = int(round((f.since - start) / step))
            if 0 <= col < COLUMNS:
                marks[col] = str(i) if i < 10 else "+"
    if any(m != " " for m in marks):
        lines.append(f"    {'':<{width}}  {''.join(marks)}".rstrip())
    return lines


def _amount(value: float, unit: str) -> str:
    if unit == "B/s":
        for u in ("B/s", "KiB/s", "MiB/s", "GiB/s"):
            if value < 1024 or u == "GiB/s":
                return f"{value:.0f} {u}" if u == "B/s" else f"{value:.1f} {u}"
            value /= 1024
    if unit == "s":
        return f"{value * 1000:.1f} ms"
    return f"{value:g}{unit}"
