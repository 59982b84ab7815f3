"""Decoding the exit probe's maps and the metric families built from them."""
import signal
import struct

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from tracehound.attribution.owners import Owners
from tracehound.attribution.resolver import WorkloadResolver
from tracehound.collectors.exits import MAX_PENDING, ExitsCollector
from tracehound.config import AgentConfig
from tracehound.probes import exits as e
from tracehound.subsystems.base import Context
from tracehound.subsystems.exits import ExitsSubsystem

SEGV, KILL, ABRT = int(signal.SIGSEGV), int(signal.SIGKILL), int(signal.SIGABRT)


class FakeMap:
    def __init__(self, items=(), array=None):
        self._items = list(items)
        self._array = array or {}

    def items(self):
        return self._items

    def lookup(self, key):
        idx = struct.unpack("=I", key)[0]
        return struct.pack("=Q", self._array[idx]) if idx in self._array else None


def key(cgid, reason, sig=0):
    return e.KEY.pack(cgid, e.REASONS.index(reason), sig)


def count(n):
    return struct.pack("=Q", n)


def maps():
    return {
        "exit_counts": FakeMap([
            (key(42, "signal", SEGV), count(2)),
            (key(42, "signal", SEGV | e.SIG_CORE), count(1)),     # dumped core
            (key(42, "signal", KILL), count(5)),
            (key(42, "oom", KILL), count(1)),
            (key(42, "error"), count(3)),
            (key(42, "clean"), count(40)),
            (key(43, "signal", ABRT), count(1)),
            (key(44, "signal", KILL), count(1)),                  # a removed cgroup
            (e.KEY.pack(42, 9, 0), count(1)),                    # a newer object's reason
        ]),
        "exit_last": FakeMap([
            (key(42, "signal", SEGV), e.LAST.pack(10**9, 300, 0, b"trainer")),
            (key(42, "error"), e.LAST.pack(2 * 10**9, 301, 3, b"x" * 16)),   # no NUL
        ]),
        "exit_health": FakeMap(array={1: 4}),
    }


class FakeProbe:
    def __init__(self):
        self.retired = []

    def snapshot(self):
        return e.read_snapshot(maps())

    def retire(self, ids):
        self.retired.append(set(ids))


class FakeCgroups:
    def __init__(self, gone=()):
        self.gone = set(gone)

    def new_scrape(self):
        pass

    def alive(self, cgid):
        return cgid not in self.gone

    def removed(self, cgid):
        return not self.alive(cgid)

    def forget(self, cgid):
        pass

    def path(self, cgid):
        return {42: "/job/a", 43: "/job/b", 44: "/job/c"}.get(cgid, f"unknown:{cgid}")

    def retain(self, in_use):
        return []


def make_owners(gone=()) -> Owners:
    return Owners(FakeCgroups(gone), WorkloadResolver(job_id_source=None, pod_source=None))


def scrape(collector) -> dict:
    reg = CollectorRegistry(auto_describe=False)
    reg.register(collector)
    text = generate_latest(reg).decode()
    return {(s.name, tuple(sorted((k, v) for k, v in s.labels.items() if v))): s.value
            for fam in text_string_to_metric_families(text) for s in fam.samples}


def test_snapshot_decodes_keys_last_exits_and_health():
    snap = e.read_snapshot(maps())
    assert snap.counts[e.ExitKey(42, "signal", SEGV, False)] == 2
    assert snap.counts[e.ExitKey(42, "signal", SEGV, True)] == 1
    assert snap.counts[e.ExitKey(42, "oom", KILL)] == 1
    assert snap.counts[e.ExitKey(42, "9", 0)] == 1
    last = snap.last[e.ExitKey(42, "signal", SEGV)]
    assert (last.pid, last.comm, last.ktime_ns) == (300, "trainer", 10**9)
    assert snap.last[e.ExitKey(42, "error", 0)].comm == "x" * 16
    assert snap.last[e.ExitKey(42, "error", 0)].status == 3
    assert snap.health == {"counters_full": 0, "last_full": 4}
    assert snap.cgroup_ids() == {42, 43, 44}


