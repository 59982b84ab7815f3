"""Two scrapes of an agent's /metrics -> a Snapshot of per-second rates.

Counters are differenced per series. A series that went backwards was reset
(the agent restarted) and counts from zero; a series missing from the
earlier scrape also counts from zero, because the agent exports a label set
from its first call on. A histogram resets as a whole: its buckets are one
kernel array, so one bucket going backwards means all of them did.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

from ..exporter import text_parse
from .model import RATES, TOTALS, Snapshot, add_to_rows, estimate_quantile, io_row_for
from .panels import gpu_rows, job_rows, rdma_error_rows, rdma_object_rows

IO_PREFIX = "tracehound_io_"
ERRORS = re.compile(r"^tracehound_io_\w+_errors_total$")
LATENCY_OPS = ("read", "write")


def _key(labels: dict, drop: str = "") -> tuple:
    return tuple(sorted((k, v) for k, v in labels.items() if k != drop))


@dataclass
class Scrape:
    """One parse of the exposition text, taken at a monotonic time."""
    taken_at: float
    families: set = field(default_factory=set)
    # sample name -> {sorted label items: value}
    samples: dict = field(default_factory=dict)

    def series(self, name: str):
        return self.samples.get(name, {})

    def has(self, family: str) -> bool:
        return family in self.families

    def values(self, name: str) -> list:
        """[(labels, value)] of one sample name."""
        return [(dict(k), v) for k, v in self.series(name).items()]


WANTED = ("tracehound_io_", "tracehound_rdma_", "tracehound_gpu_", "tracehound_cgroup_")
CPU = "tracehound_cgroup_cpu_seconds_total"
UNUSED = ("tracehound_io_fsync_latency",)


def parse_metrics(text: str, taken_at: float) -> Scrape:
    """Prometheus text exposition -> Scrape, keeping only what top shows.

    An agent on a busy node exports thousands of label sets and a refresh
    must stay well under a second, so lines of other metrics are dropped
    before any parsing (exporter/text_parse.py)."""
    scrape = Scrape(taken_at)
    parsed = text_parse.parse(text, keep=WANTED, skip=UNUSED)
    for name, typ in parsed.types.items():
        scrape.families.add(name)
        if typ == "counter" and name.endswith("_total"):
            scrape.families.add(name[:-len("_total")])
    for name, labels, value in parsed.samples:
        scrape.samples.setdefault(name, {})[_key(labels)] = value
    return scrape


def counter_delta(current: float, previous) -> float:
    if previous is None or current < previous:
        return current
    return current - previous


def counter_deltas(prev: Scrape, cur: Scrape, name: str) -> list:
    """[(labels, delta, current value)] for one counter sample name."""
    before = prev.series(name)
    return [(dict(k), counter_delta(v, before.get(k)), v) for k, v in cur.series(name).items()]


def histogram_deltas(prev: Scrape, cur: Scrape, base: str) -> list:
    """[(labels without le, [(bound, cumulative delta)])] for one histogram."""
    def grouped(scrape):
        out: dict[tuple, dict[float, float]] = {}
        for k, v in scrape.series(base + "_bucket").items():
            labels = dict(k)
            bound = float(labels.pop("le", "+Inf"))
            out.setdefault(_key(labels), {})[bound] = v
        return out

    before = grouped(prev)
    result = []
    for key, buckets in grouped(cur).items():
        old = before.get(key, {})
        reset = any(v < old.get(b, 0.0) for b, v in buckets.items())
        delta = [(b, v if reset else v - old.get(b, 0.0)) for b, v in sorted(buckets.items())]
        result.append((dict(key), delta))
    return result


def _rates(prev: Scrape, cur: Scrape, name: str, seconds: float) -> list:
    return [(labels, d / seconds) for labels, d, _ in counter_deltas(prev, cur, name)]


def _cpu_cores(prev: Scrape, cur: Scrape, seconds: float) -> list:
    """Cores per cgroup over the interval; NaN (not known) for a cgroup the
    agent reads for the first time: its counter brings all the CPU time of
    its life, which is not this interval's."""
    before = prev.series(CPU)
    return [(dict(k), counter_delta(v, before[k]) / seconds if k in before else math.nan)
            for k, v in cur.series(CPU).items()]


def _merge(into: dict, buckets: list) -> None:
    for bound, count in buckets:
        into[bound] = into.get(bound, 0.0) + count


def snapshot(prev: Scrape, cur: Scrape, source: str) -> Snapshot:
    seconds = cur.taken_at - prev.taken_at
    if seconds <= 0:
        raise ValueError("the second scrape must be taken after the first")
    rows: dict = {}
    # totals first: rows then appear in the order of the bytes series, as
    # they do from the Prometheus source
    for attr, name in TOTALS:
        add_to_rows(rows, attr, cur.values(name))
    for attr, name in RATES:
        add_to_rows(rows, attr, _rates(prev, cur, name, seconds))
    for name in sorted(n for n in cur.samples if ERRORS.match(n)):
        add_to_rows(rows, "errors_per_second", _rates(prev, cur, name, seconds))

    # per row: op -> {bound: delta}, merged over the row's cgroups
    hists: dict[int, dict[str, dict[float, float]]] = {}
    for op in LATENCY_OPS:
        for labels, buckets in histogram_deltas(prev, cur, f"{IO_PREFIX}{op}_latency_seconds"):
            row = io_row_for(rows, labels)
            _merge(hists.setdefault(id(row), {}).setdefault(op, {}), buckets)
    for row in rows.values():
        per_op = hists.get(id(row), {})
        both: dict[float, float] = {}
        for op, buckets in per_op.items():
            _merge(both, buckets.items())
            setattr(row, f"{op}_latency_p99_seconds", estimate_quantile(0.99, buckets.items()))
        row.latency_p50_seconds = estimate_quantile(0.5, both.items())
        row.latency_p99_seconds = estimate_quantile(0.99, both.items())

    def present(family, name):
        return cur.values(name) if cur.has(family) else None

    def rates_of(name):
        return _rates(prev, cur, name, seconds)

    io = list(rows.values())
    return Snapshot(
        source=source,
        io=io,
        jobs=job_rows(io, _cpu_cores(prev, cur, seconds),
                      cur.values("tracehound_cgroup_memory_rss_bytes"),
                      cur.values("tracehound_cgroup_processes")),
        rdma_objects=rdma_object_rows(
            present("tracehound_rdma_objects", "tracehound_rdma_objects")),
        rdma_errors=rdma_error_rows(
            present("tracehound_rdma_verb_errors", "tracehound_rdma_verb_errors_total"),
            rates_of("tracehound_rdma_verb_errors_total")),
        gpus=gpu_rows(
            present("tracehound_gpu_temperature_celsius", "tracehound_gpu_temperature_celsius"),
            present("tracehound_gpu_clock_event_active", "tracehound_gpu_clock_event_active"),
            # every agent reads XIDs from the kernel log: only one counted makes a panel
            present("tracehound_gpu_xid_errors", "tracehound_gpu_xid_errors_total") or None,
            rates_of("tracehound_gpu_xid_errors_total")),
        interval_seconds=seconds)
