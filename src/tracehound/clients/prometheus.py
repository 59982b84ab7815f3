"""Instant queries against a Prometheus server, and waiting for a condition.

This is the detection side of an experiment: after a fault is injected, ask
Prometheus (which scrapes the agents) whether the fault became visible, and
how long that took.

API
---
``query(url, promql, timeout=10.0, at=None) -> list[Sample]``
    One instant query through ``/api/v1/query``. `url` is the server's base
    URL (``http://prometheus:9090``; a path prefix such as ``/prometheus`` is
    kept). A vector result gives one Sample per series; a scalar gives one
    Sample without labels; an empty vector gives ``[]``. `at` is a Unix time
    to evaluate at (default: now). Raises PrometheusError.

``query_range(url, promql, start, end, step, timeout=10.0) -> [(labels, [(t, v)])]``
    One range query through ``/api/v1/query_range``: every series with its
    points. Raises PrometheusError.

``wait_for(url, promql, predicate=bool, timeout=60.0, interval=0.5,
started=None) -> (samples, seconds)``
    Repeats `query` until ``predicate(samples)`` is true and returns those
    samples and the seconds elapsed since `started` (a ``time.monotonic()``
    value, e.g. taken when the fault was injected; default: when wait_for was
    called). The default predicate, ``bool``, accepts any non-empty result,
    which suits comparison queries such as ``rate(x[1m]) > 0``.
    Unreachable servers and 5xx answers are retried until the deadline; a
    query Prometheus rejects (bad syntax, 4xx) raises at once. Raises
    DetectionTimeout (a PrometheusError and a TimeoutError) at the deadline,
    carrying the last samples and the last error seen.

``wait_ready(url, timeout=60.0) -> float``
    Waits until the server answers ``/-/ready`` with 200; returns the seconds
    it took. Raises DetectionTimeout.

``Sample``
    ``labels`` (dict, ``__name__`` included where the query keeps it),
    ``value`` (float; NaN and ±Inf as floats), ``timestamp`` (Unix seconds),
    and ``name`` (the ``__name__`` label or "").

Example::

    from tracehound.clients.prometheus import wait_for
    t0 = time.monotonic()
    inject_fault()
    samples, seconds = wait_for(
        "http://127.0.0.1:9090",
        'increase(tracehound_rdma_verb_errors_total{node="n1", op="reg_mr"}[1m]) > 0',
        timeout=120, started=t0)
"""
from __future__ import annotations

import json
import re
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field

from ..errors import TracehoundError


@dataclass(frozen=True)
class Sample:
    labels: dict[str, str] = field(default_factory=dict)
    value: float = 0.0
    timestamp: float = 0.0

    @property
    def name(self) -> str:
        return self.labels.get("__name__", "")


class PrometheusError(TracehoundError):
    """A query that failed. `retryable` is False when Prometheus rejected the
    query itself (asking again cannot help)."""

    def __init__(self, message: str, retryable: bool = True):
        super().__init__(message)
        self.retryable = retryable


class DetectionTimeout(PrometheusError, TimeoutError):
    def __init__(self, message: str, last: list[Sample] | None = None,
                 last_error: PrometheusError | None = None, seconds: float = 0.0):
        super().__init__(message, retryable=False)
        self.last = last or []
        self.last_error = last_error
        self.seconds = seconds


def regex_literal(*texts: str, then: str = "") -> str:
    """A quoted PromQL string holding a regular expression: any of TEXTS,
    matched literally, followed by the pattern THEN. Each text is escaped for
    the expression, then the whole for the string (backslashes, quotes,
    control characters: a cgroup or node name may hold any of them)."""
    alternatives = "|".join(re.escape(t) for t in texts)
    grouped = f"({alternatives})" if then and len(texts) > 1 else alternatives
    return json.dumps(grouped + then)


def _endpoint(url: str, path: str) -> str:
    return url.rstrip("/") + path


def _samples(data: dict) -> list[Sample]:
    kind, result = data.get("resultType"), data.get("result")
    if kind == "vector":
        return [Sample(dict(r.get("metric", {})), float(r["value"][1]), float(r["value"][0]))
                for r in result]
    if kind == "scalar":
        return [Sample({}, float(result[1]), float(result[0]))]
    raise PrometheusError(f"expected an instant vector or a scalar, got a {kind} "
                          "(a range selector needs a function such as rate())",
                          retryable=False)


def query(url: str, promql: str, timeout: float = 10.0, at: float | None = None) -> list[Sample]:
    form = {"query": promql, "timeout": f"{max(int(timeout * 1000), 1)}ms"}
    if at is not None:
        form["time"] = f"{at:.3f}"
    return _samples(_api(url, "/api/v1/query", form, promql, timeout))


