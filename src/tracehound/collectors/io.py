"""The I/O probe's decoded counters -> Prometheus metric families, at scrape time.

Values come as flat arrays in struct io_stats' order (probes/io.py decodes
them); this module only sums them per label set and names them. Families are
rows.Rows: label blocks are rendered once per label set and kept while
it lives, so a scrape of thousands of series only formats numbers.
"""
from __future__ import annotations

import array
import sys
import threading
from collections.abc import Callable

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from .. import defaults
from ..attribution.owners import Owners
from ..attribution.workload import SCHEDULED, SYSTEMD, WORKLOAD_LABELS
from ..exporter.rows import Blocks, HistogramRows, Log2Histogram, Slices, ValueRows
from ..exporter.series import SeriesBook
from ..host.mounts import MountTable
from ..probes.io_maps import (CACHE_FILL, HEALTH, HIST_SLOTS, HISTS, KEY_DEV, KEY_FOREIGN,
                              LOOKUP_OPS, N_FIELDS, OPS, IoKey)

# Exported bucket bounds: 2^k ns for k in 10..31 (1 us .. 2.1 s). Kernel
# slots below 2^10 ns fold into the first bucket; slot 31 only reaches +Inf.
FIRST_EXPORTED_POW = 10
LATENCY = Log2Histogram(HIST_SLOTS, 1e-9, FIRST_EXPORTED_POW)
# where label sets beyond the series cap are counted
OVERFLOW = ("__overflow__",) * 3 + ("",) * len(WORKLOAD_LABELS)
LABELS = ["cgroup", "mountpoint", "fstype", *WORKLOAD_LABELS]
_KIND = LABELS.index("workload")
# the workload kind in Owners.labels() (cgroup path, *workload)
_OWNER_KIND = 1 + WORKLOAD_LABELS.index("workload")
# The kernel's table is kept under ROOM_HIGH of its slots (down to ROOM_LOW)
# by evicting entries of no scheduled workload: anyone mints entries (one per
# mount written through, and any user makes mounts in a namespace of their
# own), and a job, pod or VM must find room for its first write.
ROOM_HIGH, ROOM_LOW = 0.875, 0.75
BUCKET_BOUNDS = list(zip(range(FIRST_EXPORTED_POW, HIST_SLOTS), LATENCY.bounds))
# --latency-histograms (defaults.LATENCY_HISTOGRAM_CHOICES): the indexes in
# LABELS each latency histogram keeps (None: all); the counters keep all.
# workload-mount keeps every label but the cgroup, the task and the
# container: one histogram per workload (a Slurm job step, a pod, a VM, a
# unit: the rows of `top`) and mount, over the cgroups it has; the cgroups
# of no workload, whose workload labels are all empty, share one per mount.
HISTOGRAM_LABELS = {
    # a job's (or step's), pod's or VM's latency per mount, not each task's
    # or container's: the histograms are most of a node's series otherwise
    "workload-mount": tuple(i for i, name in enumerate(LABELS)
                            if name not in ("cgroup", "task", "container")),
    "cgroup-mount": None,
    "cgroup": (0, *range(3, len(LABELS))),
    "mount": (1, 2),
    "off": (),
}


_CALLS, _ERRORS, _NOT_FOUND = 2, 2 + len(OPS), 2 + 2 * len(OPS)
_LAT = 2 + 3 * len(OPS)
_HIST = _LAT + len(HISTS)
_ORDER = sys.byteorder             # array('Q') is in native order


# owner_of: a cgroup this scrape does not export (another node's, or removed)
_OUT_OF_SCOPE = ("(out of scope)",)

class IoSample:
    """Counters for one (cgroup, mount) label set, summed over map keys.

    One flat array in the kernel's value layout: many of these are alive
    between scrapes, and a single buffer each keeps the heap from fragmenting.
    A sample built from a decoded entry adopts its array (no copy): most
    label sets have exactly one entry."""
    __slots__ = ("_v", "_sum")

    def __init__(self, values: array.array | None = None):
        self._v = values if values is not None else array.array("Q", bytes(8 * N_FIELDS))
        self._sum: int | None = None

    def add(self, raw: array.array) -> None:
        # Sums as one big integer of 64-bit lanes: a C-speed vector add
        # (entries folded into one label set can be tens of thousands). A
        # lane cannot carry into the next: no counter comes near 2^64.
        if self._sum is None:
            self._sum = int.from_bytes(self._v, _ORDER)
        self._sum += int.from_bytes(raw, _ORDER)

    def merge(self, other: "IoSample") -> None:
        self.add(other.v)

    @property
    def v(self) -> array.array:
        """The counters, in struct io_stats' order."""
        if self._sum is not None:
            self._v = array.array("Q", self._sum.to_bytes(8 * N_FIELDS, _ORDER))
            self._sum = None
        return self._v

    @property
    def calls(self) -> list[int]:
        return list(self.v[_CALLS:_CALLS + len(OPS)])


