"""Fleet mode: every rule asked of the fleet's Prometheus for one job.

When the job ran comes first (span.py: Slurm, else its series). Then one
query finds the job's nodes (the series span.py reads a job's presence from,
in that time), one per rule answers for all of them at once, over the job's
time (Over), one says where an agent lost data, and one range query per
rule that holds says since when. A job on 4 nodes costs about 20 queries,
whatever its number of cgroups.
"""
from __future__ import annotations

import math
import re
import statistics
import time
from dataclasses import replace

from ..clients import prometheus
from .answer import (JOB_ID, Answer, ExplainError, Finding, judged, rank, seconds,
                     valid_window)
from . import span, timeline
from .rules import AT, RULES, WIN, Rule, compared, fill, first_time, grew

SINCE_POINTS = 240              # a since's range query: the span in this many steps
SLURM_GRAIN_S = 1.0             # squeue and sacct say when in whole seconds
JOB_TAIL_S = 150.0              # the job's series after its end: exits retire 120 s after
# how a job is ended: Slurm's TERM, then its KILL KillWait later (30 s by default)
END_SIGNALS = ("TERM", "KILL")
END_BURST_S = 35.0
# Slurm's states of a job it (or a user through it) ended
ENDED_BY_SLURM = frozenset({"CANCELLED", "TIMEOUT", "PREEMPTED", "DEADLINE", "NODE_FAIL"})
TRAILING_MIN_S = 60             # a count's growth is looked for over at least this
FINE_STEP_S = 2.0               # a coarser since's step is refined (a job of over 8 min)
REFINE_MAX = 3                  # distinct since times refined per rule

# where an agent lost data it judges by, on the job's nodes over its span
# (PromQL with {node}, {by}, {window}, {at}), and how it is said
BLIND = {
    "map_full": ("sum by ({by}, map) (" + grew("tracehound_map_full_drops_total", "{node}")
                 + ")", "{value:g} updates lost: the agent's {map} map was full"),
    "series_folded": ("sum by ({by}, collector) (" + grew("tracehound_series_overflow_total",
                                                           "{node}") + ")",
                      "{value:g} label sets of the {collector} collector folded into "
                      "__overflow__ (--max-series)"),
    "walk_truncated": ("max by ({by}) (max_over_time(tracehound_pressure_cgroups_truncated{"
                       "{node}}[" + WIN + "]" + AT + "))",
                       "the cgroup walk stopped at --pressure-max-cgroups: stopped processes "
                       "and stalls may be missing"),
    "not_scraped": ("max by ({by}) (1 - min_over_time(up{{node}}[" + WIN + "]" + AT + "))",
                    "the agent was not scraped for part of the job (down, or unreachable)"),
}

# what the job did on each node over the window. CPU is the job's own cgroup
# only (step=""): it is exported at job, step and task level as well, and a
# sum over them would count each CPU second up to three times
ACTIVITY = {
    "read_bytes": "sum by ({by}) (" + grew("tracehound_io_read_bytes_total", "{job}") + ")",
    "write_bytes": "sum by ({by}) (" + grew("tracehound_io_write_bytes_total", "{job}") + ")",
    "cpu_seconds": "sum by ({by}) (" + grew("tracehound_cgroup_cpu_seconds_total",
                                             '{job},step=""') + ")",
}


def _scrape_interval(ask: "Asker", label: str, nodes: list[str]) -> float:
    """The longest scrape interval of the job's nodes' targets (0: unknown)."""
    try:
        intervals = ask.intervals()
    except prometheus.PrometheusError:
        return 0.0
    return max((s for labels, s in intervals if labels.get(label) in nodes), default=0.0)


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

    def intervals(self) -> list:
        self.count += 1
        return prometheus.target_intervals(self.url, timeout=self.timeout)


