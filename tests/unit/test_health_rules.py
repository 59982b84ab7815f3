"""The rules of `tracehound health` over an agent's exposition text, and
--gpu-bus-ids (the agent's share of a host's GPUs)."""
import argparse

import pytest

from tracehound.gpu.bus_ids import bus_id_list, served
from tracehound.health.rules import DEFAULT_CONDITIONS, Memory, Rules, findings

GPU = 'gpu="0",uuid="GPU-1",model="H100",pci_bus_id="0000:e7:00.0"'


def health(condition: str, value: int = 1, gpu: str = GPU) -> str:
    return f'tracehound_gpu_health{{{gpu},condition="{condition}"}} {value}\n'


def xids(*numbers: int) -> str:
    """Fatal XIDs logged within the agent's window, the first the newest."""
    return "".join(f'tracehound_gpu_recent_fatal_xid_age_seconds{{{GPU},xid="{n}"}} {i + 1}.0\n'
                   for i, n in enumerate(numbers))


def port(state: int, link_downed: float | None = None, dev: str = "mlx5_0") -> str:
    out = f'tracehound_rdma_port_state_id{{device="{dev}",port="1"}} {state}\n'
    if link_downed is not None:
        out += (f'tracehound_rdma_port_counter_total{{device="{dev}",port="1",'
                f'counter="link_downed"}} {link_downed}\n')
    return out


def phrases(text: str, rules: Rules = Rules(), memory: Memory | None = None, now: float = 0):
    return [(f.condition, f.phrase) for f in findings(text, rules, memory or Memory(), now)]


def test_a_fallen_gpu_is_named_by_its_xid_and_stays_lost_past_the_window():
    text = xids(79) + health("lost") + health("recent_fatal_xid")
    assert phrases(text) == [("recent_fatal_xid", "XID 79 GPU fell off the bus (0000:e7:00.0)"),
                             ("gpu_lost", "XID 79 GPU fell off the bus (0000:e7:00.0)")]
    # the window passed: the XID is gone from the answer, the GPU is still lost
    assert phrases(health("lost") + health("recent_fatal_xid", 0)) == [
        ("gpu_lost", "GPU lost (fallen off the bus or not answering NVML) (0000:e7:00.0)")]


def test_a_reason_names_only_the_xids_within_the_window():
    # XID 95 of eight minutes ago is not in the agent's answer, 119 is
    text = xids(119) + health("recent_fatal_xid")
    assert phrases(text) == [("recent_fatal_xid", "XID 119 GSP RPC timeout (0000:e7:00.0)")]
    both = xids(119, 48) + health("recent_fatal_xid")
    assert phrases(both)[0][1].startswith("XID 119 GSP RPC timeout, XID 48 ")


def test_each_condition_says_what_and_which_gpu():
    text = "".join(health(c) for c in ("uncorrectable_ecc_pending", "row_remap_failure",
                                       "nvlink_down", "thermal_slowdown"))
    text += health("lost", 0) + health("recent_fatal_xid", 0)
    assert phrases(text) == [
        ("uncorrectable_ecc_pending", "uncorrectable ECC error, reset pending (0000:e7:00.0)"),
        ("row_remap_failure", "GPU memory row remap failed (0000:e7:00.0)"),
        ("nvlink_down", "NVLink down (0000:e7:00.0)")]      # thermal: off by default
    every = Rules(conditions=DEFAULT_CONDITIONS | {"thermal_slowdown"})
    assert ("thermal_slowdown", "GPU thermal slowdown (0000:e7:00.0)") in phrases(text, every)
    only_ecc = Rules(conditions=frozenset({"uncorrectable_ecc_pending"}))
    assert [c for c, _ in phrases(text, only_ecc)] == ["uncorrectable_ecc_pending"]


def test_lost_without_xid_79_and_non_fatal_xids():
    assert phrases(health("lost")) == [
        ("gpu_lost", "GPU lost (fallen off the bus or not answering NVML) (0000:e7:00.0)")]
    # without the health gauge, an XID alone makes no node unfit
    assert phrases(xids(48)) == []


def test_other_series_and_unknown_conditions_are_ignored():
    text = ('tracehound_io_read_bytes_total{cgroup="/x",condition="lost"} 1\n'
            + health("a_condition_of_a_later_agent") + "# a comment\n")
    assert phrases(text) == []


def test_an_rdma_port_is_down_only_once_it_was_seen_active():
    memory = Memory()
    assert phrases(port(1), memory=memory) == []           # never active: unused
    assert phrases(port(4), memory=memory) == []
    assert phrases(port(1), memory=memory) == [("rdma_port_down",
                                                 "RDMA port mlx5_0/1 down (state 1)")]
    # what runs remember survives its JSON form; junk in it is dropped
    again = Memory.from_json(memory.to_json())
    assert again.active_ports == {"mlx5_0/1"}
    assert Memory.from_json({"active_ports": [1, "x"], "link_downed": {"p": [[1, "a"]]}}) \
        == Memory({"x"}, {"p": []})
    assert Memory.from_json("junk") == Memory()


def test_a_flapping_port_within_the_window():
    rules, memory = Rules(flaps=3, flap_window_s=600), Memory()
    assert phrases(port(4, 10), rules, memory, now=0) == []
    assert phrases(port(4, 12), rules, memory, now=100) == []
    assert phrases(port(4, 13), rules, memory, now=200) == [
        ("rdma_port_flapping", "RDMA port mlx5_0/1 flapping (link down 3 times in 600 s)")]
    # the early flaps leave the window
    assert phrases(port(4, 13), rules, memory, now=700) == []
    # a counter that went back (the agent restarted) is a new baseline
    assert phrases(port(4, 0), rules, memory, now=710) == []
    assert phrases(port(4, 2), rules, memory, now=720) == []


def test_bus_id_list():
    assert bus_id_list("00000000:E7:00.0, 0000:3b:00.0") == {"0000:e7:00.0", "0000:3b:00.0"}
    for bad in ("e7:00.0", "0000:e7:00", "0000:e7:00.0;x", ""):
        with pytest.raises(argparse.ArgumentTypeError):
            bus_id_list(bad)
    assert served(None, None) and served(None, "0000:01:00.0")
    assert served(frozenset({"0000:01:00.0"}), "0000:01:00.0")
    assert not served(frozenset({"0000:01:00.0"}), "0000:02:00.0")
    assert not served(frozenset({"0000:01:00.0"}), None)
