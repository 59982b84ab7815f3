"""Decoding of the io_stats map layout and the histogram export."""
import struct

import pytest

from tracehound import defaults
from tracehound.attribution.owners import Owners
from tracehound.attribution.resolver import WorkloadResolver
from tracehound.collectors import io as col
from tracehound.host.mounts import MountTable
from tracehound.probes import io_maps as io_mod
from tracehound.probes.io import IoProbe, IoProbeConfig
from tracehound.probes.io_maps import KEY

SAMPLE = "27 1 254:0 / / rw - ext4 /dev/vda rw\n40 27 0:50 / /scratch rw - tmpfs t rw\n"


def value(read_bytes=0, write_bytes=0, calls=None, errors=None, lat=None, hist=None,
          not_found=None, cache_fill=0):
    calls = calls or [0] * len(col.OPS)
    errors = errors or [0] * len(col.OPS)
    not_found = not_found or [0] * len(col.OPS)
    lat = lat or [0] * len(col.HISTS)
    hist = hist or [[0] * col.HIST_SLOTS for _ in col.HISTS]
    flat = [read_bytes, write_bytes, *calls, *errors, *not_found, *lat, *sum(hist, []), cache_fill]
    assert len(flat) == col.N_FIELDS
    return struct.pack(f"{len(flat)}Q", *flat)


class FakeMap:
    def __init__(self, items):
        self._items = items

    def iter_items(self):
        return iter(list(self._items))

    def items(self):
        return list(self._items)

    def lookup(self, key):
        return next((v for k, v in self._items if k == key), None)

    def delete(self, key):
        self._items = [(k, v) for k, v in self._items if k != key]

    def lookup_percpu_u64(self, key):
        return [1, 2]


class FakeProbe(IoProbe):
    """A started IoProbe whose maps hold what is tested instead of loaded
    ones: the probe's own decoding is part of what is tested."""

    def __init__(self, items, mounts):
        super().__init__(IoProbeConfig(), mounts)
        self.maps = self._maps = {"io_stats": FakeMap(items), "io_health": FakeMap([])}

    def sync_mounts(self, force=False):
        pass

    # the kernel keeps each entry's key in front of its counters
    def _entries(self):
        for k, v in self.maps["io_stats"].iter_items():
            yield k, k + v

    def _retire(self, key):
        v = self.maps["io_stats"].lookup(key)
        self.maps["io_stats"].delete(key)
        return None if v is None else key + v


class FakeCgroups:
    def __init__(self):
        self.paths = {1: "/", 7: "/job/7"}
        self.dead: set[int] = set()
        self.forgotten: list[int] = []

    def new_scrape(self):
        pass

    def alive(self, cgid):
        return cgid not in self.dead

    def removed(self, cgid):
        return not self.alive(cgid)

    def forget(self, cgid):
        self.forgotten.append(cgid)

    def retain(self, in_use):
        self.retained = set(in_use)
        return []

    def path(self, cgid):
        return self.paths.get(cgid, f"unknown:{cgid}")


def collector(items, tmp_path, max_series=0, latency_histograms="cgroup-mount"):
    p = tmp_path / "mi"
    p.write_text(SAMPLE)
    workloads = WorkloadResolver(job_id_source=None, pod_source=None)
    mounts = MountTable(str(p))
    cgroups = FakeCgroups()
    c = col.IoCollector(FakeProbe(items, mounts), mounts, Owners(cgroups, workloads), max_series,
                        latency_histograms)
    c.cgroups = cgroups
    return c


def scrape(c):
    return {f.name: f for f in c.collect()}


def collect(items, tmp_path):
    return scrape(collector(items, tmp_path))


def written(fams, cgroup):
    return [s.value for s in fams["tracehound_io_write_bytes"].samples
            if s.labels["cgroup"] == cgroup]


