"""Node mode: one node's answer from its own agent, without Prometheus.

The agent keeps no history, and the counting rules need none: a job's
counters are born with its cgroup and retired with it (its exits 120 s
later), so their value on this node is what grew while the job ran here.
Node mode judges each counting rule over the job's life on this node, not
over a window. Some rules read something else:

  gpu_xid      the node's GPU counters are as old as the agent: an XID
               counts when the agent's event log holds it within --window,
               and says when it came;
  job_stalled, stopped_processes, node_unfit
               the gauges now (is it stalled, is a GPU unfit; not was it).

The comparing rules (one node unlike the job's others) need the other
nodes: here a job's mean write latency per mount and its sockets'
retransmissions count only far above the rule's floor, as fleet mode judges
a job on one node. Two reads of the agent: /metrics, /events.
"""
from __future__ import annotations

import datetime
import json
import os
import time

from ..exporter import text_parse
from ..clients.agent_client import AnswerError, read_agent
from ..conditions import BY_GAUGE as CONDITION_GAUGES
from .answer import (JOB_ID, PRESENCE, Answer, ExplainError, Finding, judged, rank, seconds,
                     valid_window, xid_verdict)
from . import span
from .rules import RULES, Rule, compared

# XIDs of a job Slurm does not know: the agent's events of this long ago
XID_DEFAULT_S = 15 * 60


def explain_node(url: str, job: str, window: str | None = None, node: str | None = None,
                 use_slurm: bool = True) -> Answer:
    if not JOB_ID.fullmatch(job):
        raise ExplainError(f"{job!r} is not a Slurm job id (digits)")
    window_s = seconds(valid_window(window)) if window is not None else None
    started = time.monotonic()
    now = time.time()
    # the node's XIDs are the job's while it ran here: Slurm says when that
    # was; without it, the last --window (default 15 min)
    ran = span.from_slurm(job, now) if use_slurm else None
    ran = ran.cut(window_s, now) if ran else span.Span(now - (window_s or XID_DEFAULT_S), now, "")
    node = node or os.uname().nodename
    metrics_url = url if url.rstrip("/").endswith("/metrics") else url.rstrip("/") + "/metrics"
    samples = _samples(_read(metrics_url, "text/plain"))
    mine = {name: [(lb, v) for lb, v in rows if lb.get("job_id") == job]
            for name, rows in samples.items()}
    present = any(mine.get(m) for m in PRESENCE)
    answer = Answer(job, window or ("its life" if ran.source else "15m"),
                    [node] if present else [], mode="node",
                    start=ran.start, end=ran.end, span_source=ran.source, running=ran.running)
    answer.queries = 1
    if present:
        answer.activity = {node: _activity(mine)}
        for rule in RULES:
            if rule.metric and rule.job_labelled:
                answer.findings += _counted(rule, mine.get(rule.metric, []), node)
        answer.findings += _far_above(mine, node)
        answer.findings += _stalled(mine.get("tracehound_workload_stalled", []), node)
        answer.findings += _unfit(samples.get("tracehound_gpu_health", []), node)
        events_url = metrics_url.removesuffix("/metrics") + "/events?kind=xid"
        answer.findings += _xids(_read(events_url, "application/json"), ran, node)
        answer.queries = 2
    answer.findings.sort(key=rank)
    answer.seconds = round(time.monotonic() - started, 3)
    return answer


def _read(url: str, accept: str) -> str:
    try:
        body = read_agent(url, 10.0, {"Accept": accept})
    except AnswerError as exc:
        raise ExplainError(str(exc)) from None
    except OSError as exc:
        raise ExplainError(f"cannot read {url}: {getattr(exc, 'reason', exc)}") from None
    return body.decode("utf-8", "replace")


def _samples(text: str) -> dict[str, list[tuple[dict, float]]]:
    try:
        return text_parse.samples_by_name(text)
    except ValueError as exc:
        raise ExplainError(f"the agent's /metrics does not parse: {exc}") from None


def _activity(mine: dict) -> dict[str, float]:
    def total(name: str, **match: str) -> float:
        return round(sum(v for lb, v in mine.get(name, [])
                         if all(lb.get(k, "") == x for k, x in match.items())), 3)
    out = {"read_bytes": total("tracehound_io_read_bytes_total"),
           "write_bytes": total("tracehound_io_write_bytes_total")}
    # the job's own cgroup only: CPU is exported at job, step and task level too
    if any(lb.get("step", "") == "" for lb, _v in mine.get("tracehound_cgroup_cpu_seconds_total",
                                                          [])):
        out["cpu_seconds"] = total("tracehound_cgroup_cpu_seconds_total", step="")
    return out


