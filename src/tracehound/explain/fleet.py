"""Fleet mode: every rule asked of the fleet's Prometheus for one job.

One query finds the job's nodes (any tracehound series labelled with the
job over the window), one per rule answers for all of them at once, and one
range query per rule that holds says since when. A job on 3 nodes costs
about a dozen queries, whatever its number of cgroups.
"""
from __future__ import annotations

import re
import statistics
import time

from ..clients import prometheus
from .answer import (JOB_ID, PRESENCE, Answer, ExplainError, Finding, judged, rank, seconds,
                     valid_window)
from . import timeline
from .rules import RULES, Rule, compared, fill, grew

# what the job did on each node over the window. CPU is the job's own cgroup
# only (step=""): it is exported at job, step and task level as well, and a
# sum over them would count each CPU second up to three times
ACTIVITY = {
    "read_bytes": "sum by ({by}) (" + grew("tracehound_io_read_bytes_total", "{job}") + ")",
    "write_bytes": "sum by ({by}) (" + grew("tracehound_io_write_bytes_total", "{job}") + ")",
    "cpu_seconds": "sum by ({by}) (" + grew("tracehound_cgroup_cpu_seconds_total",
                                             '{job},step=""') + ")",
}


class Asker:
    """The Prometheus client, counting its questions."""

    def __init__(self, url: str, timeout: float = 10.0):
        self.url, self.timeout, self.count = url, timeout, 0

    def now(self, promql: str) -> list:
        self.count += 1
        return prometheus.query(self.url, promql, timeout=self.timeout)

    def over(self, promql: str, start: float, end: float, step: float) -> list:
        self.count += 1
        return prometheus.query_range(self.url, promql, start, end, step, timeout=self.timeout)


def explain(url: str, job: str, window: str = "15m", node_label: str = "instance",
            with_timeline: bool = False) -> Answer:
    if not JOB_ID.match(job):
        raise ExplainError(f"{job!r} is not a Slurm job id (digits)")
    valid_window(window)
    if not re.fullmatch(r"[a-zA-Z_][a-zA-Z0-9_]*", node_label):
        raise ExplainError(f"--node-label {node_label!r} is not a label name")
    started = time.monotonic()
    ask = Asker(url)
    job_sel = f'job_id="{job}"'
    try:
        nodes = _nodes(ask, job_sel, window, node_label)
        answer = Answer(job, window, nodes)
        if nodes:
            node_sel = f"{node_label}=~{prometheus.regex_literal(*nodes)}"
            answer.activity = _activity(ask, job_sel, window, node_label)
            for rule in RULES:
                answer.findings += _judge(ask, rule, job_sel, node_sel, window, node_label,
                                          alone=len(nodes) == 1)
            answer.findings = _after_the_job_came(ask, answer.findings, job_sel, window,
                                                  node_label)
            if with_timeline:
                _timeline(ask, answer, job_sel, node_sel, window, node_label)
    except prometheus.PrometheusError as exc:
        raise ExplainError(str(exc)) from None
    answer.findings.sort(key=rank)
    answer.queries, answer.seconds = ask.count, round(time.monotonic() - started, 3)
    return answer


def _timeline(ask: Asker, answer: Answer, job_sel: str, node_sel: str, window: str,
              label: str) -> None:
    end = time.time()
    span = seconds(window)
    step = timeline.step_of(span)
    start = end - (timeline.COLUMNS - 1) * step
    answer.timeline_start, answer.timeline_step = start, step
    for signal in timeline.SIGNALS:
        series = ask.over(timeline.query(signal, job_sel, node_sel, label, step), start, end, step)
        answer.timeline[signal] = timeline.collect(series, start, step, label)


def _after_the_job_came(ask: Asker, findings: list[Finding], job_sel: str, window: str,
                        label: str) -> list[Finding]:
    """An XID is an event of its GPU's node: one logged before the job came to
    that node is not the job's. Its `since` (when the count first grew, to the
    range query's step) is set against the first step the job's series showed
    there; one range query, asked only when there is an XID to judge. (A node's
    condition that began earlier and still holds is the job's: not judged.)"""
    xids = [f for f in findings if f.rule == "gpu_xid" and f.since is not None]
    if not xids:
        return findings
    end = time.time()
    span = seconds(window)
    step = max(span / 120, 1.0)
    presence = " or ".join(f"group by ({label}) ({m}{{{job_sel}}})" for m in PRESENCE)
    came: dict[str, float] = {}
    for labels, points in ask.over(presence, end - span, end, step):
        seen = [t for t, v in points if v == v]
        if seen:
            node = labels.get(label, "?")
            came[node] = min(came.get(node, seen[0]), seen[0])
    early = {id(f) for f in xids if f.node in came and f.since < came[f.node]}
    return [f for f in findings if id(f) not in early]


