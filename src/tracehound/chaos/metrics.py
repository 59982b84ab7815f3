"""Reading metrics for probes: a metric selector against an agent's
/metrics page, or a PromQL query against a Prometheus server."""
from __future__ import annotations

import json
import re
from dataclasses import dataclass

from ..exporter import text_parse
from ..clients import prometheus
from ..clients.agent_client import AnswerError, read_agent

DEFAULT_AGENT_URL = "http://127.0.0.1:9560/metrics"
_NAME = r"[a-zA-Z_:][a-zA-Z0-9_:]*"
_MATCHER = re.compile(r'\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*(=~|!~|!=|=)\s*"((?:[^"\\]|\\.)*)"\s*(,|$)')


class QueryError(Exception):
    pass


@dataclass(frozen=True)
class Matcher:
    label: str
    op: str
    value: str

    def matches(self, labels: dict) -> bool:
        have = labels.get(self.label, "")
        if self.op == "=":
            return have == self.value
        if self.op == "!=":
            return have != self.value
        hit = re.fullmatch(self.value, have) is not None
        return hit if self.op == "=~" else not hit


@dataclass(frozen=True)
class Selector:
    """name{label="v", label=~"regex", ...}: the PromQL instant-vector
    selector, which is all a probe against a single agent needs."""
    name: str
    matchers: tuple[Matcher, ...] = ()

    def __str__(self) -> str:
        inner = ",".join(f'{m.label}{m.op}"{m.value}"' for m in self.matchers)
        return f"{self.name}{{{inner}}}" if inner else self.name


def parse_selector(text: str) -> Selector:
    if not isinstance(text, str):
        raise QueryError("a metric selector must be a string")
    m = re.fullmatch(rf"\s*({_NAME})\s*(?:\{{(.*)\}})?\s*", text, re.S)
    if not m:
        raise QueryError(f"not a metric selector: {text!r} (expected "
                         'name or name{label="value",...})')
    name, body = m.group(1), (m.group(2) or "").strip()
    matchers = []
    pos = 0
    while pos < len(body):
        mm = _MATCHER.match(body, pos)
        if not mm:
            raise QueryError(f"cannot read label matcher at {body[pos:]!r} in {text!r}")
        value = re.sub(r"\\(.)", lambda e: "\n" if e.group(1) == "n" else e.group(1),
                       mm.group(3))
        if mm.group(2) in ("=~", "!~"):
            try:
                re.compile(value)
            except re.error as exc:
                raise QueryError(f"label {mm.group(1)}: bad regular expression: {exc}") from None
        matchers.append(Matcher(mm.group(1), mm.group(2), value))
        pos = mm.end()
    return Selector(name, tuple(matchers))


def fetch(url: str, timeout: float) -> str:
    try:
        # https, a CA, a client certificate and a password from the environment
        return read_agent(url, timeout, {"Accept": "text/plain"}).decode("utf-8", "replace")
    except AnswerError as exc:
        raise QueryError(str(exc)) from None
    except OSError as exc:
        raise QueryError(f"cannot read {url}: {getattr(exc, 'reason', exc)}") from None


def parse_samples(text: str) -> dict[str, list[tuple[dict, float]]]:
    """The agent's exposition (exporter/text_parse.py: the one parser of it)
    as sample name -> [(labels, value)]."""
    return text_parse.samples_by_name(text)


def select_sum(samples: dict, name: str, sel: Selector) -> float | None:
    """Sum of the matching samples; None when no series matches. A counter
    may be named with or without its _total suffix."""
    rows = samples.get(name)
    if rows is None and not name.endswith("_total"):
        rows = samples.get(name + "_total")
    if rows is None:
        return None
    hits = [v for labels, v in rows if all(m.matches(labels) for m in sel.matchers)]
    return sum(hits) if hits else None


def agent_point(url: str, sel: Selector, histogram: bool, timeout: float = 5.0):
    """One reading: the summed value, or (sum, count) of a histogram."""
    samples = parse_samples(fetch(url, timeout))
    if histogram:
        total = select_sum(samples, sel.name + "_sum", sel)
        count = select_sum(samples, sel.name + "_count", sel)
        if total is None or count is None:
            return None
        return (total, count)
    return select_sum(samples, sel.name, sel)


def promql_value(base_url: str, query: str, timeout: float = 5.0) -> float | None:
    """Instant query; a vector is summed, an empty one is None."""
    try:
        samples = prometheus.query(base_url, query, timeout)
    except prometheus.PrometheusError as exc:
        raise QueryError(str(exc)) from None
    return sum(s.value for s in samples) if samples else None


def events_url(url: str) -> str:
    """An agent's /events address from its /metrics one (or itself)."""
    if url.endswith("/events"):
        return url
    return url.removesuffix("/metrics").rstrip("/") + "/events"


class EventCounter:
    """How many of the agent's anomaly events carry every field of `match`,
    counted from what the agent still held at the first read. Each read asks
    only for events newer than the last one seen."""

    def __init__(self, url: str, match: dict, timeout: float = 5.0):
        self.url = events_url(url)
        self.match = {k: str(v) for k, v in match.items()}
        self.timeout = timeout
        self.seq = 0
        self.count = 0
        self.last_match: dict | None = None

    def matches(self, event: dict) -> bool:
        return all(str(event.get(k)) == v for k, v in self.match.items())

    def __call__(self) -> float:
        text = fetch(f"{self.url}?since={self.seq}", self.timeout)
        try:
            page = json.loads(text)
            events, self.seq = page["events"], int(page["next"])
        except (ValueError, KeyError, TypeError):
            raise QueryError(f"{self.url}: not an event list ({text[:80]!r})") from None
        for event in events:
            if isinstance(event, dict) and self.matches(event):
                self.count += 1
                self.last_match = event
        return float(self.count)
