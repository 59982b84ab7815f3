"""The contract the agent relies on: isolated collectors, detectors on their
own schedule, and one place that decides when a cgroup's path is forgotten."""
import time

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import GaugeMetricFamily

from tracehound.attribution.cgroups import CgroupResolver
from tracehound.attribution.owners import Owners
from tracehound.attribution.resolver import WorkloadResolver
from tracehound.detect.schedule import DetectorSchedule
from tracehound.exporter.registry import register_all
from tracehound.subsystems import SUBSYSTEMS
from tracehound.subsystems.base import Subsystem


class Fine:
    name = "fine"

    def collect(self):
        fam = GaugeMetricFamily("tracehound_test_fine", "A collector that works.")
        fam.add_metric([], 1)
        yield fam


class Broken:
    name = "broken"

    def collect(self):
        fam = GaugeMetricFamily("tracehound_test_half", "Yielded before the failure.")
        fam.add_metric([], 1)
        yield fam
        raise RuntimeError("map read failed")


class Two(Subsystem):
    name = "two"

    def collectors(self):
        return [Broken(), Fine()]

    def modes(self):
        return {"two.x": "tracepoint"}


def test_a_failing_collector_never_fails_the_scrape():
    registry = register_all(CollectorRegistry(auto_describe=False), [Two(ctx=None)])
    text = generate_latest(registry).decode()
    assert "tracehound_test_fine 1.0" in text
    # nothing half-collected: what it yielded before raising is left out too
    assert "tracehound_test_half" not in text
    assert 'tracehound_collector_success{collector="broken"} 0.0' in text
    assert 'tracehound_collector_success{collector="fine"} 1.0' in text
    assert 'tracehound_collector_success{collector="agent"} 1.0' in text
    assert 'tracehound_probe_info{mode="tracepoint",probe="two.x"} 1.0' in text
    assert 'tracehound_collector_duration_seconds{collector="broken"}' in text


class Counting:
    def __init__(self, name, interval, fail=False):
        self.name, self.interval, self.fail = name, interval, fail
        self.runs = []

    def run_once(self, now):
        self.runs.append(now)
        if self.fail:
            raise ValueError("bad rule")


def test_detectors_run_on_their_own_intervals_and_a_failing_one_does_not_stop_the_others():
    fast, slow, bad = Counting("fast", 1.0), Counting("slow", 5.0), Counting("bad", 1.0, fail=True)
    schedule = DetectorSchedule([fast, slow, bad])
    for now in range(0, 11):
        schedule.run_due(float(now))
    assert fast.runs == [float(t) for t in range(11)]
    assert slow.runs == [0.0, 5.0, 10.0]
    assert len(bad.runs) == 11 and schedule.failures["bad"] == 11
    # and the agent exports each detector's turns and failures
    registry = CollectorRegistry(auto_describe=False)
    registry.register(schedule)
    text = generate_latest(registry).decode()
    assert 'tracehound_detector_runs_total{detector="slow"} 3.0' in text
    assert 'tracehound_detector_runs_total{detector="bad"} 11.0' in text
    assert 'tracehound_detector_failures_total{detector="bad"} 11.0' in text
    assert 'tracehound_detector_failures_total{detector="fast"} 0.0' in text


def test_detector_thread_runs_without_any_scrape():
    d = Counting("d", 0.01)
    schedule = DetectorSchedule([d]).start()
    try:
        for _ in range(200):
            if len(d.runs) >= 3:
                break
            time.sleep(0.01)
    finally:
        schedule.stop()
    assert len(d.runs) >= 3


