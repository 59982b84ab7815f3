"""The GPU health rules and the XID ledger, on a fake clock."""
import pytest

from tracehound.gpu.health import CONDITIONS, GpuHealth
from tracehound.gpu.xid_ledger import XidLedger

PCI = "0000:3b:00.0"


class Clock:
    def __init__(self, t=1000.0):
        self.t = t

    def __call__(self):
        return self.t


@pytest.fixture
def clock():
    return Clock()


# -- XID ledger ----------------------------------------------------------------

def test_one_xid_from_both_sources_counts_once_in_either_order(clock):
    for first, second in (("nvml", "kmsg"), ("kmsg", "nvml")):
        ledger = XidLedger(window_s=5, clock=clock)
        assert ledger.report(first, PCI, 79) is True
        clock.t += 0.3
        assert ledger.report(second, PCI, 79) is False
        assert ledger.counts() == {(PCI, 79): 1}
        assert ledger.duplicates() == {first: 0, second: 1}


def test_a_burst_pairs_one_to_one(clock):
    ledger = XidLedger(window_s=5, clock=clock)
    for source in ["nvml"] * 3 + ["kmsg"] * 3:
        ledger.report(source, PCI, 13)
    assert ledger.counts() == {(PCI, 13): 3}
    ledger.report("kmsg", PCI, 13)          # a fourth, only the log saw it
    assert ledger.counts() == {(PCI, 13): 4}


def test_same_source_never_pairs_and_the_window_ends_pairing(clock):
    ledger = XidLedger(window_s=5, clock=clock)
    ledger.report("kmsg", PCI, 31)
    ledger.report("kmsg", PCI, 31)
    assert ledger.counts()[(PCI, 31)] == 2
    clock.t += 5.5
    assert ledger.report("nvml", PCI, 31) is True     # too late to be the same one
    assert ledger.counts()[(PCI, 31)] == 3


def test_a_line_logged_long_ago_never_pairs_with_a_new_nvml_report(clock):
    ledger = XidLedger(window_s=5, clock=clock)
    # read back from the ring at start-up: logged an hour ago
    assert ledger.report("kmsg", PCI, 79, at=clock.t - 3600)
    assert ledger.report("nvml", PCI, 79)
    # a line logged now, read a moment after NVML's report, is that XID
    clock.t += 0.5
    assert not ledger.report("kmsg", PCI, 79, at=clock.t - 0.4)
    assert ledger.counts() == {(PCI, 79): 2}


def test_different_gpus_numbers_and_unknown_gpus_never_pair(clock):
    ledger = XidLedger(window_s=5, clock=clock)
    ledger.report("nvml", PCI, 79)
    assert ledger.report("kmsg", "0000:3c:00.0", 79)
    assert ledger.report("kmsg", PCI, 48)
    assert ledger.report("nvml", None, 79) and ledger.report("kmsg", None, 79)
    assert ledger.counts() == {(PCI, 79): 1, ("0000:3c:00.0", 79): 1, (PCI, 48): 1,
                               (None, 79): 2}


# -- health rules ----------------------------------------------------------------

def test_fatal_xid_holds_for_the_window_then_clears(clock):
    h = GpuHealth(fatal_window_s=600, clock=clock)
    h.xid(PCI, 48)
    assert h.conditions()[PCI] == {"lost": 0, "recent_fatal_xid": 1}
    assert [(c, a) for _, c, a, _ in h.transitions()] == [("recent_fatal_xid", True)]
    clock.t += 599
    assert h.conditions()[PCI]["recent_fatal_xid"] == 1 and h.transitions() == []
    clock.t += 2
    assert h.conditions()[PCI]["recent_fatal_xid"] == 0
    ((key, cond, active, detail),) = h.transitions()
    assert (key, cond, active) == (PCI, "recent_fatal_xid", False)
    assert detail == {"xid": 48, "window_seconds": 600}


def test_non_fatal_xid_and_an_old_fatal_one_from_the_ring_are_not_recent(clock):
    h = GpuHealth(fatal_window_s=600, clock=clock)
    h.xid(PCI, 13)                       # an application's error
    h.xid("0000:3c:00.0", 48, at=clock.t - 3600)     # replayed from an hour ago
    assert h.conditions() == {"0000:3b:00.0": {"lost": 0, "recent_fatal_xid": 0},
                              "0000:3c:00.0": {"lost": 0, "recent_fatal_xid": 0}}
    assert h.transitions() == []