def query_range(url: str, promql: str, start: float, end: float, step: float,
                timeout: float = 10.0) -> list[tuple[dict, list[tuple[float, float]]]]:
    """(labels, [(time, value)...]) per series of a range query."""
    form = {"query": promql, "start": f"{start:.3f}", "end": f"{end:.3f}",
            "step": f"{max(step, 0.001):.3f}", "timeout": f"{max(int(timeout * 1000), 1)}ms"}
    data = _api(url, "/api/v1/query_range", form, promql, timeout)
    if data.get("resultType") != "matrix":
        raise PrometheusError(f"expected a range result, got a {data.get('resultType')}",
                              retryable=False)
    return [(dict(r.get("metric", {})), [(float(t), float(v)) for t, v in r.get("values", [])])
            for r in data.get("result") or []]


_DURATION = re.compile(r"([0-9]+)(ms|s|m|h|d)")
_UNIT_S = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400}


def duration_seconds(text: str) -> float | None:
    """A Prometheus duration ('30s', '1m30s') in seconds; None if it is not one."""
    parts = _DURATION.findall(text or "")
    if not parts or "".join(n + u for n, u in parts) != text:
        return None
    return sum(int(n) * _UNIT_S[u] for n, u in parts)


def target_intervals(url: str, timeout: float = 10.0) -> list[tuple[dict, float]]:
    """(labels, scrape interval in seconds) of every active target."""
    request = urllib.request.Request(_endpoint(url, "/api/v1/targets?state=active"),
                                     headers={"Accept": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as resp:
            doc = json.loads(resp.read())
    except (urllib.error.URLError, OSError, ValueError) as exc:
        raise PrometheusError(f"cannot read the targets of {url}: "
                              f"{getattr(exc, 'reason', exc)}") from None
    out = []
    for t in (doc.get("data") or {}).get("activeTargets") or []:
        seconds = duration_seconds(str(t.get("scrapeInterval", "")))
        if seconds and isinstance(t.get("labels"), dict):
            out.append((t["labels"], seconds))
    return out


def _api(url: str, path: str, form: dict, promql: str, timeout: float) -> dict:
    # POST: long PromQL expressions would overflow a URL.
    request = urllib.request.Request(
        _endpoint(url, path), data=urllib.parse.urlencode(form).encode(),
        headers={"Content-Type": "application/x-www-form-urlencoded",
                 "Accept": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as resp:
            body = resp.read()
    except urllib.error.HTTPError as exc:
        body = exc.read()
        detail = _error_detail(body) or exc.reason
        # 400/422: the query is wrong; 503 and other 5xx: the server is busy or starting
        raise PrometheusError(f"query {promql!r} failed ({exc.code}): {detail}",
                              retryable=exc.code >= 500) from None
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        raise PrometheusError(f"cannot reach Prometheus at {url}: {reason}") from None
    try:
        doc = json.loads(body)
    except ValueError:
        raise PrometheusError(f"{url} did not answer with JSON: is it a Prometheus server?",
                              retryable=False) from None
    if doc.get("status") != "success":
        raise PrometheusError(f"query {promql!r} failed: {_error_detail(body)}",
                              retryable=False)
    return doc.get("data") or {}


def _error_detail(body: bytes) -> str:
    try:
        doc = json.loads(body)
    except ValueError:
        return body.decode(errors="replace").strip()[:200]
    return f"{doc.get('errorType', 'error')}: {doc.get('error', '')}"


def wait_for(url: str, promql: str, predicate: Callable[[list[Sample]], object] = bool,
             timeout: float = 60.0, interval: float = 0.5,
             started: float | None = None) -> tuple[list[Sample], float]:
    start = time.monotonic() if started is None else started
    deadline = time.monotonic() + timeout
    last: list[Sample] = []
    last_error: PrometheusError | None = None
    while True:
        per_query = max(min(10.0, deadline - time.monotonic()), 0.5)
        try:
            last = query(url, promql, timeout=per_query)
            last_error = None
            if predicate(last):
                return last, time.monotonic() - start
        except PrometheusError as exc:
            if not exc.retryable:
                raise
            last_error = exc
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            seen = f"last error: {last_error}" if last_error else f"last result: {_show(last)}"
            raise DetectionTimeout(f"{promql!r} not satisfied within {timeout:g} s ({seen})",
                                   last, last_error, time.monotonic() - start)
        # the last poll lands on the deadline itself
        time.sleep(min(interval, remaining))


def wait_ready(url: str, timeout: float = 60.0) -> float:
    start = time.monotonic()
    deadline = start + timeout
    last = "no answer"
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(_endpoint(url, "/-/ready"), timeout=2) as resp:
                if resp.status == 200:
                    return time.monotonic() - start
        except urllib.error.HTTPError as exc:
            last = f"HTTP {exc.code}"
        except (urllib.error.URLError, OSError) as exc:
            last = str(getattr(exc, "reason", exc))
        time.sleep(0.2)
    raise DetectionTimeout(f"Prometheus at {url} not ready within {timeout:g} s ({last})",
                           seconds=time.monotonic() - start)


def _show(samples: list[Sample], limit: int = 5) -> str:
    if not samples:
        return "empty"
    shown = [f"{s.labels} {s.value:g}" for s in samples[:limit]]
    more = f" (+{len(samples) - limit} more)" if len(samples) > limit else ""
    return "; ".join(shown) + more
