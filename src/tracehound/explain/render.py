"""explain's answer as text for a person, or JSON for a program."""
from __future__ import annotations

import datetime
import json
import time

from ..printable import escaped
from . import timeline
from .answer import Answer


def _when(t: float | None) -> str:
    if t is None:
        return ""
    return " since " + datetime.datetime.fromtimestamp(t).strftime("%H:%M:%S")


def _bytes(n: float | None) -> str:
    if n is None:
        return "-"
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"


def _cpu(seconds: float | None) -> str:
    # the job's own cgroup only: where Slurm's v1 layout leaves its
    # processes at the v2 root, there is none
    return "-" if seconds is None else f"{seconds:.1f} s"


def text(answer: Answer, url: str, with_timeline: bool = True) -> str:
    # node names, mounts and devices come from the node, where any user names
    # a cgroup or a mount: escaped, they cannot drive the terminal
    return "\n".join(escaped(line) for line in _lines(answer, url, with_timeline))


def _span(answer: Answer) -> str:
    """The time judged, and who said it was the job's."""
    if answer.start is None:
        return "not known to Slurm or in any series"
    until = "now" if answer.running else _clock(answer.end)
    said = {"slurm": "as Slurm says", "series": "as the job's series say"}.get(
        answer.span_source, f"the last {answer.window}")
    return f"{_clock(answer.start)} to {until} ({said})"


def _clock(t: float | None) -> str:
    if t is None:
        return "?"
    when = datetime.datetime.fromtimestamp(t)
    return when.strftime("%H:%M:%S" if abs(time.time() - t) < 86400 else "%Y-%m-%d %H:%M:%S")


def _lines(answer: Answer, url: str, with_timeline: bool) -> list[str]:
    when = (_span(answer) if answer.mode == "fleet" else
            f"over its life on this node (GPU XIDs: {_span(answer)})")
    head = (f"job {answer.job}: " + (f"{len(answer.nodes)} node(s) ({', '.join(answer.nodes)})"
                                     if answer.nodes else "no node has series of it")
            + f", {when}, asked {url} ({answer.queries} queries, {answer.seconds:.2f} s)")
    if not answer.nodes:
        return [head, "nothing known: the job ran nowhere an agent watched in that time"]
    lines = [head]
    for node in answer.nodes:
        did = answer.activity.get(node, {})
        lines.append(f"  {node}: read {_bytes(did.get('read_bytes'))}, wrote "
                     f"{_bytes(did.get('write_bytes'))}, CPU {_cpu(did.get('cpu_seconds'))}")
    if answer.timeline and with_timeline:
        lines += timeline.draw(answer.timeline, answer.timeline_start, answer.timeline_step,
                               answer.findings)
    if answer.mode == "node":
        lines.append("  (one node alone: a node unlike the job's others needs --prometheus)")
    if answer.ended_by:
        lines.append(f"  ended: {answer.ended_by}")
    for b in answer.blind:
        lines.append(f"  blind in part: {b['node']}: {b['says']}")
    if not answer.findings:
        return lines + ["nothing judged abnormal, but the agents lost data (above): not a clean "
                        "bill" if answer.blind else "nothing abnormal"]
    for i, f in enumerate(answer.findings, 1):
        # an outlier's own words say how it compares with the job's other nodes
        lines.append(f"{i}. [{f.severity}] {f.node}: {f.says}{_when(f.since)}")
        lines.append(f"   what to do: {f.action}")
    return lines


def as_json(answer: Answer) -> str:
    return json.dumps(answer.to_json(), indent=2, sort_keys=True)