def test_keys_for_same_mount_merge_and_dev_keys_resolve(tmp_path):
    read_hist = [[0] * col.HIST_SLOTS for _ in col.HISTS]
    read_hist[0][12] = 5               # five reads of 4-8 us
    items = [
        (KEY.pack(7, 40, 0), value(read_bytes=100, calls=[5, 0, 0, 0, 0, 0, 0, 0, 0],
                                   hist=read_hist, lat=[25_000, 0, 0])),
        (KEY.pack(7, 40, 0), value(read_bytes=1)),
        # namespace ops and page-cache fills are keyed by device (0:50 is the tmpfs)
        (KEY.pack(7, (0 << 20) | 50, col.KEY_DEV),
         value(calls=[0, 0, 0, 0, 0, 3, 0, 0, 0], errors=[0, 0, 0, 0, 0, 1, 0, 0, 0],
               not_found=[0, 0, 4, 0, 0, 2, 0, 0, 0], cache_fill=8192)),
    ]
    fams = collect(items, tmp_path)
    # workload labels that do not apply are left out
    lbl = {"cgroup": "/job/7", "mountpoint": "/scratch", "fstype": "tmpfs"}

    def val(fam, name=None):
        for s in fams[fam].samples:
            if s.labels == lbl and (name is None or s.name == name):
                return s.value
    assert val("tracehound_io_read_bytes") == 101
    assert val("tracehound_io_pagecache_fill_bytes") == 8192
    assert val("tracehound_io_read_requests") == 5      # every call, the timed ones too
    assert val("tracehound_io_mkdir_requests") == 3
    assert val("tracehound_io_mkdir_errors") == 1
    assert val("tracehound_io_mkdir_not_found") == 2
    assert val("tracehound_io_open_not_found") == 4
    # read, write and fsync cannot fail a name lookup: no such family
    assert "tracehound_io_read_not_found" not in fams
    buckets = {s.labels["le"]: s.value for s in fams["tracehound_io_read_latency_seconds"].samples
               if s.name.endswith("_bucket") and s.labels["cgroup"] == "/job/7"}
    assert buckets["4.096e-06"] == 0 and buckets["8.192e-06"] == 5 and buckets["+Inf"] == 5
    assert val("tracehound_io_read_latency_seconds", "tracehound_io_read_latency_seconds_sum") \
        == 25e-6


def test_slow_calls_only_in_inf_and_fast_ones_in_first_bucket(tmp_path):
    hist = [[0] * col.HIST_SLOTS for _ in col.HISTS]
    hist[1][31] = 2    # >= 2.1 s
    hist[1][3] = 4     # < 16 ns
    fams = collect([(KEY.pack(1, 27, 0), value(hist=hist))], tmp_path)
    b = {s.labels["le"]: s.value for s in fams["tracehound_io_write_latency_seconds"].samples
         if s.name.endswith("_bucket")}
    assert b["1.024e-06"] == 4
    assert b["2.147483648"] == 4
    assert b["+Inf"] == 6


def test_unknown_mount_gets_stable_label(tmp_path):
    fams = collect([(KEY.pack(1, 999, 0), value(write_bytes=3))], tmp_path)
    s = fams["tracehound_io_write_bytes"].samples[0]
    assert s.labels["mountpoint"] == "mnt:999" and s.labels["fstype"] == "unknown"


def test_removed_cgroup_is_exported_once_more_then_deleted(tmp_path):
    key = KEY.pack(7, 40, 0)
    c = collector([(key, value(write_bytes=10))], tmp_path)
    assert written(scrape(c), "/job/7") == [10]
    stats = c.probe.maps["io_stats"]
    stats._items = [(key, value(write_bytes=15))]   # the last write before rmdir
    c.cgroups.dead.add(7)
    # a scrape only reads: the removed cgroup's entry stays until retired,
    # and waits for it to be exported
    assert written(scrape(c), "/job/7") == []
    assert stats.items() == [(key, value(write_bytes=15))] and c.cgroups.forgotten == []
    # the agent's schedule retires it, with no scrape involved
    assert c.retire_dead() == 1
    assert stats.items() == []
    c.owners.prune()                                 # the schedule's next job
    assert c.cgroups.forgotten == [7]
    fams = scrape(c)
    assert written(fams, "/job/7") == [15]           # final value, exported once more
    entries = {s.labels["map"]: s.value for s in fams["tracehound_map_entries"].samples}
    assert entries == {"io_stats": 0}
    assert written(scrape(c), "/job/7") == []        # then gone
    assert c.retire_dead() == 0


def test_retired_between_scrapes_is_exported_by_the_next_whenever_it_comes(tmp_path):
    keys = [KEY.pack(cg, 40, 0) for cg in (7, 8)]
    c = collector([(k, value(write_bytes=5)) for k in keys], tmp_path)
    c.cgroups.paths[8] = "/job/8"
    c.cgroups.dead.update({7, 8})
    assert c.retire_dead() == 2
    assert c.retire_dead() == 0                       # nothing left to retire, nothing lost
    fams = scrape(c)
    assert written(fams, "/job/7") == [5] and written(fams, "/job/8") == [5]


def test_new_cgroup_at_a_reused_path_continues_the_counter(tmp_path):
    old, new = KEY.pack(7, 40, 0), KEY.pack(8, 40, 0)
    c = collector([(old, value(write_bytes=10))], tmp_path)
    c.cgroups.paths[8] = "/job/7"
    scrape(c)
    c.cgroups.dead.add(7)
    c.probe.maps["io_stats"]._items = [(old, value(write_bytes=10)), (new, value(write_bytes=1))]
    c.retire_dead()
    assert written(scrape(c), "/job/7") == [11]
    assert written(scrape(c), "/job/7") == [11]      # never back to 1