def test_keys_round_trip():
    for k in (e.ExitKey(7, "signal", SEGV, True), e.ExitKey(7, "clean", 0)):
        assert e.decode_key(e.encode_key(k)) == k


def test_signal_names_drop_the_prefix_and_stay_bounded():
    assert e.signal_name(SEGV) == "SEGV" and e.signal_name(KILL) == "KILL"
    assert e.signal_name(0) == ""
    assert e.signal_name(int(signal.SIGRTMIN) + 3) == "RTMIN+3"
    assert e.signal_name(127) == "127"


def test_last_exit_wall_time_from_the_monotonic_stamp():
    last = e.LastExit(1, "a", 0, ktime_ns=5 * 10**9)
    assert last.wall_time(now_mono_ns=7 * 10**9, now_wall=1000.0) == 998.0
    # a stamp from the future (clock read before the exit was stored) is "now"
    assert last.wall_time(now_mono_ns=4 * 10**9, now_wall=1000.0) == 1000.0


def test_families_by_reason_and_signal_with_workload_labels():
    m = scrape(ExitsCollector(FakeProbe(), make_owners()))
    exits = "tracehound_process_exits_total"
    # the core-dumped SEGV exits are SEGV exits too
    assert m[(exits, (("cgroup", "/job/a"), ("reason", "signal"), ("signal", "SEGV")))] == 3
    assert m[(exits, (("cgroup", "/job/a"), ("reason", "signal"), ("signal", "KILL")))] == 5
    assert m[(exits, (("cgroup", "/job/a"), ("reason", "oom"), ("signal", "KILL")))] == 1
    assert m[(exits, (("cgroup", "/job/a"), ("reason", "error")))] == 3
    assert m[(exits, (("cgroup", "/job/a"), ("reason", "clean")))] == 40
    assert m[(exits, (("cgroup", "/job/b"), ("reason", "signal"), ("signal", "ABRT")))] == 1
    cores = "tracehound_process_core_dumps_total"
    assert m[(cores, (("cgroup", "/job/a"), ("signal", "SEGV")))] == 1
    assert [k for k in m if k[0] == cores] == [(cores, (("cgroup", "/job/a"), ("signal", "SEGV")))]
    drops = "tracehound_process_exit_drops_total"
    assert m[(drops, (("reason", "last_full"),))] == 4
    assert m[(drops, (("reason", "counters_full"),))] == 0


def test_a_kill_is_stamped_with_the_kernels_time_and_other_exits_are_not():
    snap = e.read_snapshot(maps())
    snap.last[e.ExitKey(42, "signal", SEGV, True)] = e.LastExit(302, "trainer", 0, 3 * 10**9)
    snap.last[e.ExitKey(42, "oom", KILL)] = e.LastExit(303, "hog", 0, 4 * 10**9)
    probe = FakeProbe()
    probe.snapshot = lambda: snap
    # the monotonic clock at 10 s is the Unix time 1000
    m = scrape(ExitsCollector(probe, make_owners(), clocks=lambda: (10 * 10**9, 1000.0)))
    at = "tracehound_process_last_exit_timestamp_seconds"
    got = {labels: v for (name, labels), v in m.items() if name == at}
    # SEGV: the later of its two (one dumped core); the error exit has no time
    assert got == {(("cgroup", "/job/a"), ("reason", "signal"), ("signal", "SEGV")): 993.0,
                   (("cgroup", "/job/a"), ("reason", "oom"), ("signal", "KILL")): 994.0}


def test_every_exit_series_carries_the_workload_labels():
    reg = CollectorRegistry(auto_describe=False)
    reg.register(ExitsCollector(FakeProbe(), make_owners()))
    fams = {f.name: f for f in text_string_to_metric_families(generate_latest(reg).decode())}
    labels = set(fams["tracehound_process_exits"].samples[0].labels)
    assert {"cgroup", "workload", "job_id", "pod", "unit", "reason", "signal"} <= labels


