"""Where the numbers come from: an agent's /metrics, or a Prometheus server.

Both answer poll() with a Snapshot. The agent source needs two scrapes to
compute rates, so its first poll() answers None; Prometheus computes rates
itself (rate() over --window), so every poll answers.
"""
from __future__ import annotations

import math
import re
import time
import urllib.error
from typing import Optional

from ..attribution.workload import WORKLOAD_LABELS
from ..clients import prometheus
from ..clients.agent_client import DEFAULT_METRICS_URL, AnswerError, read_agent
from ..errors import TracehoundError
from ..probes.io_maps import OPS
from .model import NAMING_LABELS, RATES, TOTALS, Snapshot, add_to_rows, io_row_for
from .panels import gpu_rows, job_rows, rdma_error_rows, rdma_object_rows
from .rates import Scrape, parse_metrics, snapshot

DEFAULT_URL = DEFAULT_METRICS_URL
_DURATION = re.compile(r"^(\d+(ms|s|m|h|d|w|y))+$")


class SourceError(TracehoundError):
    pass


def _get(url: str, timeout: float) -> bytes:
    """An agent's answer, bounded in bytes and time (agent_client.read_agent)."""
    try:
        return read_agent(url, timeout)
    except urllib.error.HTTPError as exc:
        body = exc.read(300).decode(errors="replace")
        raise SourceError(f"{url}: HTTP {exc.code} {body.strip()}") from None
    except AnswerError as exc:
        raise SourceError(str(exc)) from None
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        raise SourceError(f"cannot reach {url}: {reason}") from None


class MetricsSource:
    """Scrapes an agent directly; rates come from successive scrapes."""

    def __init__(self, url: str = DEFAULT_URL, timeout: float = 5.0):
        self.url = url
        self.timeout = timeout
        self.previous: Optional[Scrape] = None

    def scrape(self) -> Scrape:
        start = time.monotonic()
        # the agent's TLS settings and password (TRACEHOUND_*), over https only
        body = _get(self.url, self.timeout)
        # The agent reads its maps while answering: the middle of the request
        # is the best estimate of when the counters were read.
        taken_at = (start + time.monotonic()) / 2
        try:
            return parse_metrics(body.decode(), taken_at)
        except ValueError as exc:
            raise SourceError(f"{self.url} did not answer Prometheus text: {exc}") from None

    def poll(self) -> Optional[Snapshot]:
        current = self.scrape()
        previous, self.previous = self.previous, current
        if previous is None:
            return None
        return snapshot(previous, current, self.url)


IO_BY = ", ".join(("cgroup", "mountpoint", "fstype", *WORKLOAD_LABELS))
# (matchers, sum by): the series of a row named by its job, pod, VM or unit
# (the first of them set) are summed over their cgroups; a bare cgroup's row
# keeps its path
WORKLOAD_BY = ", ".join(("mountpoint", "fstype", *WORKLOAD_LABELS))


def _named_by(i: int) -> str:
    unset = [f'{k}=""' for k in NAMING_LABELS[:i]]
    return ", ".join([*unset, f'{NAMING_LABELS[i]}!=""'])


NAMED_PARTS = tuple((_named_by(i), WORKLOAD_BY) for i in range(len(NAMING_LABELS))) + \
    ((", ".join(f'{k}=""' for k in NAMING_LABELS), IO_BY),)
# quantile fields: (row attribute, q, operations merged into one histogram)
QUANTILES = (("latency_p50_seconds", 0.5, ("read", "write")),
             ("latency_p99_seconds", 0.99, ("read", "write")),
             ("read_latency_p99_seconds", 0.99, ("read",)),
             ("write_latency_p99_seconds", 0.99, ("write",)))
# operations with an _errors_total counter: the I/O collector exports one per op
ERROR_OPS = OPS