def test_a_cgroup_recreated_after_the_last_export_starts_from_zero(tmp_path):
    """The docs' promise: continuation only while the old entries are
    being retired; later, the path's series restarts (a counter reset)."""
    old, new = KEY.pack(7, 40, 0), KEY.pack(8, 40, 0)
    c = collector([(old, value(write_bytes=10))], tmp_path)
    scrape(c)
    c.cgroups.dead.add(7)
    c.retire_dead()
    assert written(scrape(c), "/job/7") == [10]      # the last export
    assert written(scrape(c), "/job/7") == []        # gone
    c.cgroups.paths[8] = "/job/7"
    c.probe.maps["io_stats"]._items = [(new, value(write_bytes=1))]
    assert written(scrape(c), "/job/7") == [1]


def test_series_cap_folds_the_rest_into_overflow(tmp_path):
    items = [(KEY.pack(cg, 40, 0), value(write_bytes=cg)) for cg in (7, 20, 21)]
    c = collector(items, tmp_path, max_series=1)
    c.cgroups.paths.update({20: "/a", 21: "/b"})
    fams = scrape(c)
    assert written(fams, "/job/7") == [7]
    assert written(fams, "__overflow__") == [41]
    over = fams["tracehound_series_overflow"].samples[0]
    assert over.labels == {"collector": "io"} and over.value == 2
    # a folded cgroup goes away: overflow must not shrink
    c.cgroups.dead.add(20)
    c.retire_dead()
    assert written(scrape(c), "__overflow__") == [41]
    assert written(scrape(c), "__overflow__") == [41]


def test_every_series_carries_the_workload_labels(tmp_path):
    c = collector([(KEY.pack(30, 40, 0), value(write_bytes=4096))], tmp_path)
    c.cgroups.paths[30] = "/system.slice/slurmstepd.scope/job_42/step_0/user/task_1"
    fams = scrape(c)
    s = fams["tracehound_io_write_bytes"].samples[0]
    assert (s.labels["workload"], s.labels["job_id"], s.labels["step"], s.labels["task"]) \
        == ("slurm", "42", "0", "1")
    assert s.value == 4096
    info = fams["tracehound_workload_info"].samples
    assert len(info) == 1 and info[0].labels["cgroup"] == c.cgroups.paths[30]
    assert info[0].labels["job_id"] == "42"


def read_hist(slot: int, n: int):
    hist = [[0] * col.HIST_SLOTS for _ in col.HISTS]
    hist[0][slot] = n
    return hist


def histogram_series(fams, name="tracehound_io_read_latency_seconds"):
    """labels (without le) -> count, for each series of the histogram."""
    return {tuple(sorted(s.labels.items())): s.value
            for s in fams[name].samples if s.name.endswith("_count")}


def test_latency_histograms_keep_the_labels_asked_for(tmp_path):
    def reads(n):
        return [n] + [0] * (len(col.OPS) - 1)
    items = [(KEY.pack(7, 40, 0), value(calls=reads(5), hist=read_hist(12, 5), lat=[50_000, 0, 0])),
             (KEY.pack(8, 40, 0), value(calls=reads(2), hist=read_hist(14, 2), lat=[30_000, 0, 0])),
             (KEY.pack(7, 27, 0), value(calls=reads(1), hist=read_hist(12, 1), lat=[9_000, 0, 0]))]

    def scraped(where):
        c = collector(items, tmp_path, latency_histograms=where)
        c.cgroups.paths[8] = "/job/8"
        return scrape(c)

    every = histogram_series(scraped("cgroup-mount"))
    assert len(every) == 3 and sum(every.values()) == 8
    mount = scraped("mount")
    assert histogram_series(mount) == {
        (("fstype", "tmpfs"), ("mountpoint", "/scratch")): 7,
        (("fstype", "ext4"), ("mountpoint", "/")): 1}
    sums = {tuple(sorted(s.labels.items())): s.value
            for s in mount["tracehound_io_read_latency_seconds"].samples if s.name.endswith("_sum")}
    assert sums[(("fstype", "tmpfs"), ("mountpoint", "/scratch"))] == 80e-6
    assert histogram_series(scraped("cgroup")) == {(("cgroup", "/job/7"),): 6,
                                                   (("cgroup", "/job/8"),): 2}
    off = scraped("off")
    assert not any(name.endswith("_latency_seconds") for name in off)
    # the counters keep every label set whatever the histograms do
    for fams in (mount, off):
        reads = {s.labels["cgroup"]: s.value for s in fams["tracehound_io_read_requests"].samples
                 if s.labels["mountpoint"] == "/scratch"}
        assert reads == {"/job/7": 5, "/job/8": 2}


