"""The fleet report: where the experiment landed and who saw it.

Per node: did it land (and why not), the faults applied and rolled back,
what the node's own detection probes said (asked of its agent), and what
the fleet's Prometheus says of that node's instance alone: the fault's
detection query with the node's instance matcher, over a range from the
fault to now, so a node whose agent missed it shows as a gap instead of
being averaged away. Per fault: landed on k of n, detection rate, MTTD
p50/p95/max across nodes. Markdown, JSON and (with matplotlib) a plot.
"""
from __future__ import annotations

import datetime
import json
import math
import os
import re
import time

from ...clients import prometheus
from .. import faults as catalog
from ..detection import compare, parse_predicate
from .launcher import node_record_path

_SELECTOR = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{.*\})?$")
# a range in a question asked of Prometheus spans at least this many scrapes
SCRAPES_PER_RANGE = 4


def node_matcher(label: str, node: str) -> str:
    """A matcher for the node's own series: its name, or its name followed
    by a domain or a port (instance="n1.example:9560")."""
    return f"{label}=~{prometheus.regex_literal(node, then='([.:].*)?')}"


def with_matcher(selector: str, matcher: str) -> str | None:
    """metric{a="b"} -> metric{a="b",<matcher>}; None if not a plain selector."""
    m = _SELECTOR.match(selector)
    if not m:
        return None
    inner = (m.group(2) or "{}")[1:-1].strip()
    return f"{m.group(1)}{{{inner + ',' if inner else ''}{matcher}}}"


def instance_promql(fault: dict, label: str, node: str) -> tuple[str | None, str]:
    """(PromQL, predicate) asking whether this node's instance showed the fault."""
    try:
        det = catalog.get(fault["fault"]).detection(fault.get("arguments") or {},
                                                     fault.get("state") or {})
    except Exception as exc:     # a fault unknown to this version, a state it cannot read
        return None, f"no detection query: {exc}"
    if not det.query or not det.promql:
        return None, det.note or "this fault has no PromQL detection"
    matcher = node_matcher(label, node)
    scoped = with_matcher(det.query, matcher)
    if scoped is None:
        return None, f"cannot scope {det.query!r} to one instance"
    # every selector of the question (a histogram's _sum and _count beside
    # each other) carries the query's label set: each gets the node's matcher
    braces = _SELECTOR.match(det.query).group(2)
    promql = (det.promql.replace(braces, scoped[len(_SELECTOR.match(scoped).group(1)):])
              if braces else det.promql.replace(det.query, scoped))
    if matcher not in promql:
        return None, f"cannot scope {det.promql!r} to one instance"
    return promql, det.predicate


_RANGE = re.compile(r"\[([0-9]+)(s|m|h)\]")


def widen(promql: str, at_least_s: float) -> str:
    """Every range of `promql` at least `at_least_s` long: a rate over fewer
    than about four scrapes answers nothing, or a lone pair's noise."""
    def one(m):
        seconds = int(m.group(1)) * {"s": 1, "m": 60, "h": 3600}[m.group(2)]
        return m.group(0) if seconds >= at_least_s else f"[{math.ceil(at_least_s)}s]"
    return _RANGE.sub(one, promql)


def node_interval(intervals: list[tuple[dict, float]], label: str, node: str) -> float:
    """The longest scrape interval of the node's targets (0: none known)."""
    own = re.compile(re.escape(node) + r"([.:].*)?")
    return max((s for labels, s in intervals if own.fullmatch(str(labels.get(label, "")))),
               default=0.0)


def _wall(record: dict, relative: float | None) -> float | None:
    if relative is None:
        return None
    start = datetime.datetime.fromisoformat(record["start"]).timestamp()
    return start + relative


def first_held(points: list[tuple[float, float]], since: float, predicate: str) -> float | None:
    pred = parse_predicate(predicate)
    for t, v in points:
        if t >= since and not math.isnan(v) and compare(v, pred):
            return t
    return None


def ask_prometheus(url: str, label: str, nodes: dict[str, dict], timeout_s: float,
                   step_s: float = 0.25, poll_s: float = 1.0) -> None:
    """Fill nodes[n]["prometheus"] for every applied fault: detected on that
    instance, and when. Waits up to timeout_s for a scrape still to come."""
    asks = []
    try:
        intervals = prometheus.target_intervals(url)
    except prometheus.PrometheusError:
        intervals = []      # the queries keep their own ranges
    for node, info in nodes.items():
        info["prometheus"] = []
        interval = node_interval(intervals, label, node)
        for fault in info.get("faults", []):
            applied = fault.get("applied_wall")
            if applied is None:
                continue
            promql, predicate = instance_promql(fault, label, node)
            if promql and interval:
                promql = widen(promql, SCRAPES_PER_RANGE * interval)
            entry = {"fault": fault["fault"], "action": fault["action"], "query": promql,
                     "detected": False, "mttd_seconds": None,
                     "note": "" if promql else predicate}
            info["prometheus"].append(entry)
            if promql:
                asks.append((entry, promql, predicate, applied))
    deadline = time.monotonic() + timeout_s
    while asks:
        left = []
        for entry, promql, predicate, applied in asks:
            try:
                series = prometheus.query_range(url, promql, applied - step_s,
                                                time.time(), step_s)
            except prometheus.PrometheusError as exc:
                entry["note"] = str(exc)
                if exc.retryable:
                    left.append((entry, promql, predicate, applied))
                continue
            seen = [t for _, pts in series if (t := first_held(pts, applied, predicate))]
            if seen:
                entry.update(detected=True, mttd_seconds=round(min(seen) - applied, 3), note="")
            else:
                entry["note"] = "not seen on this instance"
                left.append((entry, promql, predicate, applied))
        asks = left
        if not asks or time.monotonic() > deadline:
            break
        time.sleep(poll_s)