class PrometheusSource:
    """PromQL instant queries against a Prometheus server's HTTP API.

    Rows of a workload spread over several nodes are summed, so a Slurm job
    shows once with the bandwidth of all its nodes."""

    def __init__(self, base_url: str, window: str = "1m", selector: str = "",
                 timeout: float = 10.0):
        if not _DURATION.match(window):
            raise SourceError(f"--window {window!r} is not a PromQL duration (e.g. 30s, 1m, 5m)")
        self.base_url = base_url.rstrip("/")
        self.window = window
        self.selector = selector.strip().strip("{}").strip()
        self.timeout = timeout

    def _sel(self, name: str = "", name_regex: str = "", extra: str = "") -> str:
        matchers = [f'__name__=~"{name_regex}"'] if name_regex else []
        if self.selector:
            matchers.append(self.selector)
        if extra:
            matchers.append(extra)
        return name + "{" + ", ".join(matchers) + "}" if matchers else name

    def query(self, expr: str) -> list:
        """[(labels, value)] of an instant vector; NaN values are kept as NaN."""
        try:
            samples = prometheus.query(self.base_url, expr, timeout=self.timeout)
        except prometheus.PrometheusError as exc:
            raise SourceError(str(exc)) from None
        return [(s.labels, s.value) for s in samples]

    def _rate(self, name: str, by: str) -> list:
        return self.query(f"sum by ({by}) (rate({self._sel(name)}[{self.window}]))")

    def _quantile(self, q: float, ops: tuple) -> list:
        """From classic histograms (_bucket series with le) or native ones
        (Prometheus with --enable-feature=native-histograms keeps only
        those): each label set has one form, so the two answers are joined.
        A named workload's cgroups merge into one histogram, exactly as
        workload_identity() names rows: its series are summed without the
        cgroup label. Selected by matchers, not relabelled: label_replace
        turns a native histogram into a plain zero (Prometheus 2.42)."""
        def summed(op, native, matchers, by):
            name = f"tracehound_io_{op}_latency_seconds" + ("" if native else "_bucket")
            rate = f"rate({self._sel(name, extra=matchers)}[{self.window}])"
            return f"sum by ({by if native else 'le, ' + by}) ({rate})"

        def quantile(native, matchers, by):
            # rate() over several metric names at once would leave series with
            # equal label sets, which PromQL refuses; add them up instead, and
            # keep the label sets only one side has
            parts = [summed(op, native, matchers, by) for op in ops]
            merged = parts[0] if len(parts) == 1 else \
                f"({' + '.join(parts)}) or " + " or ".join(parts)
            return f"histogram_quantile({q}, {merged})"
        return self.query(" or ".join(quantile(native, matchers, by)
                                      for native in (False, True)
                                      for matchers, by in NAMED_PARTS))

    def io_rows(self) -> list:
        rows: dict = {}
        for attr, name in TOTALS:
            add_to_rows(rows, attr, self.query(f"sum by ({IO_BY}) ({self._sel(name)})"))
        for attr, name in RATES:
            add_to_rows(rows, attr, self._rate(name, IO_BY))
        for op in ERROR_OPS:
            add_to_rows(rows, "errors_per_second",
                        self._rate(f"tracehound_io_{op}_errors_total", IO_BY))
        for attr, q, ops in QUANTILES:
            for labels, v in self._quantile(q, ops):
                if math.isnan(v) or math.isinf(v):
                    continue
                row = io_row_for(rows, labels)
                old = getattr(row, attr)
                # several results for one row only if two label sets share
                # a name; the larger latency is the honest one to show
                setattr(row, attr, v if old is None else max(old, v))
        return list(rows.values())

    def job_rows(self, io: list) -> list:
        """The job panel's series, per node (instance) and cgroup: a job's
        cgroups nest within one node, not across nodes."""
        by = f"instance, cgroup, {', '.join(WORKLOAD_LABELS)}"
        return job_rows(
            io, self._rate("tracehound_cgroup_cpu_seconds_total", by),
            self.query(f"sum by ({by}) ({self._sel('tracehound_cgroup_memory_rss_bytes')})"),
            self.query(f"sum by ({by}, state) ({self._sel('tracehound_cgroup_processes')})"),
            node_label="instance")

    def poll(self) -> Snapshot:
        present = {labels.get("__name__", "") for labels, _ in self.query(
            f"count by (__name__) ({self._sel(name_regex='tracehound_(rdma|gpu)_.+')})")}

        def vector(name: str, expr: str):
            return self.query(expr) if name in present else None

        rdma = "tracehound_rdma_objects" in present or \
            "tracehound_rdma_verb_calls_total" in present
        gpu_by = "instance, gpu, uuid, model"
        xids = "tracehound_gpu_xid_errors_total"
        io = self.io_rows()
        return Snapshot(
            source=self.base_url,
            io=io,
            jobs=self.job_rows(io),
            rdma_objects=rdma_object_rows(
                self.query(f"sum by (cgroup, device, type) "
                           f"({self._sel('tracehound_rdma_objects')})") if rdma else None),
            rdma_errors=rdma_error_rows(
                self.query(f"sum by (op, errno) ({self._sel('tracehound_rdma_verb_errors_total')})")
                if rdma else None,
                self._rate("tracehound_rdma_verb_errors_total", "op, errno") if rdma else []),
            gpus=gpu_rows(
                vector("tracehound_gpu_temperature_celsius",
                       f"max by ({gpu_by}, sensor) "
                       f"({self._sel('tracehound_gpu_temperature_celsius')})"),
                vector("tracehound_gpu_clock_event_active",
                       f"max by ({gpu_by}, reason) "
                       f"({self._sel('tracehound_gpu_clock_event_active')})"),
                vector(xids, f"sum by ({gpu_by}, xid) ({self._sel(xids)})"),
                self._rate(xids, f"{gpu_by}, xid") if xids in present else [],
                node_label="instance"),
            window=self.window)