def test_by_default_a_workloads_cgroups_share_its_histogram_and_the_rest_their_mounts(tmp_path):
    """workload-mount: each step of Slurm job 42 keeps a histogram with its
    labels, its tasks summed into it, without the cgroup (the rows of
    `top`); two cgroups of no workload sum into the mount's."""
    items = [(KEY.pack(cg, 40, 0), value(calls=[n] + [0] * (len(col.OPS) - 1),
                                         hist=read_hist(12, n), lat=[n * 1000, 0, 0]))
             for cg, n in ((7, 1), (8, 2), (9, 4), (10, 8), (11, 16))]
    c = collector(items, tmp_path, latency_histograms=defaults.LATENCY_HISTOGRAMS)
    c.cgroups.paths.update({8: "/other", 9: "/slurm/uid_0/job_42/step_0",
                            10: "/slurm/uid_0/job_42/step_0/task_0",
                            11: "/slurm/uid_0/job_42/step_1"})
    fams = scrape(c)
    job = (("fstype", "tmpfs"), ("job_id", "42"), ("mountpoint", "/scratch"))
    assert histogram_series(fams) == {
        (("fstype", "tmpfs"), ("mountpoint", "/scratch")): 3,
        (*job, ("step", "0"), ("workload", "slurm")): 12,
        (*job, ("step", "1"), ("workload", "slurm")): 16}
    # the counters still name every cgroup
    cgroups = {s.labels["cgroup"] for s in fams["tracehound_io_read_requests"].samples}
    assert cgroups == {"/job/7", "/other", "/slurm/uid_0/job_42/step_0",
                       "/slurm/uid_0/job_42/step_0/task_0", "/slurm/uid_0/job_42/step_1"}


def test_latency_histogram_choices_are_the_command_line_ones(tmp_path):
    assert tuple(col.HISTOGRAM_LABELS) == defaults.LATENCY_HISTOGRAM_CHOICES
    assert defaults.LATENCY_HISTOGRAMS in col.HISTOGRAM_LABELS
    with pytest.raises(ValueError, match="latency histograms"):
        collector([], tmp_path, latency_histograms="pod")


class SamplerMap:
    """io_samplers as the kernel hands it: a struct io_sampler per CPU."""

    def __init__(self, timed_per_cpu: dict[int, list[int]]):
        self.timed = timed_per_cpu

    def lookup_percpu(self, key):
        (h,) = struct.unpack("I", key)
        return [io_mod.SAMPLER.pack(123, n, 9, 77, 1, 1, 40, 0) for n in self.timed[h]]


def test_the_timed_calls_of_sampled_timing_are_exported_per_op(tmp_path):
    c = collector([], tmp_path)
    c.probe.maps["io_samplers"] = SamplerMap({0: [5, 7], 1: [0, 2], 2: [1, 0]})
    fams = scrape(c)
    timed = {s.labels["op"]: s.value for s in fams["tracehound_io_latency_timed_calls"].samples
             if s.name.endswith("_total")}
    assert timed == {"read": 12, "write": 2, "fsync": 1}
    [gap] = fams["tracehound_io_latency_sample_gap_seconds"].samples
    assert gap.value == c.probe.config.sample_gap_ns / 1e9


def test_every_call_timed_exports_no_timed_calls(tmp_path):
    c = collector([], tmp_path)
    c.probe.config.sample_gap_ns = 0
    c.probe.maps["io_samplers"] = SamplerMap({0: [5], 1: [0], 2: [1]})
    fams = scrape(c)
    assert "tracehound_io_latency_timed_calls" not in fams
    assert "tracehound_io_latency_sample_gap_seconds" not in fams


def test_a_series_is_born_on_its_counters_first_increment(tmp_path):
    """A label set exports the counters that moved and the histograms of
    the calls that were timed, nothing at 0: a job that never fails,
    unlinks or fsyncs mints no series for it."""
    calls = [0] * len(col.OPS)
    calls[col.OPS.index("read")] = 3
    items = [(KEY.pack(7, 40, 0), value(read_bytes=300, calls=calls, hist=read_hist(12, 3),
                                        lat=[3000, 0, 0]))]
    fams = scrape(collector(items, tmp_path, latency_histograms="cgroup-mount"))
    io = {name: f for name, f in fams.items() if name.startswith("tracehound_io_")}
    assert {n for n, f in io.items() if f.samples} == {
        "tracehound_io_read_bytes", "tracehound_io_read_requests",
        "tracehound_io_read_latency_seconds"}
    assert all(s.value for n in ("tracehound_io_read_bytes", "tracehound_io_read_requests")
               for s in io[n].samples)