def _add_to(out: dict, labels: tuple, values: array.array) -> None:
    """Sum values into the label set's sample (adopting the array for the
    first: add() never writes into it)."""
    sample = out.get(labels)
    if sample is None:
        out[labels] = IoSample(values)
    else:
        sample.add(values)


def _join(owner: tuple[str, ...], mount: tuple[str, str]) -> tuple[str, ...]:
    """(cgroup path, *workload) and (mountpoint, fstype) in LABELS order."""
    return (owner[0], *mount, *owner[1:])


class IoCollector:
    """Collector over a started IoProbe: a scrape reads its counters and
    changes nothing. Entries of removed cgroups are retired by `retire_dead`,
    which the agent runs on its own schedule (subsystems/io.py), whether or
    not anyone scrapes: the kernel map stays bounded by the cgroups alive."""

    name = "io"

    def __init__(self, probe, mounts: MountTable, owners: Owners, max_series: int = 0,
                 latency_histograms: str = defaults.LATENCY_HISTOGRAMS,
                 timed: frozenset[str] = frozenset(HISTS)):
        if latency_histograms not in HISTOGRAM_LABELS:
            raise ValueError(f"latency histograms by {latency_histograms!r}: expected one of "
                             + ", ".join(HISTOGRAM_LABELS))
        self.probe = probe
        self.mounts = mounts
        self.owners = owners
        # a job's, pod's or VM's label set is never the one that folds
        self.book: SeriesBook[IoSample] = SeriesBook(
            IoSample, OVERFLOW, max_series, keeps=lambda labels: labels[_KIND] in SCHEDULED)
        self.histogram_labels = HISTOGRAM_LABELS[latency_histograms]
        # operations the kernel times: the others have no histogram to show
        self.timed = timed
        self.blocks = Blocks(LABELS)
        self.workload_blocks = Blocks(["cgroup", *WORKLOAD_LABELS])
        self.entries = 0
        self.evicted = 0                  # entries make_room took out
        # a scrape's read and a retirement never interleave: an entry is
        # exported either live or retired, never both in one scrape
        self._lock = threading.Lock()

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

    def samples(self) -> dict[tuple[str, ...], IoSample]:
        """Counters to export now per label set: the entries of live cgroups
        and what was retired since the last scrape, once more. A removed
        cgroup's entries wait for their retirement (seconds): named now,
        a cgroup removed before it was ever seen could only be "unknown".
        Label sets are admitted (or folded into overflow) as entries are
        read, so entries beyond the series cap never pile up."""
        with self._lock:
            self.owners.new_scrape()
            live: dict[tuple[str, ...], IoSample] = {}
            # looked up once per cgroup and per mount, not once per entry
            owner_of: dict[int, tuple[str, ...]] = {}
            mount_of: dict[tuple[int, int], tuple[str, str]] = {}
            admit = self.book.admit
            total = 0
            for key, values in self.probe.stats():
                total += 1
                cgid = key.cgroup_id
                owner = owner_of.get(cgid)
                if owner is None:
                    if not self.owners.alive(cgid):
                        owner = owner_of[cgid] = _OUT_OF_SCOPE
                    else:
                        owner = owner_of[cgid] = self.owners.labels(cgid)
                        if not self.owners.in_scope(owner[0]):   # another node's (--cgroup-scope)
                            owner = owner_of[cgid] = _OUT_OF_SCOPE
                if owner is _OUT_OF_SCOPE:
                    continue
                mount = mount_of.get((key.mnt, key.flags))
                if mount is None:
                    mount = mount_of[key.mnt, key.flags] = self.mount_labels(key.mnt, key.flags)
                _add_to(live, admit(_join(owner, mount)), values)
            self.entries = total
            return self.book.scrape(live)

    def retire_dead(self) -> int:
        """Entries of removed cgroups: read one last time, deleted from the
        kernel map and handed to the series book, which the next scrape
        exports once more: no map growth, and every byte is exported.
        Returns how many entries went."""
        with self._lock:
            return len(self._retire_dead(list(self.probe.keys())))

    def make_room(self) -> int:
        """When the kernel's table is over ROOM_HIGH full, evict entries down
        to ROOM_LOW: never a job's, pod's or VM's; first those of no
        workload, a mount a user namespace owns (the kernel marks them),
        then one the agent's namespace does not have, before its own, then
        those of systemd units. The kernel keeps the last of the table for
        cgroups root made on mounts no user owns (IO_RESERVED_SHARE), so
        only those can take it past ROOM_LOW. Each is read
        one last time and handed to the series book, as a removed cgroup's
        is: its counts are exported, and a later write through the same
        mount starts a new entry. Returns how many entries went."""
        with self._lock:
            return self._make_room(list(self.probe.keys()))

    def housekeeping(self) -> int:
        """The agent's schedule: removed cgroups' entries leave the table,
        then room is made when it is nearly full (the table read once)."""
        with self._lock:
            keys = list(self.probe.keys())
            dead = set(self._retire_dead(keys))
            return len(dead) + self._make_room([k for k in keys if k not in dead])

    def _retire_dead(self, keys: list[IoKey]) -> list[IoKey]:
        self.owners.new_scrape()
        kept: dict[int, bool] = {}
        dead: list[IoKey] = []
        for key in keys:
            ok = kept.get(key.cgroup_id)
            if ok is None:
                ok = kept[key.cgroup_id] = not self.owners.removed(key.cgroup_id)
            if not ok:
                dead.append(key)
        # dead before this read, so nothing can add to them any more; their
        # names are kept until the pruning that follows this turn
        self._retire(dead, self.owners.labels)
        gone = {k.cgroup_id for k in dead}
        self.owners.retain(self.name, {cg for cg, ok in kept.items() if ok}, gone)
        return dead

    def _make_room(self, keys: list[IoKey]) -> int:
        slots = self.probe.config.max_entries
        if len(keys) <= slots * ROOM_HIGH:
            return 0
        self.owners.new_scrape()
        owner_of: dict[int, tuple[str, ...]] = {}

        def owner(cgid: int) -> tuple[str, ...]:
            if cgid not in owner_of:
                owner_of[cgid] = self.owners.labels(cgid)
            return owner_of[cgid]

        def order(key: IoKey) -> tuple[bool, bool, bool]:      # False first
            table = self.mounts.by_dev if key.flags & KEY_DEV else self.mounts.by_id
            return (not key.flags & KEY_FOREIGN, owner(key.cgroup_id)[_OWNER_KIND] == SYSTEMD,
                    key.mnt in table)
        candidates = [k for k in keys if owner(k.cgroup_id)[_OWNER_KIND] not in SCHEDULED]
        victims = sorted(candidates, key=order)[:len(keys) - int(slots * ROOM_LOW)]
        self._retire(victims, owner)
        self.evicted += len(victims)
        return len(victims)

    def _retire(self, keys: list[IoKey], owner_of: Callable[[int], tuple[str, ...]]) -> None:
        """Read KEYS one last time, free their slots, and hand their values to
        the series book under their labels (this agent's cgroups only)."""
        retired: dict[tuple[str, ...], IoSample] = {}
        for key, values in self.probe.retire(keys):
            owner = owner_of(key.cgroup_id)
            if self.owners.in_scope(owner[0]):
                _add_to(retired, _join(owner, self.mount_labels(key.mnt, key.flags)), values)
        self.book.retire(retired)

    def collect(self):
        samples = self.samples()
        self.blocks.rotate()
        get = self.blocks.get
        blocks = [get(lv) for lv in samples]
        rows = list(samples.values())

        def counter(name, doc, values):
            # a series is born on its counter's first increment: most label
            # sets never error, unlink or rename, and a node's exposition
            # would be mostly zeros (docs/metrics.md, "Fleet cost")
            moved = [i for i, v in enumerate(values) if v]
            return ValueRows(f"tracehound_io_{name}", doc, "counter",
                             [blocks[i] for i in moved], [values[i] for i in moved])

        yield counter("read_bytes",
                      "Bytes returned by read-type calls (return value, not request size).",
                      [s.v[0] for s in rows])
        yield counter("write_bytes",
                      "Bytes accepted by write-type calls (return value, not request size).",
                      [s.v[1] for s in rows])
        yield counter("pagecache_fill_bytes",
                      "Bytes of file pages added to the page cache: read-ahead, read misses, "
                      "memory-mapped page faults, and pages a write allocated.",
                      [s.v[CACHE_FILL] for s in rows])
        calls = [s.calls for s in rows]
        for i, op in enumerate(OPS):
            yield counter(f"{op}_requests", f"{op} calls, successful or not.",
                          [c[i] for c in calls])
            yield counter(f"{op}_errors", f"{op} calls that returned an error"
                          + (" other than ENOENT." if op in LOOKUP_OPS else "."),
                          [s.v[_ERRORS + i] for s in rows])
            if op in LOOKUP_OPS:
                yield counter(f"{op}_not_found", f"{op} calls that failed with ENOENT "
                              "(a name that does not exist: library search, rm -f).",
                              [s.v[_NOT_FOUND + i] for s in rows])
        yield from self._histograms(samples)
        yield self._workload_info(samples)
        yield from self._health()

    def _histograms(self, samples: dict[tuple[str, ...], IoSample]):
        keep = self.histogram_labels
        if keep == () or not self.timed:
            return
        if keep is None:
            groups = samples
        else:
            # sum each histogram over the labels it does not keep
            groups = {}
            blank = ("",) * len(LABELS)
            for lv, s in samples.items():
                key = list(blank)
                for i in keep:
                    key[i] = lv[i]
                _add_to(groups, tuple(key), s.v)
        get = self.blocks.get
        for h, op in enumerate(HISTS):
            if op not in self.timed:
                continue
            at = _HIST + h * HIST_SLOTS
            # as the counters: a histogram is born with its first timed call
            timed = [(lv, s.v) for lv, s in groups.items() if any(s.v[at:at + HIST_SLOTS])]
            rows = [v for _lv, v in timed]
            yield HistogramRows(f"tracehound_io_{op}_latency_seconds",
                                f"Latency of {op} calls (log2 buckets).",
                                [get(lv) for lv, _v in timed], Slices(rows, at, HIST_SLOTS),
                                [v[_LAT + h] / 1e9 for v in rows], LATENCY)

    def _workload_info(self, samples) -> ValueRows:
        self.workload_blocks.rotate()
        get = self.workload_blocks.get
        blocks = [get(lv) for lv in dict.fromkeys((lv[0], *lv[3:]) for lv in samples
                                                  if lv != OVERFLOW)]
        return ValueRows("tracehound_workload_info",
                         "The workload a cgroup belongs to (always 1), for joins on the "
                         "cgroup label.", "gauge", blocks, [1] * len(blocks))

    def _health(self):
        # map="io_stats_reserve": a new entry of a user's cgroup or mount
        # found only the room kept for the node's own (docs/metrics.md)
        fam = CounterMetricFamily("tracehound_map_full_drops",
                                  "Updates dropped because a BPF map was full.", labels=["map"])
        drops = self.probe.drops()
        for name in HEALTH:
            fam.add_metric([name], drops[name])
        yield fam
        timed = self.probe.timed_calls()
        if timed:
            fam = CounterMetricFamily(
                "tracehound_io_latency_timed_calls",
                "Calls whose latency the kernel timed, all cgroups together. With sampled "
                "timing, when calls of a kind come fast on a CPU only some are timed, and "
                "each counts in the latency histograms as the calls it stands for; compare "
                "with the requests.", labels=["op"])
            for op, n in timed.items():
                fam.add_metric([op], n)
            yield fam
            # timed calls are only counted apart when calls are sampled
            yield GaugeMetricFamily(
                "tracehound_io_latency_sample_gap_seconds",
                "Sampled timing: about one call of a kind per CPU is timed in this long "
                "while calls come faster (--latency-sample-gap, or picked by the clock "
                "source).", value=self.probe.config.sample_gap_ns / 1e9)
        entries = GaugeMetricFamily("tracehound_map_entries",
                                    "Entries in a BPF map as this scrape read it.",
                                    labels=["map"])
        entries.add_metric(["io_stats"], self.entries)
        yield entries
        evicted = CounterMetricFamily(
            "tracehound_map_evictions",
            "Entries the agent took out of a nearly full BPF map to keep room for jobs, "
            "pods and VMs (their counts exported once more; none of a job's).",
            labels=["map"])
        evicted.add_metric(["io_stats"], self.evicted)
        yield evicted
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