def _nodes(ask: Asker, job_sel: str, window: str, label: str) -> list[str]:
    parts = [f"group by ({label}) (last_over_time({m}{{{job_sel}}}[{window}]))"
             for m in PRESENCE]
    return sorted({s.labels.get(label, "") for s in ask.now(" or ".join(parts))} - {""})


def _activity(ask: Asker, job_sel: str, window: str, label: str) -> dict:
    out: dict[str, dict[str, float]] = {}
    for name, expr in ACTIVITY.items():
        for s in ask.now(fill(expr, job=job_sel, by=label, window=window)):
            out.setdefault(s.labels.get(label, "?"), {})[name] = round(s.value, 3)
    return out


def _judge(ask: Asker, rule: Rule, job_sel: str, node_sel: str, window: str,
           label: str, alone: bool) -> list[Finding]:
    by = ", ".join((label, *rule.by))
    promql = fill(rule.expr, job=job_sel if rule.job_labelled else node_sel,
                  node=node_sel, window=window, by=by)
    rows = [(s.labels, s.value) for s in ask.now(promql) if s.value == s.value]   # not NaN
    if rule.kind == "grew":
        held = [(labels, value, None) for labels, value in rows if value > 0]
    else:
        held = outliers(rule, rows, label, alone)
    if not held:
        return []
    since = _since(ask, promql, window, label, rule, alone)
    out = []
    for labels, value, ratio in held:
        node = labels.get(label, "?")
        key = (node, *(labels.get(k, "") for k in rule.by))
        words = {k: labels.get(k, "") for k in rule.by}
        severity, action, more = judged(rule, words)
        says = rule.says.format(value=value, value_s=f"{value * 1000:.1f} ms",
                                compared=compared(ratio), **words, **more)
        out.append(Finding(rule.name, severity, node, words, round(value, 6), says, action,
                           since.get(key), outlier=ratio is not None))
    return out


def outliers(rule: Rule, rows, label: str,
             alone: bool) -> list[tuple[dict, float, float | None]]:
    """A node well above the job's other nodes (same mount, same cause).
    A job on one node (ALONE) has no yardstick: only a value far above the
    floor is a finding. A job on several nodes is judged only against them:
    where no other node has a value yet (a mean latency needs two scrapes,
    and a node's first one lands before its neighbours' second), a lone
    value is no finding."""
    groups: dict[tuple, list] = {}
    for labels, value in rows:
        groups.setdefault(tuple(labels.get(k, "") for k in rule.by), []).append((labels, value))
    out = []
    for members in groups.values():
        for labels, value in members:
            others = [v for lb, v in members if lb.get(label) != labels.get(label)]
            if value <= rule.floor:
                continue
            if not others:
                if alone and value > rule.floor * rule.factor:
                    out.append((labels, value, None))
                continue
            median = statistics.median(others)
            if value > rule.factor * max(median, rule.floor / rule.factor):
                out.append((labels, value, value / median if median > 0 else float("inf")))
    return out


def _since(ask: Asker, promql: str, window: str, label: str, rule: Rule,
           alone: bool) -> dict:
    """(node, *by) -> when the rule first held in the window: a count first
    above zero; a node first an outlier among the job's nodes at that time
    (a mean latency is above zero all along: what counts is when it parted
    from the others')."""
    end = time.time()
    span = seconds(window)
    step = max(span / 120, 1.0)
    at: dict[float, list] = {}
    for labels, points in ask.over(promql, end - span, end, step):
        for t, v in points:
            if v == v:          # not NaN
                at.setdefault(t, []).append((labels, v))
    first: dict[tuple, float] = {}
    for t in sorted(at):
        rows = at[t]
        held = ([(lb, v, None) for lb, v in rows if v > 0] if rule.kind == "grew"
                else outliers(rule, rows, label, alone))
        for labels, _v, _r in held:
            first.setdefault((labels.get(label, "?"), *(labels.get(k, "") for k in rule.by)), t)
    return first
