"""What the live view shows, independent of where the numbers came from.

Every number is in base units (bytes, seconds, operations, per second);
None means "not known in this interval" (no calls, so no latency), which is
different from 0.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Iterable, Optional

from ..attribution.workload import WORKLOAD_LABELS

# the fallback kind: rows of cgroups that no workload manager claims
CGROUP_KIND = "cgroup"
# labels whose emptiness decides that a row falls back to its cgroup path
NAMING_LABELS = ("job_id", "pod", "vm", "unit")


def workload_identity(labels: dict) -> tuple[str, str]:
    """(kind, name) of the most specific workload a series belongs to.

    The name is built from the workload labels only, so the cgroups of one
    job step (its tasks, its helpers) or of one pod (its containers, its
    sandbox) land on one row, as the agent's latency histograms sum them;
    a series without any of NAMING_LABELS is named by its cgroup path
    instead."""
    get = labels.get
    kind = get("workload", "") or CGROUP_KIND
    if not any(get(k) for k in NAMING_LABELS):
        return kind, get("cgroup", "") or "?"
    if get("job_id"):
        name = get("job_id")
        if get("step"):
            name += "." + get("step")
        return kind, name
    if get("pod"):
        return kind, "/".join(p for p in (get("namespace"), get("pod")) if p)
    return kind, get("vm") or get("unit")


@dataclass
class IoRow:
    kind: str
    name: str
    mountpoint: str
    fstype: str
    workload: dict = field(default_factory=dict)
    cgroups: list = field(default_factory=list)
    read_bytes_per_second: float = 0.0
    write_bytes_per_second: float = 0.0
    read_ops_per_second: float = 0.0
    write_ops_per_second: float = 0.0
    errors_per_second: float = 0.0
    latency_p50_seconds: Optional[float] = None
    latency_p99_seconds: Optional[float] = None
    read_latency_p99_seconds: Optional[float] = None
    write_latency_p99_seconds: Optional[float] = None
    read_bytes_total: float = 0.0
    write_bytes_total: float = 0.0

    @property
    def ops_per_second(self) -> float:
        return self.read_ops_per_second + self.write_ops_per_second

    def as_json(self) -> dict:
        out = asdict(self)
        out["ops_per_second"] = self.ops_per_second
        return out


def io_row_for(rows: dict, labels: dict) -> IoRow:
    """The row a series adds to, created on first use."""
    kind, name = workload_identity(labels)
    key = (kind, name, labels.get("mountpoint", ""), labels.get("fstype", ""))
    row = rows.get(key)
    if row is None:
        row = rows[key] = IoRow(kind, name, key[2], key[3],
                                workload={k: labels.get(k, "") for k in WORKLOAD_LABELS})
    cgroup = labels.get("cgroup")
    if cgroup and cgroup not in row.cgroups:
        row.cgroups.append(cgroup)
    return row


# IoRow attribute <- the counter's current value, or its per-second rate
TOTALS = (("read_bytes_total", "tracehound_io_read_bytes_total"),
          ("write_bytes_total", "tracehound_io_write_bytes_total"))
RATES = (("read_bytes_per_second", "tracehound_io_read_bytes_total"),
         ("write_bytes_per_second", "tracehound_io_write_bytes_total"),
         ("read_ops_per_second", "tracehound_io_read_requests_total"),
         ("write_ops_per_second", "tracehound_io_write_requests_total"))


def add_to_rows(rows: dict, attr: str, series: Iterable) -> None:
    """Adds each (labels, value) to its row's `attr`: the series of one row sum."""
    for labels, value in series:
        row = io_row_for(rows, labels)
        setattr(row, attr, getattr(row, attr) + value)


def job_identity(labels: dict) -> Optional[tuple[str, str]]:
    """(kind, name) of the job, pod, VM or unit a series belongs to, without
    its step or task; None for a cgroup no workload manager claims."""
    get = labels.get
    kind = get("workload", "") or CGROUP_KIND
    if get("job_id"):
        return kind, get("job_id")
    if get("pod"):
        return kind, "/".join(p for p in (get("namespace"), get("pod")) if p)
    if get("vm") or get("unit"):
        return kind, get("vm") or get("unit")
    return None


@dataclass
class JobRow:
    """One job (pod, VM, unit) over all its cgroups, each counted once.

    CPU time is a cgroup's and its descendants' (cpu.stat), and a Slurm job
    has it at job, step, user and task level: only the job's topmost
    cgroups on each node count. Processes and resident memory are each
    cgroup's own, and I/O is counted by the cgroup that did it: those add
    up over all the job's cgroups."""
    kind: str
    name: str
    nodes: list = field(default_factory=list)
    cgroups: int = 0
    cpu_cores: Optional[float] = None
    memory_rss_bytes: Optional[float] = None
    processes: Optional[float] = None
    stopped_processes: float = 0.0
    read_bytes_per_second: float = 0.0
    write_bytes_per_second: float = 0.0
    io_errors_per_second: float = 0.0