class Recorder:
    def __init__(self, calls):
        self.calls = calls

    def observe(self, snap, now):
        self.calls.append(("observe", sorted(snap.cgroup_ids())))

    def forget(self, ids, now=None):
        self.calls.append(("forget", sorted(ids)))


KILLED_IN_C = ("tracehound_process_exits_total",
               (("cgroup", "/job/c"), ("reason", "signal"), ("signal", "KILL")))


def test_a_removed_cgroups_exits_are_served_to_every_scraper_for_a_while_then_retired():
    """Two scrapers (a Prometheus pair, or Prometheus and `health`) both see
    a finished job's last exits; after retire_after_s they go, once the
    detector has seen them."""
    calls, now = [], [1000.0]
    probe = FakeProbe()
    probe.retire = lambda ids: calls.append(("retire", sorted(ids)))
    collector = ExitsCollector(probe, make_owners(gone={44}), Recorder(calls),
                               retire_after_s=120, clock=lambda: now[0])
    for t in (1000.0, 1000.5, 1060.0, 1119.9):      # the first scrapes after the removal
        now[0] = t
        assert scrape(collector)[KILLED_IN_C] == 1
        assert collector.retire_expired() == 0       # the schedule's turn: not yet
    assert calls == []
    now[0] = 1120.0
    assert scrape(collector)[KILLED_IN_C] == 1       # a scrape changes nothing
    assert calls == []
    assert collector.retire_expired() == 1           # the schedule retires it
    assert calls == [("observe", [42, 43, 44]), ("retire", [44]), ("forget", [44])]


def test_a_burst_of_removed_cgroups_is_retired_at_once():
    calls = []
    probe = FakeProbe()
    probe.retire = lambda ids: calls.append(("retire", sorted(ids)))
    burst = e.read_snapshot(maps())
    gone = set(range(10_000, 10_000 + MAX_PENDING + 1))
    for cgid in gone:
        burst.counts[e.ExitKey(cgid, "clean", 0, False)] = 1
    probe.snapshot = lambda: burst
    ExitsCollector(probe, make_owners(gone=gone), retire_after_s=120).retire_expired()
    assert calls == [("retire", sorted(gone))]


def test_a_half_full_table_retires_removed_cgroups_at_once():
    calls = []
    probe = FakeProbe()
    probe.retire = lambda ids: calls.append(("retire", sorted(ids)))
    full = e.read_snapshot(maps())
    for i in range(e.COUNTS_ENTRIES // 2):
        full.counts[e.ExitKey(10_000 + i, "clean", 0, False)] = 1
    probe.snapshot = lambda: full
    collector = ExitsCollector(probe, make_owners(gone={44}), retire_after_s=120)
    collector.retire_expired()
    assert ("retire", [44]) in calls


def test_nothing_is_retired_while_every_cgroup_lives():
    probe = FakeProbe()
    collector = ExitsCollector(probe, make_owners())
    scrape(collector)
    assert collector.retire_expired() == 0
    assert probe.retired == []


def test_a_probe_without_maps_reads_empty():
    probe = e.ExitsProbe()
    assert probe.snapshot().counts == {} and probe.modes() == {}
    probe.retire({1})
    probe.close()
    probe.close()


def test_an_unknown_mode_is_a_reason_not_an_exception():
    probe = e.ExitsProbe(e.ExitsProbeConfig(mode="fentry")).start()
    assert not probe.available and "fentry" in probe.reason


def test_the_subsystem_runs_on_without_its_probe(monkeypatch):
    monkeypatch.setattr(e, "object_path", lambda name: "/nonexistent/exits.bpf.o")
    s = ExitsSubsystem(Context(AgentConfig(), mounts=None, owners=make_owners()))
    s.start()
    assert s.reason and not s.required
    assert s.collectors() == [] and s.detectors() == [] and s.modes() == {}
    assert s.status_lines() == [f"exits: not available ({s.reason})"]
    assert "missing" in ExitsSubsystem.doctor("auto").lines[0]
    s.close()
    s.close()
