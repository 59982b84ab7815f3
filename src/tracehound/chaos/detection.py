"""The detection probe: did the observability stack see the fault, and how
fast?

A reading is polled until a predicate holds on a signal or time runs out.
Sources: the local agent's /metrics (a metric selector), its /events (the
anomaly events whose fields match), a Prometheus server (PromQL), or a
command whose output holds a number (for what tracehound cannot see, so the
report can say so). MTTD is measured from the moment
the fault was applied, not from when the probe started.
"""
from __future__ import annotations

import re
import shutil
import subprocess
import time

from . import metrics
from .jsonpath import COMPARISONS
from .faults import Detection
from .tolerance import is_number

SOURCES = ("agent", "events", "prometheus", "process")
SIGNALS = ("value", "increase", "rate", "mean")
DETECT_KEYS = ("fault", "source", "url", "query", "match", "signal", "window", "predicate",
               "command", "extract", "timeout", "interval")
QUERY_KEYS = ("source", "url", "query", "match", "signal", "window", "command", "extract",
              "timeout")
_PREDICATE = re.compile(r"^\s*(==|!=|>=|<=|>|<)\s*([-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?)\s*$")


def parse_predicate(text) -> tuple[str, float]:
    m = _PREDICATE.match(text) if isinstance(text, str) else None
    if not m:
        raise ValueError(f"predicate {text!r} must be a comparison and a number, "
                         "e.g. '> 0.01' or '== 0'")
    return m.group(1), float(m.group(2))


def compare(value: float, predicate: tuple[str, float]) -> bool:
    op, ref = predicate
    return COMPARISONS[op](value, ref)


def check_spec(spec: dict, query: bool = False) -> list[tuple[str, str]]:
    """(field, problem) for a detect (or query) probe's own fields."""
    problems = []
    add = lambda key, msg: problems.append((key, msg))  # noqa: E731
    source = spec.get("source", "agent")
    if source not in SOURCES:
        return [("source", f"source must be one of {', '.join(SOURCES)}")]
    q, url = spec.get("query"), spec.get("url")
    if url is not None and (not isinstance(url, str) or not re.match(r"https?://", url)):
        add("url", "url must be an http:// or https:// address")
    if source == "prometheus" and not url:
        add("url", "a prometheus source needs the server's url")
    if source == "events":
        match = spec.get("match")
        if not (isinstance(match, dict) and match and all(
                isinstance(k, str) and isinstance(v, (str, int, float, bool))
                for k, v in match.items())):
            add("match", "an events source needs match: the fields an event must have, "
                         "e.g. {kind: error_burst, op: reg_mr}")
        if spec.get("signal", "increase") not in ("increase", "value"):
            add("signal", "an events source counts matching events: use increase (events "
                          "since the fault, the default) or value (all the agent holds)")
    elif source == "process":
        cmd = spec.get("command")
        if not (isinstance(cmd, list) and cmd and all(isinstance(x, (str, int, float))
                                                     for x in cmd)):
            add("command", "a process source needs command: a non-empty list of arguments")
        elif not shutil.which(str(cmd[0])):
            add("command", f"'{cmd[0]}' is not an executable program here")
        if "extract" in spec:
            try:
                if re.compile(spec["extract"]).groups > 1:
                    raise re.error("use at most one group")
            except (re.error, TypeError) as exc:
                add("extract", "extract must be a regular expression with one group around "
                               f"the number: {exc}")
    elif q is not None or query:
        if not isinstance(q, str) or not q.strip():
            add("query", "query must be a non-empty string")
        elif source == "agent":
            try:
                metrics.parse_selector(q)
            except metrics.QueryError as exc:
                add("query", str(exc))
    signal = spec.get("signal", "value")
    if signal not in SIGNALS:
        add("signal", f"signal must be one of {', '.join(SIGNALS)}")
    elif signal != "value" and source == "prometheus":
        add("signal", "with prometheus, compute the signal in PromQL (rate(), increase()) "
                      "and leave signal as value")
    elif signal == "mean" and source != "agent":
        add("signal", "mean reads a histogram from the agent")
    for key, low, high in (("window", 0.05, 3600), ("timeout", 0.1, 3600),
                           ("interval", 0.05, 60)):
        if key in spec and not (is_number(spec[key]) and low <= spec[key] <= high):
            add(key, f"{key} must be a number of seconds between {low} and {high}")
    if "predicate" in spec:
        try:
            parse_predicate(spec["predicate"])
        except ValueError as exc:
            add("predicate", str(exc))
    return problems