@dataclass
class RdmaObjectRow:
    cgroup: str
    device: str
    type: str
    count: float


@dataclass
class RdmaErrorRow:
    op: str
    errno: str
    errors_per_second: float
    errors_total: float


@dataclass
class GpuRow:
    gpu: str
    model: str = ""
    uuid: str = ""
    node: str = ""            # the scrape target, where a fleet's series are mixed
    temperature_celsius: Optional[float] = None
    memory_temperature_celsius: Optional[float] = None
    throttle_reasons: list = field(default_factory=list)
    xid_errors_total: float = 0.0
    xid_errors_per_second: float = 0.0
    xids: dict = field(default_factory=dict)   # XID number -> total


@dataclass
class Snapshot:
    """One refresh: rows plus which metric families the source had at all.

    A panel whose list is None had no such metrics ("no data"); an empty
    list means the metrics exist but have no series right now."""
    source: str
    io: list = field(default_factory=list)
    rdma_objects: Optional[list] = None
    rdma_errors: Optional[list] = None
    gpus: Optional[list] = None
    jobs: list = field(default_factory=list)
    interval_seconds: Optional[float] = None
    window: Optional[str] = None

    def as_json(self, sort: str = "write") -> dict:
        def rows(items):
            return None if items is None else [asdict(r) for r in items]
        return {
            "source": self.source,
            "interval_seconds": self.interval_seconds,
            "window": self.window,
            "sort": sort,
            "io": [r.as_json() for r in self.io],
            "rdma": {"objects": rows(self.rdma_objects), "verb_errors": rows(self.rdma_errors)},
            "gpu": rows(self.gpus),
            "jobs": rows(self.jobs),
        }


def estimate_quantile(q: float, buckets: Iterable[tuple[float, float]]) -> Optional[float]:
    """q-quantile from cumulative (upper bound, count) pairs ending at +Inf.

    Linear interpolation inside the bucket holding the rank. The first
    bucket is taken to span [bound / ratio, bound] like its neighbours (log2
    buckets: half its bound), and a rank in the +Inf bucket reports the
    highest finite bound, since nothing is known above it."""
    pairs = sorted(buckets)
    if not pairs:
        return None
    total = pairs[-1][1]
    if total <= 0:
        return None
    finite = [b for b, _ in pairs if not math.isinf(b)]
    if len(finite) >= 2 and finite[0] > 0:
        lower = finite[0] * finite[0] / finite[1]
    else:
        lower = 0.0
    rank = q * total
    below = 0.0
    for bound, cum in pairs:
        cum = max(cum, below)       # deltas of a racing scrape must not go backwards
        if cum >= rank and cum > below:
            if math.isinf(bound):
                return finite[-1] if finite else None
            return lower + (bound - lower) * (rank - below) / (cum - below)
        if not math.isinf(bound):
            lower = bound
        below = cum
    return finite[-1] if finite else None


SORT_KEYS = {
    # name: (row -> value, biggest first)
    "read": (lambda r: r.read_bytes_per_second, True),
    "write": (lambda r: r.write_bytes_per_second, True),
    "iops": (lambda r: r.ops_per_second, True),
    "p99": (lambda r: r.latency_p99_seconds, True),
    "errors": (lambda r: r.errors_per_second, True),
    "name": (lambda r: (r.name, r.mountpoint), False),
}


def sort_rows(rows: list, key: str, reverse: bool = False) -> list:
    """Sorted copy; rows without a value (no latency) go last either way.

    `reverse` flips the column's natural direction; ties keep a stable
    name order so the screen does not jump between refreshes."""
    get, descending = SORT_KEYS[key]
    if reverse:
        descending = not descending
    by_name = sorted(rows, key=lambda r: (r.name, r.mountpoint))
    known = [r for r in by_name if get(r) is not None]
    unknown = [r for r in by_name if get(r) is None]
    return sorted(known, key=get, reverse=descending) + unknown


def filter_rows(rows: list, text: str) -> list:
    """Rows whose workload name, kind or a cgroup contains text (any case)."""
    if not text:
        return list(rows)
    needle = text.lower()
    return [r for r in rows
            if needle in r.name.lower() or needle in r.kind.lower()
            or any(needle in c.lower() for c in r.cgroups)]


def filter_rdma(rows: Optional[list], text: str) -> Optional[list]:
    if rows is None or not text:
        return rows
    return [r for r in rows if text.lower() in r.cgroup.lower()]