def test_fallen_off_the_bus_holds_until_nvml_answers_after_it(clock):
    h = GpuHealth(clock=clock)
    h.nvml(PCI, lost=False)
    h.fallen_off_bus(PCI, at=clock.t - 1)
    assert h.conditions()[PCI]["lost"] == 1
    h.nvml(PCI, lost=True)               # NVML agrees: still lost
    assert h.conditions()[PCI]["lost"] == 1
    clock.t += 5
    h.nvml(PCI, lost=False)              # reset: answering again
    assert h.conditions()[PCI]["lost"] == 0
    assert [(c, a) for _, c, a, _ in h.transitions()] == []   # 1 then 0 between two looks


def test_xid_79_is_lost_too_and_without_nvml_it_stays(clock):
    h = GpuHealth(clock=clock)
    h.xid(PCI, 79)
    clock.t += 10_000
    assert h.conditions()[PCI] == {"lost": 1, "recent_fatal_xid": 0}


def test_the_recent_fatal_xids_are_those_within_the_window_each_with_its_age(clock):
    h = GpuHealth(fatal_window_s=600, clock=clock)
    h.xid(PCI, 95, at=clock.t - 480)
    h.xid(PCI, 13)                       # not fatal: never named
    clock.t += 200                       # 95 is 680 s old now
    h.xid(PCI, 119)
    h.xid("0000:3c:00.0", 48, at=clock.t - 3600)
    assert h.recent_fatal_xids() == {PCI: {119: 0.0}}
    h.xid(PCI, 119, at=clock.t - 900)    # an older line of the same XID keeps the newest
    clock.t += 30
    assert h.recent_fatal_xids() == {PCI: {119: 30.0}}
    clock.t += 600
    assert h.recent_fatal_xids() == {}


def test_nvml_conditions_known_only_where_nvml_says(clock):
    h = GpuHealth(clock=clock)
    h.nvml(PCI, lost=False, ecc_pending=1, row_remap_failure=0,
           clock_reasons={"sw_power_cap", "hw_thermal_slowdown"}, nvlink_up=None)
    assert h.conditions()[PCI] == {"lost": 0, "uncorrectable_ecc_pending": 1,
                                   "row_remap_failure": 0, "thermal_slowdown": 1,
                                   "recent_fatal_xid": 0}
    assert set(h.conditions()[PCI]) <= set(CONDITIONS)
    h.nvml(PCI, lost=False, ecc_pending=1, clock_reasons={"sw_power_cap"})
    assert h.conditions()[PCI]["thermal_slowdown"] == 0
    changes = {(c, a) for _, c, a, _ in h.transitions()}
    assert changes == {("uncorrectable_ecc_pending", True)}    # thermal came and went


def test_nvlink_down_means_a_link_that_was_up(clock):
    h = GpuHealth(clock=clock)
    h.nvml(PCI, lost=False, nvlink_up={0: True, 1: True, 2: False})   # 2: never used
    assert h.conditions()[PCI]["nvlink_down"] == 0
    h.nvml(PCI, lost=False, nvlink_up={0: True, 1: False, 2: False})
    assert h.conditions()[PCI]["nvlink_down"] == 1
    assert ("nvlink_down", True) in {(c, a) for _, c, a, _ in h.transitions()}
    h.nvml(PCI, lost=False, nvlink_up={0: True, 1: True, 2: False})
    assert ("nvlink_down", False) in {(c, a) for _, c, a, _ in h.transitions()}
    # a link NVML did not answer for is left out: it keeps its last state
    h.nvml(PCI, lost=False, nvlink_up={0: True})
    assert h.conditions()[PCI]["nvlink_down"] == 0
    h.nvml(PCI, lost=False, nvlink_up={1: False})
    h.nvml(PCI, lost=False, nvlink_up={0: True})
    assert h.conditions()[PCI]["nvlink_down"] == 1


def test_a_lost_gpu_drops_its_stale_nvml_conditions(clock):
    h = GpuHealth(clock=clock)
    h.nvml(PCI, lost=False, ecc_pending=1, clock_reasons={"hw_thermal_slowdown"})
    h.nvml(PCI, lost=True)
    assert h.conditions()[PCI] == {"lost": 1, "recent_fatal_xid": 0}