READING_TIMEOUT_S = 15.0


def reader(spec: dict):
    """A function returning one reading for the spec's source: a number,
    (sum, count) for a histogram mean, or None when nothing matched."""
    source = spec.get("source", "agent")
    # one reading's whole time: an agent or a Prometheus on a busy node (an
    # emulated guest beside other work) can take seconds to answer, and a
    # reading given up on is a sample lost to the detection
    timeout = min(READING_TIMEOUT_S, float(spec.get("timeout", READING_TIMEOUT_S)))
    if source == "agent":
        sel = metrics.parse_selector(spec["query"])
        url = spec.get("url") or metrics.DEFAULT_AGENT_URL
        histogram = spec.get("signal", "value") == "mean"
        return lambda: metrics.agent_point(url, sel, histogram, timeout)
    if source == "prometheus":
        return lambda: metrics.promql_value(spec["url"], spec["query"], timeout)
    if source == "events":
        return metrics.EventCounter(spec.get("url") or metrics.DEFAULT_AGENT_URL,
                                    spec["match"], timeout)
    argv = [str(x) for x in spec["command"]]
    pattern = re.compile(spec["extract"]) if spec.get("extract") else None

    def run_command():
        try:
            out = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise metrics.QueryError(f"{argv[0]}: {exc}") from None
        if pattern is None:
            return float(out.returncode)
        m = pattern.search(out.stdout + out.stderr)
        if not m:
            return None
        return float(m.group(1) if m.groups() else m.group(0))
    return run_command


class SignalWindow:
    """Turns successive readings into the signal: the value itself, its
    increase since the fault was applied, or its rate / histogram mean over
    the last `window` seconds."""

    def __init__(self, signal: str, window: float, baseline=None):
        self.signal = signal
        self.window = window
        self.points: list[tuple[float, object]] = []
        if baseline is not None and baseline[1] is not None:
            self.points.append(baseline)
        # A baseline read that matched no series means the counter did not
        # exist yet: it starts from zero. No baseline at all: the first read.
        self.base = None if baseline is None else (baseline[1] or 0.0)

    def add(self, t: float, point) -> float | None:
        if point is None:
            return None
        if self.signal == "value":
            return point
        if self.signal == "increase":
            if self.base is None:
                self.base = point
            return point - self.base
        # Only rate and mean look back, so only they keep a history.
        self.points.append((t, point))
        old = None
        for pt, pv in self.points:
            if t - pt >= self.window:
                old = (pt, pv)
        if old is None:
            return None
        self.points = [p for p in self.points if p[0] >= old[0]]
        dt = t - old[0]
        if self.signal == "rate":
            return (point - old[1]) / dt if dt > 0 else None
        dsum, dcount = point[0] - old[1][0], point[1] - old[1][1]
        return dsum / dcount if dcount > 0 else None


def with_defaults(spec: dict, default: Detection | None) -> dict:
    """Fill the query, signal and predicate from the fault's own detection
    when the probe names none."""
    spec = dict(spec)
    source = spec.setdefault("source", "agent")
    if source == "events":
        spec.setdefault("signal", "increase")
        return spec
    if source == "process" or spec.get("query") or default is None:
        return spec
    if source == "agent" and default.query:
        spec["query"] = default.query
        spec.setdefault("signal", default.signal)
    elif source == "prometheus" and default.promql:
        spec["query"] = default.promql
    spec.setdefault("predicate", default.predicate)
    spec.setdefault("note", default.note)
    return spec


