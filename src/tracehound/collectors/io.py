"""The I/O probe's decoded counters -> Prometheus metric families, at scrape time.

Values come as flat arrays in struct io_stats' order (probes/io.py decodes
them); this module only sums them per label set and names them.
"""
from __future__ import annotations

import array

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily

from ..attribution.owners import Owners
from ..attribution.workload import WORKLOAD_LABELS
from ..exporter.series import SeriesBook
from ..host.mounts import MountTable
from ..probes.io import HEALTH, HIST_SLOTS, HISTS, KEY_DEV, N_FIELDS, OPS, IoKey

# Exported bucket bounds: 2^k ns for k in 10..31 (1 us .. 2.1 s). Kernel
# slots below 2^10 ns fold into the first bucket; slot 31 only reaches +Inf.
FIRST_EXPORTED_POW = 10
# where label sets beyond the series cap are counted
OVERFLOW = ("__overflow__",) * 3 + ("",) * len(WORKLOAD_LABELS)
LABELS = ["cgroup", "mountpoint", "fstype", *WORKLOAD_LABELS]
BUCKET_BOUNDS = [(k, 2 ** k / 1e9) for k in range(FIRST_EXPORTED_POW, HIST_SLOTS)]


_CALLS, _ERRORS = 2, 2 + len(OPS)
_LAT = 2 + 2 * len(OPS)
_HIST = _LAT + len(HISTS)


class IoSample:
    """Counters for one (cgroup, mount) label set, summed over map keys.

    One flat array in the kernel's value layout: many of these are alive
    between scrapes, and a single buffer each keeps the heap from fragmenting."""
    __slots__ = ("v",)

    def __init__(self):
        self.v = array.array("Q", bytes(8 * N_FIELDS))

    def add(self, raw: array.array) -> None:
        v = self.v
        for i in range(N_FIELDS):
            v[i] += raw[i]

    def merge(self, other: "IoSample") -> None:
        self.add(other.v)

    @property
    def bytes(self) -> array.array:
        return self.v[0:2]

    @property
    def calls(self) -> list[int]:
        calls = list(self.v[_CALLS:_CALLS + len(OPS)])
        for op, row in zip(HISTS, self.hist):
            # the kernel counts these calls only in their histogram
            calls[OPS.index(op)] += sum(row)
        return calls

    @property
    def errors(self) -> array.array:
        return self.v[_ERRORS:_ERRORS + len(OPS)]

    @property
    def lat_sum_ns(self) -> array.array:
        return self.v[_LAT:_LAT + len(HISTS)]

    @property
    def hist(self) -> list[array.array]:
        return [self.v[_HIST + h * HIST_SLOTS:_HIST + (h + 1) * HIST_SLOTS]
                for h in range(len(HISTS))]


def _sample(out: dict, labels: tuple) -> IoSample:
    sample = out.get(labels)
    if sample is None:
        sample = out[labels] = IoSample()
    return sample


