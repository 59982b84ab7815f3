"""Decoding of the io_stats map layout and the histogram export."""
import struct

from tracehound.collectors import io as col
from tracehound.host.mounts import MountTable

SAMPLE = "27 1 254:0 / / rw - ext4 /dev/vda rw\n40 27 0:50 / /scratch rw - tmpfs t rw\n"


def value(read_bytes=0, write_bytes=0, calls=None, errors=None, lat=None, hist=None):
    calls = calls or [0] * len(col.OPS)
    errors = errors or [0] * len(col.OPS)
    lat = lat or [0] * len(col.HISTS)
    hist = hist or [[0] * col.HIST_SLOTS for _ in col.HISTS]
    flat = [read_bytes, write_bytes, *calls, *errors, *lat, *sum(hist, [])]
    assert len(flat) == col.N_FIELDS
    return struct.pack(f"{len(flat)}Q", *flat)


class FakeMap:
    def __init__(self, items):
        self._items = items

    def items(self):
        return self._items

    def lookup_percpu_u64(self, key):
        return [1, 2]


class FakeProbe:
    """Stands in for a loaded IoProbe: the map contents are what is tested."""

    def __init__(self, items):
        self.maps = {"io_stats": FakeMap(items), "io_health": FakeMap([])}
        self.obj = self

    def map(self, name):
        return self.maps[name]

    def sync_mounts(self, force=False):
        pass


class FakeCgroups:
    def new_scrape(self):
        pass

    def path(self, cgid):
        return {1: "/", 7: "/job/7"}.get(cgid, f"unknown:{cgid}")


def collect(items, tmp_path):
    p = tmp_path / "mi"
    p.write_text(SAMPLE)
    c = col.IoCollector(FakeProbe(items), MountTable(str(p)), FakeCgroups())
    return {f.name: f for f in c.collect()}


def test_keys_for_same_mount_merge_and_dev_keys_resolve(tmp_path):
    read_hist = [[0] * col.HIST_SLOTS for _ in col.HISTS]
    read_hist[0][12] = 5               # five reads of 4-8 us
    items = [
        (col.KEY.pack(7, 40, 0), value(read_bytes=100, hist=read_hist, lat=[25_000, 0, 0])),
        (col.KEY.pack(7, 40, 0), value(read_bytes=1)),
        # namespace op keyed by device (0:50 is the tmpfs)
        (col.KEY.pack(7, (0 << 20) | 50, col.KEY_DEV),
         value(calls=[0, 0, 0, 0, 0, 3, 0, 0, 0], errors=[0, 0, 0, 0, 0, 1, 0, 0, 0])),
    ]
    fams = collect(items, tmp_path)
    lbl = {"cgroup": "/job/7", "mountpoint": "/scratch", "fstype": "tmpfs"}

    def val(fam, name=None):
        for s in fams[fam].samples:
            if s.labels == lbl and (name is None or s.name == name):
                return s.value
    assert val("tracehound_io_read_bytes") == 101
    assert val("tracehound_io_read_requests") == 5      # from the histogram
    assert val("tracehound_io_mkdir_requests") == 3
    assert val("tracehound_io_mkdir_errors") == 1
    buckets = {s.labels["le"]: s.value for s in fams["tracehound_io_read_latency_seconds"].samples
               if s.name.endswith("_bucket") and s.labels["cgroup"] == "/job/7"}
    assert buckets["4.096e-06"] == 0 and buckets["8.192e-06"] == 5 and buckets["+Inf"] == 5
    assert val("tracehound_io_read_latency_seconds", "tracehound_io_read_latency_seconds_sum") \
        == 25e-6


def test_slow_calls_only_in_inf_and_fast_ones_in_first_bucket(tmp_path):
    hist = [[0] * col.HIST_SLOTS for _ in col.HISTS]
    hist[1][31] = 2    # >= 2.1 s
    hist[1][3] = 4     # < 16 ns
    fams = collect([(col.KEY.pack(1, 27, 0), value(hist=hist))], tmp_path)
    b = {s.labels["le"]: s.value for s in fams["tracehound_io_write_latency_seconds"].samples
         if s.name.endswith("_bucket")}
    assert b["1.024e-06"] == 4
    assert b["2.147483648"] == 4
    assert b["+Inf"] == 6


def test_unknown_mount_gets_stable_label(tmp_path):
    fams = collect([(col.KEY.pack(1, 999, 0), value(write_bytes=3))], tmp_path)
    s = fams["tracehound_io_write_bytes"].samples[0]
    assert s.labels["mountpoint"] == "mnt:999" and s.labels["fstype"] == "unknown"