def _counted(rule: Rule, rows: list, node: str) -> list[Finding]:
    sums: dict[tuple, float] = {}
    for labels, value in rows:
        if all(labels.get(k) == v for k, v in rule.match):
            key = tuple(labels.get(k, "") for k in rule.by)
            sums[key] = sums.get(key, 0.0) + value
    out = []
    for key, value in sums.items():
        if value > 0:
            words = dict(zip(rule.by, key))
            severity, action, more = judged(rule, words)
            out.append(Finding(rule.name, severity, node, words, round(value, 6),
                               rule.says.format(value=value, **words, **more), action))
    return out


def _far_above(mine: dict, node: str) -> list[Finding]:
    """The comparing rules of the job's own series with no other node to
    compare: as fleet mode judges a job alone, a value far above the rule's
    floor (floor x factor), over the job's life on this node."""
    out = []
    slow = next(r for r in RULES if r.name == "slow_writes")
    per_mount: dict[str, list[float]] = {}
    for part, i in (("_sum", 0), ("_count", 1)):
        for labels, value in mine.get("tracehound_io_write_latency_seconds" + part, []):
            per_mount.setdefault(labels.get("mountpoint", ""), [0.0, 0.0])[i] += value
    for mount, (total, count) in sorted(per_mount.items()):
        mean = total / count if count > 0 else 0.0
        if mean > slow.floor * slow.factor:
            out.append(Finding(slow.name, slow.severity, node, {"mountpoint": mount},
                               round(mean, 6), slow.says.format(
                                   value=mean, value_s=f"{mean * 1000:.1f} ms", mountpoint=mount,
                                   compared=compared(None)), slow.action))
    tcp = next(r for r in RULES if r.name == "tcp_retransmits")
    sent = sum(v for _lb, v in mine.get("tracehound_net_tcp_retransmits_total", []))
    if sent > tcp.floor * tcp.factor:
        out.append(Finding(tcp.name, tcp.severity, node, {}, sent,
                           tcp.says.format(value=sent, compared=compared(None)), tcp.action))
    return out


def _stalled(rows: list, node: str) -> list[Finding]:
    rule = next(r for r in RULES if r.name == "job_stalled")
    if not any(v >= 1 for _lb, v in rows):
        return []
    return [Finding(rule.name, rule.severity, node, {}, 1.0, rule.says + " (now)", rule.action)]


def _unfit(rows: list, node: str) -> list[Finding]:
    """The node's GPU conditions that hold now (the gauges keep no past)."""
    rule = next(r for r in RULES if r.name == "node_unfit")
    out = []
    for labels, value in rows:
        words = {k: labels.get(k, "") for k in rule.by}
        if value < 1 or words["condition"] not in CONDITION_GAUGES:
            continue
        severity, action, more = judged(rule, words)
        out.append(Finding(rule.name, severity, node, words, 1.0,
                           rule.says.format(**words, **more) + " (now)", action))
    return out


def _xids(text: str, ran: span.Span, node: str) -> list[Finding]:
    """XID events of the agent's log while the job ran, one finding per GPU and XID."""
    try:
        events = json.loads(text)["events"]
    except (ValueError, KeyError, TypeError):
        raise ExplainError(f"the agent's /events is not an event list ({text[:80]!r})") from None
    rule = next(r for r in RULES if r.name == "gpu_xid")
    seen: dict[tuple[str, str], list[float]] = {}
    for event in events if isinstance(events, list) else []:
        if not isinstance(event, dict) or event.get("kind") != "xid":
            continue
        when = _epoch(event.get("time"))
        xid = str(event.get("xid", ""))
        if when is not None and ran.start <= when <= ran.end + 1 and xid.isdigit():
            seen.setdefault((str(event.get("pci_bus_id", "")), xid), []).append(when)
    out = []
    for (bus, xid), times in seen.items():
        words = {"pci_bus_id": bus, "xid": xid}
        severity, action = xid_verdict(xid)
        out.append(Finding(rule.name, severity, node, words, float(len(times)),
                           rule.says.format(value=len(times), **words), action,
                           since=min(times)))
    return out


def _epoch(text) -> float | None:
    try:
        return datetime.datetime.fromisoformat(str(text)).timestamp()
    except ValueError:
        return None