class IoCollector:
    """Collector over a started IoProbe: reads its counters, never its maps."""

    name = "io"

    def __init__(self, probe, mounts: MountTable, owners: Owners, max_series: int = 0):
        self.probe = probe
        self.mounts = mounts
        self.owners = owners
        self.book: SeriesBook[IoSample] = SeriesBook(IoSample, OVERFLOW, max_series)
        self.entries = 0

    def mount_labels(self, mnt: int, flags: int) -> tuple[str, str]:
        # the probe synced the mount table before handing out its counters
        table = self.mounts.by_dev if flags & KEY_DEV else self.mounts.by_id
        m = table.get(mnt)
        if m is None:
            # A mount of another mount namespace (a container): its id is
            # still stable, so the series is too.
            kind = "dev" if flags & KEY_DEV else "mnt"
            return f"{kind}:{mnt}", "unknown"
        return m.mountpoint, m.fstype

    def _labels(self, key: IoKey) -> tuple[str, ...]:
        path, *workload = self.owners.labels(key.cgroup_id)
        return (path, *self.mount_labels(key.mnt, key.flags), *workload)

    def samples(self) -> dict[tuple[str, ...], IoSample]:
        """Counters to export now per label set.

        Entries of removed cgroups are read one last time, deleted from the
        kernel map and handed to the series book, which exports them once
        more: no map growth, and every byte is exported."""
        self.owners.new_scrape()
        items = self.probe.stats()
        live: dict[tuple[str, ...], IoSample] = {}
        dead: list[IoKey] = []
        for key, values in items:
            if not self.owners.alive(key.cgroup_id):
                dead.append(key)
                continue
            _sample(live, self._labels(key)).add(values)
        retired: dict[tuple[str, ...], IoSample] = {}
        # dead before this read, so nothing can add to them any more
        for key, values in self.probe.retire(dead):
            _sample(retired, self._labels(key)).add(values)
        self.entries = len(items) - len(dead)
        gone = {k.cgroup_id for k in dead}
        self.owners.retain(self.name, {k.cgroup_id for k, _ in items} - gone, gone)
        return self.book.scrape(live, retired)

    def collect(self):
        labels = LABELS
        samples = self.samples()

        def counter(name, doc):
            return CounterMetricFamily(f"tracehound_io_{name}", doc, labels=labels)

        read_b = counter("read_bytes", "Bytes returned by read-type calls (return value, not request size).")
        write_b = counter("write_bytes", "Bytes accepted by write-type calls (return value, not request size).")
        reqs = {op: counter(f"{op}_requests", f"{op} calls, successful or not.") for op in OPS}
        errs = {op: counter(f"{op}_errors", f"{op} calls that returned an error.") for op in OPS}
        hists = {h: HistogramMetricFamily(f"tracehound_io_{h}_latency_seconds",
                                          f"Latency of {h} calls (log2 buckets).", labels=labels)
                 for h in HISTS}
        for lv, s in samples.items():
            lv = list(lv)
            nbytes, calls, errors, lat, rows = s.bytes, s.calls, s.errors, s.lat_sum_ns, s.hist
            read_b.add_metric(lv, nbytes[0])
            write_b.add_metric(lv, nbytes[1])
            for i, op in enumerate(OPS):
                reqs[op].add_metric(lv, calls[i])
                errs[op].add_metric(lv, errors[i])
            for i, h in enumerate(HISTS):
                row = rows[i]
                cum = sum(row[:FIRST_EXPORTED_POW - 1])
                buckets = []
                for k, bound in BUCKET_BOUNDS:
                    # slot k-1 holds [2^(k-1), 2^k) ns, so it is <= 2^k ns
                    cum += row[k - 1]
                    buckets.append((repr(bound), cum))
                buckets.append(("+Inf", sum(row)))
                hists[h].add_metric(lv, buckets, lat[i] / 1e9)
        yield read_b
        yield write_b
        for op in OPS:
            yield reqs[op]
            yield errs[op]
        yield from hists.values()
        yield self._workload_info(samples)
        yield from self._health()

    def _workload_info(self, samples) -> GaugeMetricFamily:
        fam = GaugeMetricFamily(
            "tracehound_workload_info",
            "The workload a cgroup belongs to (always 1), for joins on the cgroup label.",
            labels=["cgroup", *WORKLOAD_LABELS])
        for lv in {(lv[0], *lv[3:]) for lv in samples if lv != OVERFLOW}:
            fam.add_metric(list(lv), 1)
        return fam

    def _health(self):
        fam = CounterMetricFamily("tracehound_map_full_drops",
                                  "Updates dropped because a BPF map was full.", labels=["map"])
        drops = self.probe.drops()
        for name in HEALTH:
            fam.add_metric([name], drops[name])
        yield fam
        entries = GaugeMetricFamily("tracehound_map_entries",
                                    "Entries in a BPF map after this scrape's clean-up.",
                                    labels=["map"])
        entries.add_metric(["io_stats"], self.entries)
        yield entries
        tracked = GaugeMetricFamily("tracehound_series_tracked",
                                    "Label sets the collector keeps state for.",
                                    labels=["collector"])
        tracked.add_metric(["io"], self.book.series)
        yield tracked
        overflow = CounterMetricFamily(
            "tracehound_series_overflow",
            "Label sets folded into the __overflow__ series because the series cap "
            "(--max-series) was reached.", labels=["collector"])
        overflow.add_metric(["io"], self.book.folded_total)
        yield overflow