def explain(url: str, job: str, window: str | None = None, node_label: str = "node",
            with_timeline: bool = False, use_slurm: bool = True) -> Answer:
    """The job's answer over its own span (span.py): the rules judged from
    its start to its end, or now, cut to the last WINDOW where one is given."""
    if not JOB_ID.fullmatch(job):
        raise ExplainError(f"{job!r} is not a Slurm job id (digits)")
    window_s = seconds(valid_window(window)) if window is not None else None
    if not re.fullmatch(r"[a-zA-Z_][a-zA-Z0-9_]*", node_label):
        raise ExplainError(f"--node-label {node_label!r} is not a label name")
    started = time.monotonic()
    ask = Asker(url)
    job_sel = f'job_id="{job}"'
    try:
        found = span.of_job(ask, job, job_sel, window_s, use_slurm=use_slurm)
        answer = Answer(job, window or "its life", [])
        if found is not None:
            answer.start, answer.end, answer.span_source = found.start, found.end, found.source
            answer.running = found.running
            _judge_all(ask, answer, found, job_sel, node_label, with_timeline)
    except prometheus.PrometheusError as exc:
        raise ExplainError(str(exc)) from None
    answer.findings.sort(key=rank)
    answer.queries, answer.seconds = ask.count, round(time.monotonic() - started, 3)
    return answer


def _judge_all(ask: Asker, answer: Answer, found: span.Span, job_sel: str, label: str,
               with_timeline: bool) -> None:
    over = Over(found)
    answer.nodes = _nodes(ask, job_sel, over, label)
    if not answer.nodes:
        return
    if found.source == "slurm" and not found.running:
        over.last_scrape(_scrape_interval(ask, label, answer.nodes))
    node_sel = f"{label}=~{prometheus.regex_literal(*answer.nodes)}"
    answer.activity = _activity(ask, job_sel, over, label)
    for rule in RULES:
        answer.findings += _judge(ask, rule, job_sel, node_sel, over, label,
                                  alone=len(answer.nodes) == 1)
    answer.blind = _blind(ask, node_sel, over, label)
    _set_apart_the_end(answer, found)
    if with_timeline:
        _timeline(ask, answer, job_sel, node_sel, found, label)


def _set_apart_the_end(answer: Answer, found: span.Span) -> None:
    """How an ended job was ended, said apart rather than ranked as a fault:
    TERM and KILL in its last moments (scancel, its time limit, a shutdown).
    Where Slurm says the job was ended (CANCELLED, TIMEOUT...), all of them;
    otherwise one signal's, when it reached every node where the job had not
    died before (a rank the OOM killer took gets no TERM)."""
    if found.running:
        return
    last = [f for f in answer.findings if f.rule == "killed_by_signal" and f.since is not None
            and f.labels.get("signal") in END_SIGNALS and f.since >= found.end - END_BURST_S]
    died = {f.node for f in answer.findings if f.rule in ("oom_kill", "killed_by_signal")
            and f not in last}
    for signal in sorted({f.labels["signal"] for f in last}):
        theirs = [f for f in last if f.labels["signal"] == signal]
        if found.state in ENDED_BY_SLURM or \
                {f.node for f in theirs} >= set(answer.nodes) - died:
            answer.findings = [f for f in answer.findings if f not in theirs]
            answer.ended_by = (f"SIG{signal} to its processes in its last moments ("
                               + (f"Slurm: {found.state}" if found.state in ENDED_BY_SLURM else
                                  "on every node: a scancel, its time limit or a shutdown")
                               + ")")