def collect(launch: dict, report_dir: str) -> dict[str, dict]:
    """Per node of the plan: what its run recorded."""
    nodes = {}
    for node in launch["plan"]["nodes"]:
        run = launch["runs"].get(node, {})
        info = {"launched": run.get("launched_at") is not None, "rc": run.get("rc"),
                "launched_at": run.get("launched_at"), "ended_at": run.get("ended_at"),
                "stopped": run.get("stopped"), "killed": run.get("killed"),
                "step_id": run.get("step_id"), "unidentified": run.get("unidentified"),
                "faults": [],
                "detections": []}
        path = node_record_path(os.path.join(report_dir, "nodes", node))
        record = None
        if path:
            try:
                with open(path) as f:
                    record = json.load(f)
            except (OSError, ValueError) as exc:
                info["why"] = f"its record {path} is unreadable: {exc}"
        if record is None:
            info.setdefault("why", "never launched (the run stopped first)"
                            if not info["launched"] else _no_record_why(run.get("rc")))
            info["status"] = "not landed"
            nodes[node] = info
            continue
        info["status"] = record.get("status")
        info["record"] = os.path.relpath(path, report_dir)
        for f in record.get("faults", []):
            info["faults"].append({
                "fault": f.get("fault"), "action": f.get("action"),
                "arguments": f.get("arguments"), "state": f.get("state"),
                "targets": f.get("targets"), "applied_wall": _wall(record, f.get("applied_at")),
                "rolled_back": f.get("rollback"),
                "rolled_back_wall": _wall(record, f.get("rolled_back_at"))})
        for d in record.get("detections", []):
            info["detections"].append({k: d.get(k) for k in (
                "probe", "fault", "action", "detected", "mttd_seconds", "tracehound_signal",
                "note")})
        nodes[node] = info
    return nodes


def _no_record_why(rc) -> str:
    if rc is None:
        return "launched, no end recorded"
    if rc < 0:
        return f"srun was killed ({-rc}) before the node's run wrote its record"
    return f"srun exited {rc} without a record: the node was not allocated or the run " \
           "failed to start (see its srun.log)"


def percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    k = max(0, math.ceil(q / 100 * len(ordered)) - 1)
    return ordered[k]


def summarize(nodes: dict[str, dict]) -> list[dict]:
    """Per fault: landed on how many nodes, detection rate and MTTD spread,
    by the nodes' own probes and by Prometheus per instance."""
    by_fault: dict[str, dict] = {}
    for info in nodes.values():
        for f in info["faults"]:
            if f["applied_wall"] is None:
                continue
            s = by_fault.setdefault(f["fault"], {"fault": f["fault"], "landed": 0,
                                                 "agent": [], "agent_missed": 0,
                                                 "prometheus": [], "prometheus_missed": 0})
            s["landed"] += 1
            for source, entries in (("agent", info["detections"]),
                                    ("prometheus", info.get("prometheus", []))):
                mine = [d for d in entries if d.get("action") == f["action"]
                        and (source == "prometheus" or d.get("tracehound_signal"))]
                seen = [d["mttd_seconds"] for d in mine if d.get("detected")]
                if seen:
                    s[source].append(min(seen))
                elif mine:
                    s[source + "_missed"] += 1
    out = []
    for s in by_fault.values():
        row = {"fault": s["fault"], "landed": s["landed"]}
        for source in ("agent", "prometheus"):
            asked = len(s[source]) + s[source + "_missed"]
            row[source] = {"asked": asked, "detected": len(s[source]),
                           "rate": round(len(s[source]) / asked, 3) if asked else None,
                           "mttd_p50": percentile(s[source], 50),
                           "mttd_p95": percentile(s[source], 95),
                           "mttd_max": max(s[source]) if s[source] else None}
        out.append(row)
    return out


def build(launch: dict, report_dir: str, prometheus_url: str | None, node_label: str,
          detect_timeout_s: float) -> dict:
    nodes = collect(launch, report_dir)
    if prometheus_url:
        ask_prometheus(prometheus_url, node_label, nodes, detect_timeout_s)
    landed = [n for n, i in nodes.items() if i["status"] != "not landed"]
    # a run is completed only where every node's run completed: one node's
    # failure is the run's, never hidden under its launcher's "completed"
    failed = {n: str(i["status"]) for n, i in nodes.items() if i["status"] != "completed"}
    status = launch["status"]
    if status == "completed" and failed:
        status = "failed"
    return {**{k: launch[k] for k in ("run_id", "title", "experiment", "stop_reason",
                                      "plan", "fleet_journal")},
            "status": status, "failed_nodes": failed if status != "completed" else {},
            "start": launch["start"], "end": launch["end"], "prometheus": prometheus_url,
            "node_label": node_label, "landed": landed, "nodes": nodes,
            "summary": summarize(nodes)}
