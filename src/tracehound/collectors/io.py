"""io_stats map -> Prometheus metric families, read at scrape time.

The value layout mirrors struct io_stats in probes/common.h.
"""
from __future__ import annotations

import array
import struct
from dataclasses import dataclass, field

from prometheus_client.core import CounterMetricFamily, HistogramMetricFamily

from ..attribution.cgroups import CgroupResolver
from ..host.mounts import MountTable

OPS = ("read", "write", "open", "create", "unlink", "mkdir", "rmdir", "rename", "fsync")
HISTS = ("read", "write", "fsync")
HIST_SLOTS = 32
N_FIELDS = 2 + 2 * len(OPS) + len(HISTS) + len(HISTS) * HIST_SLOTS
KEY = struct.Struct("=QII")
KEY_DEV = 1

# Exported bucket bounds: 2^k ns for k in 10..31 (1 us .. 2.1 s). Kernel
# slots below 2^10 ns fold into the first bucket; slot 31 only reaches +Inf.
FIRST_EXPORTED_POW = 10
BUCKET_BOUNDS = [(k, 2 ** k / 1e9) for k in range(FIRST_EXPORTED_POW, HIST_SLOTS)]


@dataclass
class IoSample:
    """Counters for one (cgroup, mount) label set, summed over map keys."""
    bytes: list[int] = field(default_factory=lambda: [0, 0])
    calls: list[int] = field(default_factory=lambda: [0] * len(OPS))
    errors: list[int] = field(default_factory=lambda: [0] * len(OPS))
    lat_sum_ns: list[int] = field(default_factory=lambda: [0] * len(HISTS))
    hist: list[list[int]] = field(default_factory=lambda: [[0] * HIST_SLOTS for _ in HISTS])

    def add(self, v: array.array) -> None:
        o = 0
        for i in range(2):
            self.bytes[i] += v[o + i]
        o += 2
        for i in range(len(OPS)):
            self.calls[i] += v[o + i]
            self.errors[i] += v[o + len(OPS) + i]
        o += 2 * len(OPS)
        for i in range(len(HISTS)):
            self.lat_sum_ns[i] += v[o + i]
        o += len(HISTS)
        for h, op in enumerate(HISTS):
            row = self.hist[h]
            base = o + h * HIST_SLOTS
            for s in range(HIST_SLOTS):
                row[s] += v[base + s]
            # the kernel counts these calls only in their histogram
            self.calls[OPS.index(op)] += sum(v[base:base + HIST_SLOTS])


def decode_value(raw: bytes) -> array.array:
    a = array.array("Q")
    a.frombytes(raw[:N_FIELDS * 8])
    return a


class IoCollector:
    """prometheus_client collector over a loaded IoProbe's maps."""

    def __init__(self, probe, mounts: MountTable, cgroups: CgroupResolver):
        self.probe = probe
        self.mounts = mounts
        self.cgroups = cgroups

    def mount_labels(self, mnt: int, flags: int) -> tuple[str, str]:
        # samples() refreshed the table at the start of this scrape
        table = self.mounts.by_dev if flags & KEY_DEV else self.mounts.by_id
        m = table.get(mnt)
        if m is None:
            # A mount of another mount namespace (a container): its id is
            # still stable, so the series is too.
            kind = "dev" if flags & KEY_DEV else "mnt"
            return f"{kind}:{mnt}", "unknown"
        return m.mountpoint, m.fstype

    def samples(self) -> dict[tuple[str, str, str], IoSample]:
        """Current counters per (cgroup, mountpoint, fstype)."""
        self.probe.sync_mounts()
        self.cgroups.new_scrape()
        out: dict[tuple[str, str, str], IoSample] = {}
        for k, v in self.probe.obj.map("io_stats").items():
            cgid, mnt, flags = KEY.unpack(k)
            labels = (self.cgroups.path(cgid), *self.mount_labels(mnt, flags))
            sample = out.get(labels)
            if sample is None:
                sample = out[labels] = IoSample()
            sample.add(decode_value(v))
        return out

    def collect(self):
        labels = ["cgroup", "mountpoint", "fstype"]
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
            read_b.add_metric(lv, s.bytes[0])
            write_b.add_metric(lv, s.bytes[1])
            for i, op in enumerate(OPS):
                reqs[op].add_metric(lv, s.calls[i])
                errs[op].add_metric(lv, s.errors[i])
            for i, h in enumerate(HISTS):
                row = s.hist[i]
                cum = sum(row[:FIRST_EXPORTED_POW - 1])
                buckets = []
                for k, bound in BUCKET_BOUNDS:
                    # slot k-1 holds [2^(k-1), 2^k) ns, so it is <= 2^k ns
                    cum += row[k - 1]
                    buckets.append((repr(bound), cum))
                buckets.append(("+Inf", sum(row)))
                hists[h].add_metric(lv, buckets, s.lat_sum_ns[i] / 1e9)
        yield read_b
        yield write_b
        for op in OPS:
            yield reqs[op]
            yield errs[op]
        yield from hists.values()
        yield from self._health()

    def _health(self):
        fam = CounterMetricFamily("tracehound_map_full_drops",
                                  "Updates dropped because a BPF map was full.", labels=["map"])
        m = self.probe.obj.map("io_health")
        names = ("io_stats", "io_start")
        for idx, name in enumerate(names):
            fam.add_metric([name], sum(m.lookup_percpu_u64(struct.pack("I", idx))))
        yield fam