class Over:
    """A rule's range and evaluation time: the job's span, ending at its end.

    The job's own series are asked until a tail after its end: they are
    nobody else's, and what the job's last moments counted (an OOM kill
    that ended it) is scraped after Slurm's end, exits up to their
    retirement later. The node's own series end at the job's end, and begin
    a second after Slurm's start (its times are whole seconds: an XID in
    the job's first second may have come before it)."""

    def __init__(self, found: span.Span, now: float | None = None):
        self.span = found
        now = time.time() if now is None else now
        self.job_end = max(found.end, min(found.end + JOB_TAIL_S, now))
        grain = SLURM_GRAIN_S if found.source == "slurm" else 0.0
        self._ends = {"job": (found.start, self.job_end), "node": (found.start + grain, found.end)}
        self.step = max(found.seconds / SINCE_POINTS, 1.0)

    def last_scrape(self, interval: float) -> None:
        """An ended job's node series until one scrape after Slurm's end: the
        sample that holds what its last moments counted (Slurm's end is in
        whole seconds, and an XID there is scraped up to an interval later)."""
        start, end = self._ends["node"]
        self._ends["node"] = (start, min(end + SLURM_GRAIN_S + interval, self.job_end))

    def fill(self, expr: str, level: str = "job", **values: str) -> str:
        start, end = self._ends[level]
        return fill(expr, window=_ms(end - start), at=f" @ {end:.3f}", **values)

    @property
    def node_empty(self) -> bool:
        """A job that ran less than Slurm's grain: no node time is surely its."""
        start, end = self._ends["node"]
        return end <= start

    def rule(self, rule: Rule, **values: str) -> str:
        return self.fill(rule.expr, "job" if rule.job_labelled else "node", **values)

    def points(self, node_level: bool) -> tuple[float, float]:
        """A range query's first and last point: counted back from the end,
        so the last is the time the rules were asked at (a sample scraped
        just before the end falls between points counted from the start)."""
        start, end = self._ends["node" if node_level else "job"]
        return end - math.ceil(max(end - start, 1.0) / self.step) * self.step, end


def _ms(seconds: float) -> str:
    """A PromQL duration of SECONDS to the millisecond."""
    return f"{max(round(seconds * 1000), 1)}ms"


def _timeline(ask: Asker, answer: Answer, job_sel: str, node_sel: str, found: span.Span,
              label: str) -> None:
    end = found.end
    step = timeline.step_of(found.seconds)
    start = end - (timeline.COLUMNS - 1) * step
    answer.timeline_start, answer.timeline_step = start, step
    for signal in timeline.SIGNALS:
        series = ask.over(timeline.query(signal, job_sel, node_sel, label, step), start, end, step)
        answer.timeline[signal] = timeline.collect(series, start, step, label)


def _nodes(ask: Asker, job_sel: str, over: Over, label: str) -> list[str]:
    def present(by: str) -> str:
        # span's lean families: the I/O counters' workload info in their place
        return " or ".join(over.fill(f"group{by} (last_over_time({m}{{{job_sel}}}[{{window}}]"
                                     "{at}))") for m in (*span.LIVE, span.EXITS))
    nodes = sorted({s.labels.get(label, "") for s in ask.now(present(f" by ({label})"))} - {""})
    if not nodes and ask.now(present("")):
        raise ExplainError(f"the job's series carry no label {label!r}: --node-label names the "
                           "label each node's target has in the scrape configuration (the "
                           "shipped deploy/prometheus/scrape.yml gives 'node')")
    return nodes


def _activity(ask: Asker, job_sel: str, over: Over, label: str) -> dict:
    out: dict[str, dict[str, float]] = {}
    for name, expr in ACTIVITY.items():
        for s in ask.now(over.fill(expr, job=job_sel, by=label)):
            out.setdefault(s.labels.get(label, "?"), {})[name] = round(s.value, 3)
    return out


def _judge(ask: Asker, rule: Rule, job_sel: str, node_sel: str, over: Over,
           label: str, alone: bool) -> list[Finding]:
    if not rule.job_labelled and over.node_empty:
        return []
    by = ", ".join((label, *rule.by))
    values = {"job": job_sel if rule.job_labelled else node_sel, "node": node_sel, "by": by}
    rows = [(s.labels, s.value) for s in ask.now(over.rule(rule, **values))
            if s.value == s.value]   # not NaN
    if rule.kind == "grew":
        held = [(labels, value, None) for labels, value in rows if value > 0]
    else:
        held = outliers(rule, rows, label, alone)
    if not held:
        return []
    since = _since(ask, rule, values, over, label, alone)
    if rule.when:
        _exact(ask, rule, values, over, label, since)
    out = []
    for labels, value, ratio in held:
        node = labels.get(label, "?")
        words = {k: labels.get(k, "") for k in rule.by}
        severity, action, more = judged(rule, words)
        says = rule.says.format(value=value, value_s=f"{value * 1000:.1f} ms",
                                compared=compared(ratio), **words, **more)
        out.append(Finding(rule.name, severity, node, words, round(value, 6), says, action,
                           since.get(_key(labels, label, rule)), outlier=ratio is not None))
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