def test_a_removed_cgroup_is_forgotten_only_when_no_subsystem_refers_to_it(tmp_path):
    root = tmp_path / "cg"
    (root / "job").mkdir(parents=True)
    cgroups = CgroupResolver(str(root))
    owners = Owners(cgroups, WorkloadResolver(job_id_source=None, pod_source=None))
    ino = (root / "job").stat().st_ino
    owners.new_scrape()
    assert owners.path(ino) == "/job"
    (root / "job").rmdir()
    owners.new_scrape()
    assert not owners.alive(ino)
    owners.retain("rdma", {ino})            # RDMA objects of the gone job still refer to it
    owners.retain("io", set(), gone={ino})  # the I/O side exported its last values
    owners.prune()
    assert owners.path(ino) == "/job"
    owners.retain("rdma", set())            # the objects are gone too
    assert owners.path(ino) == "/job"       # forgotten by the schedule's pruning, not here
    owners.prune()
    assert owners.path(ino) == f"unknown:{ino}"


def test_a_removed_cgroup_nobody_reported_keeps_its_name_for_one_more_turn(tmp_path):
    """Created and removed since the subsystems last looked: the first
    pruning keeps its name for their next retirement, the second forgets it."""
    root = tmp_path / "cg"
    (root / "brief").mkdir(parents=True)
    cgroups = CgroupResolver(str(root))
    owners = Owners(cgroups, WorkloadResolver(job_id_source=None, pod_source=None))
    ino = (root / "brief").stat().st_ino
    owners.new_scrape()
    assert owners.path(ino) == "/brief"
    (root / "next").mkdir()
    (root / "brief").rmdir()
    owners.new_scrape()
    assert not owners.alive(ino)
    assert owners.path((root / "next").stat().st_ino) == "/next"   # a rescan: brief is gone
    owners.prune()
    assert owners.path(ino) == "/brief"
    owners.prune()
    owners.new_scrape()
    assert owners.path(ino) == f"unknown:{ino}"


def test_every_subsystem_has_a_name_and_one_registration():
    names = [s.name for s in SUBSYSTEMS]
    assert names == ["io", "rdma", "gpu", "net", "exits", "pressure", "stall"]
    assert len(set(names)) == len(names)
    assert [s for s in SUBSYSTEMS if s.required] == [SUBSYSTEMS[0]]


def test_a_cgroup_newer_than_the_rounds_rescan_is_not_judged_removed(tmp_path):
    """Met after its round's one rescan (the watcher has not reported it
    yet): not alive to a scrape, but not removed either; the next round's
    rescan places it."""
    root = tmp_path / "cg"
    (root / "old").mkdir(parents=True)
    now = [100.0]
    cgroups = CgroupResolver(str(root), settle_s=1.0, clock=lambda: now[0])
    cgroups.new_scrape()
    assert cgroups.alive((root / "old").stat().st_ino)      # the round's rescan
    (root / "new").mkdir()
    new = (root / "new").stat().st_ino
    assert not cgroups.alive(new)
    assert not cgroups.removed(new)
    now[0] += 2
    cgroups.new_scrape()
    assert not cgroups.removed(new)
    assert cgroups.path(new) == "/new"


def test_an_id_no_rescan_can_place_is_removed_once_it_has_settled(tmp_path):
    """Created and removed unseen: judged removed only by a rescan at least
    settle_s after it was first met, so its counters are retired then."""
    root = tmp_path / "cg"
    (root / "old").mkdir(parents=True)
    now = [100.0]
    cgroups = CgroupResolver(str(root), settle_s=1.0, clock=lambda: now[0])
    cgroups.new_scrape()
    assert cgroups.alive((root / "old").stat().st_ino)
    (root / "brief").mkdir()
    brief = (root / "brief").stat().st_ino
    (root / "brief").rmdir()
    assert not cgroups.removed(brief)
    now[0] += 0.5
    cgroups.new_scrape()
    assert not cgroups.removed(brief)       # this round's rescan came too soon
    now[0] += 1
    cgroups.new_scrape()
    assert cgroups.removed(brief)
    assert cgroups.path(brief) == f"unknown:{brief}"
    cgroups.forget(brief)
    assert brief not in cgroups._unplaced


def test_run_subsystems_names_every_subsystem_the_agent_has():
    from tracehound import defaults
    from tracehound.subsystems import SUBSYSTEMS
    assert tuple(cls.name for cls in SUBSYSTEMS) == defaults.SUBSYSTEM_NAMES