def describe(spec: dict) -> str | None:
    """What the probe asks, in one line (None: nothing to ask)."""
    if spec.get("source") == "events":
        return "events{" + ",".join(f'{k}="{v}"' for k, v in spec["match"].items()) + "}"
    if spec.get("command"):
        return " ".join(map(str, spec["command"]))
    return spec.get("query")


def take_baseline(spec: dict):
    """One reading just before the fault goes in (None if unreadable)."""
    if spec.get("source", "agent") == "prometheus" or not describe(spec):
        return None
    if spec.get("signal", "value") == "value":
        return None     # only increase, rate and mean look back
    try:
        return (time.monotonic(), reader(spec)())
    except (metrics.QueryError, ValueError):
        return None


def baseline_and_before(spec: dict) -> tuple:
    """Just before the fault goes in: take_baseline's reading, and the
    signal's value as the probe will judge it under the fault, which the
    report sets beside it: a value, run_query's one reading; a rate, mean or
    increase, a first reading and, `window` seconds later, take_baseline's,
    the signal between the two. None for what cannot be read."""
    if not describe(spec):
        return None, None
    signal = spec.get("signal", "value")
    try:
        if signal == "value":
            return None, run_query(spec)
        if spec.get("source", "agent") == "prometheus":
            return None, None       # Prometheus answers rates itself: a value probe
        window = SignalWindow(signal, float(spec.get("window", 1.0)))
        window.add(time.monotonic(), reader(spec)())
    except (metrics.QueryError, ValueError):
        return None, None
    time.sleep(window.window)
    baseline = take_baseline(spec)
    return baseline, None if baseline is None else window.add(*baseline)


def run_detection(spec: dict, applied_at: float | None, baseline=None,
                  fault: str | None = None) -> dict:
    source = spec.get("source", "agent")
    query = describe(spec)
    result = {"fault": fault, "source": source, "query": query,
              "signal": spec.get("signal", "value"), "predicate": spec.get("predicate"),
              "detected": False, "mttd_seconds": None, "value": None, "before": None,
              "tracehound_signal": source == "events" or (
                  source != "process" and bool(query) and "tracehound_" in query),
              "note": spec.get("note", ""), "samples": []}
    if applied_at is None:
        result["note"] = "no fault was applied before this probe"
        return result
    if not query:
        return result
    read = reader(spec)
    predicate = parse_predicate(spec.get("predicate", "> 0"))
    window = SignalWindow(spec.get("signal", "value"), float(spec.get("window", 1.0)),
                          baseline)
    interval = float(spec.get("interval", 0.5))
    deadline = time.monotonic() + float(spec.get("timeout", 30))
    errors = []
    matched = False
    while True:
        try:
            point = read()
        except metrics.QueryError as exc:
            errors.append(str(exc))
            point = None
        matched = matched or point is not None
        now = time.monotonic()
        value = window.add(now, point)
        if value is not None:
            result["value"] = value
            result["samples"].append([round(now - applied_at, 3), value])
            if compare(value, predicate):
                result["detected"] = True
                result["mttd_seconds"] = round(now - applied_at, 3)
                if getattr(read, "last_match", None) is not None:
                    result["event"] = read.last_match     # when the agent decided, and why
                break
        if now + interval > deadline:
            break
        time.sleep(interval)
    why = errors[-1] if errors else (None if matched else "no series matched the query")
    if why and not result["detected"]:
        result["note"] = (result["note"] + "; " if result["note"] else "") + why
    del result["samples"][:-300]
    return result


def run_query(spec: dict) -> float | None:
    """A one-off reading for a steady-state probe (rate and mean read twice,
    `window` seconds apart)."""
    read = reader(spec)
    signal = spec.get("signal", "value")
    window = SignalWindow(signal, float(spec.get("window", 1.0)))
    value = window.add(time.monotonic(), read())
    if signal in ("value",):
        return value
    time.sleep(float(spec.get("window", 1.0)))
    return window.add(time.monotonic(), read())