def _since(ask: Asker, rule: Rule, values: dict, over: Over, label: str,
           alone: bool) -> dict:
    """(node, *by) -> when the rule first held in the job's span: a count
    first grew (over the step before each point); a node first an outlier
    among the job's nodes (over the span so far: a mean latency is above
    zero all along, what counts is when it parted from the others')."""
    step = over.step
    trailing = max(step, TRAILING_MIN_S) if rule.kind == "grew" else over.span.seconds
    promql = fill(rule.expr, window=f"{math.ceil(trailing)}s", at="", **values)
    at: dict[float, list] = {}
    first_point, end = over.points(not rule.job_labelled)
    for labels, points in ask.over(promql, first_point, end, step):
        for t, v in points:
            if v == v:          # not NaN
                at.setdefault(t, []).append((labels, v))
    first: dict[tuple, float] = {}
    for t in sorted(at):
        rows = at[t]
        held = ([(lb, v, None) for lb, v in rows if v > 0] if rule.kind == "grew"
                else outliers(rule, rows, label, alone))
        for labels, _v, _r in held:
            first.setdefault(_key(labels, label, rule), t)
    if rule.kind == "grew" and step > FINE_STEP_S:
        _refine(ask, rule, values, over, label, first, first_point)
    return first


def _exact(ask: Asker, rule: Rule, values: dict, over: Over, label: str,
           since: dict) -> None:
    """A since to the agent's own time of the event where it exports one
    (rule.when): a kill's moment, not the scrape that counted it. Only an
    earlier time than the scrape's, within the job's span, replaces it."""
    start = over.span.start - SLURM_GRAIN_S
    for s in ask.now(over.rule(replace(rule, expr=first_time(rule)), **values)):
        key = _key(s.labels, label, rule)
        counted = since.get(key)
        if counted is not None and start <= s.value <= counted:
            since[key] = s.value


def _key(labels: dict, label: str, rule: Rule) -> tuple:
    return (labels.get(label, "?"), *(labels.get(k, "") for k in rule.by))


def _refine(ask: Asker, rule: Rule, values: dict, over: Over, label: str,
            first: dict, first_point: float) -> None:
    """A count's since to about its scrape, not the coarse step of a long job:
    it grew within the step before its coarse since, asked again there at a
    fine step (one range query per distinct since, a few at most)."""
    fine = max(over.step / SINCE_POINTS, 1.0)
    promql = fill(rule.expr, window=f"{math.ceil(max(fine, TRAILING_MIN_S))}s", at="", **values)
    for coarse in sorted(set(first.values()))[:REFINE_MAX]:
        start = coarse - math.ceil(min(over.step, coarse - first_point) / fine) * fine
        for labels, points in ask.over(promql, start, coarse, fine):
            key = _key(labels, label, rule)
            held = [t for t, v in points if v == v and v > 0]
            if first.get(key) == coarse and held:
                first[key] = min(held)


def _blind(ask: Asker, node_sel: str, over: Over, label: str) -> list[dict]:
    """Where the agents on the job's nodes lost what they would have judged
    by, in the job's span: each with its node and what was lost."""
    parts = [f'label_replace({over.fill(expr, node=node_sel, by=label)}, "blind", "{name}", '
             '"", "")' for name, (expr, _says) in BLIND.items()]
    out = []
    for s in ask.now(" or ".join(parts)):
        name = s.labels.get("blind", "")
        if name in BLIND and s.value > 0:
            says = BLIND[name][1].format(value=s.value, **{k: s.labels.get(k, "?")
                                                            for k in ("map", "collector")})
            out.append({"node": s.labels.get(label, "?"), "what": name, "says": says})
    return sorted(out, key=lambda b: (b["node"], b["what"]))
