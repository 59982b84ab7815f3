"""NVLink state and traffic, MIG devices and per-process SM utilization
through the NVML test double: families, the NVLink-down anomaly, and the
stall rule's per-process busy time."""
import dataclasses
import time

import pytest

from tracehound.gpu.device import PROCESS_UTIL_WINDOW_S, process_sm_utilization
from tracehound.subsystems.gpu import GpuBusy

from . import fake_nvml as fn
from .fake_nvml import FakeGpu, FakeNvml
from .gpu_helpers import Events, label_sets, make_collector, make_host, scrape, value

GIB = 1 << 30
G0 = {"gpu": 0, "uuid": "GPU-aaaa", "model": "NVIDIA H100 80GB HBM3"}


@pytest.fixture
def host(tmp_path):
    return make_host(tmp_path, nodes={0: "0-3"}, pci={"0000:3b:00.0": 0},
                     procs={1234: ("/slurm/job_42", "0-3", "0"),
                            5678: ("/slurm/job_43", "0-3", "0")})


def linked_gpu(**over):
    gpu = FakeGpu(uuid="GPU-aaaa", nvlinks={0: {}, 1: {}, 2: {}}, nvlinks_down={2},
                  nvlink_kib={(0, fn.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX): 10,
                              (0, fn.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX): 20,
                              (0, fn.NVML_FI_DEV_NVLINK_THROUGHPUT_RAW_TX): 11,
                              (1, fn.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX): 5},
                  compute_procs=[(1234, GIB)])
    return dataclasses.replace(gpu, **over)


def test_link_state_and_traffic_per_link(host):
    f = scrape(make_collector(FakeNvml([linked_gpu()]), host))
    up = "tracehound_gpu_nvlink_up"
    assert [value(f, up, link=i, **G0) for i in range(3)] == [1, 1, 0]
    b = "tracehound_gpu_nvlink_bytes"
    assert value(f, b, link=0, direction="tx", traffic="data", **G0) == 10 * 1024
    assert value(f, b, link=0, direction="rx", traffic="data", **G0) == 20 * 1024
    assert value(f, b, link=0, direction="tx", traffic="raw", **G0) == 11 * 1024
    assert value(f, b, link=1, direction="tx", traffic="data", **G0) == 5 * 1024
    # a field the GPU does not give is left out, not 0
    assert value(f, b, link=1, direction="rx", traffic="data", **G0) is None
    assert len(label_sets(f, b)) == 4


def test_a_link_that_goes_down_fires_once_and_one_never_up_never_does(host):
    gpu = linked_gpu()
    events = Events()
    col = make_collector(FakeNvml([gpu]), host, events=events)
    f = scrape(col)
    # link 2 was down from the start: unused, not news
    assert events.kinds() == []
    assert value(f, "tracehound_gpu_anomalies", kind="nvlink_down", gpu=0, uuid="GPU-aaaa") == 0
    gpu.nvlinks_down = {1, 2}
    f = scrape(col)
    assert events.kinds() == ["nvlink_down"]
    assert events.items[0]["link"] == 1 and events.items[0]["uuid"] == "GPU-aaaa"
    assert events.items[0]["processes"][0]["pid"] == 1234
    assert value(f, "tracehound_gpu_nvlink_up", link=1, **G0) == 0
    assert value(f, "tracehound_gpu_anomalies", kind="nvlink_down", gpu=0, uuid="GPU-aaaa") == 1
    scrape(col)                                     # still down: no second event
    assert events.kinds() == ["nvlink_down"]
    gpu.nvlinks_down = {2}
    scrape(col)
    gpu.nvlinks_down = {1, 2}
    scrape(col)                                     # down again: news again
    assert events.kinds() == ["nvlink_down", "nvlink_down"]
    # a link NVML does not answer for is unknown: neither down nor back up
    links = gpu.nvlinks
    gpu.nvlinks = {0: {}, 2: {}}                     # link 1 answers INVALID_ARGUMENT
    scrape(col)
    gpu.nvlinks = links
    scrape(col)                                      # still the same going-down
    gpu.nvlinks_down = {2}
    scrape(col)
    gpu.nvlinks = {0: {}, 2: {}}
    scrape(col)                                      # up, then unknown: no event
    gpu.nvlinks, gpu.nvlinks_down = links, {1, 2}
    assert events.kinds() == ["nvlink_down", "nvlink_down"]
    # the contract with the health rules: link -> active, as NVML said
    assert col.observations()[0]["nvlink_up"] == {0: True, 1: False, 2: False}


def test_no_nvlink_means_no_link_series_and_unknown_state(host):
    col = make_collector(FakeNvml([FakeGpu(uuid="GPU-aaaa")]), host)
    f = scrape(col)
    assert f["tracehound_gpu_nvlink_up"] == [] and f["tracehound_gpu_nvlink_bytes"] == []
    assert col.observations()[0]["nvlink_up"] is None


def mig_gpu():
    def mig(gi, ci, uuid, used, util=None):
        return FakeGpu(uuid=uuid, instance_ids=(gi, ci), memory=(used, 10 * GIB),
                       utilization=util)
    return FakeGpu(uuid="GPU-aaaa", mig_mode=(fn.NVML_DEVICE_MIG_ENABLE, fn.NVML_DEVICE_MIG_ENABLE),
                   mig={0: mig(1, 0, "MIG-1", GIB), 3: mig(2, 0, "MIG-2", 2 * GIB, (40, 0))})


def test_mig_devices_are_enumerated_with_memory_and_what_utilization_there_is(host):
    f = scrape(make_collector(FakeNvml([mig_gpu()]), host))
    assert value(f, "tracehound_gpu_mig_mode", **G0) == 1
    used = "tracehound_gpu_mig_memory_used_bytes"
    assert value(f, used, gpu_instance=1, compute_instance=0, mig_uuid="MIG-1", **G0) == GIB
    assert value(f, used, gpu_instance=2, compute_instance=0, mig_uuid="MIG-2", **G0) == 2 * GIB
    assert value(f, "tracehound_gpu_mig_memory_total_bytes", mig_uuid="MIG-1") == 10 * GIB
    # slots 1, 2, 4..6 hold no device (NOT_FOUND): two series, not seven
    assert len(f[used]) == 2
    util = "tracehound_gpu_mig_utilization_ratio"
    assert value(f, util, mig_uuid="MIG-2") == pytest.approx(0.4)
    assert value(f, util, mig_uuid="MIG-1") is None          # NOT_SUPPORTED: left out


def test_mig_off_and_no_mig(host):
    off = FakeGpu(uuid="GPU-aaaa", mig_mode=(fn.NVML_DEVICE_MIG_DISABLE, fn.NVML_DEVICE_MIG_DISABLE))
    nvml = FakeNvml([off, FakeGpu(uuid="GPU-bbbb")])
    f = scrape(make_collector(nvml, host))
    assert value(f, "tracehound_gpu_mig_mode", **G0) == 0
    assert value(f, "tracehound_gpu_mig_mode", gpu=1) is None    # no MIG on that GPU
    assert f["tracehound_gpu_mig_memory_used_bytes"] == []
    assert nvml.calls["nvmlDeviceGetMigDeviceHandleByIndex"] == 0


def test_process_sm_utilization_is_the_mean_of_recent_samples(host):
    now_us = int(time.time() * 1e6)
    old = now_us - int(PROCESS_UTIL_WINDOW_S * 1e6) - 1_000_000
    gpu = linked_gpu(compute_procs=[(1234, GIB), (5678, GIB)],
                     process_util=[(1234, now_us - 2000, 60), (1234, now_us - 1000, 80),
                                   (5678, old, 90)])
    col = make_collector(FakeNvml([gpu]), host)
    f = scrape(col)
    sm = "tracehound_gpu_process_sm_utilization_ratio"
    assert value(f, sm, pid=1234, cgroup="/slurm/job_42", **G0) == pytest.approx(0.7)
    # 5678's only sample is older than the window: it ran nothing lately
    assert value(f, sm, pid=5678, cgroup="/slurm/job_43", **G0) == 0
    # the detector's read does not take the scrape's samples away
    assert col.observations()[0]["process_sm"] == {1234: pytest.approx(0.7)}


def test_process_utilization_not_found_is_idle_and_not_supported_is_unknown():
    nvml = FakeNvml([FakeGpu(process_util=[]), FakeGpu(process_util=None)])
    assert process_sm_utilization(nvml, nvml.handles[0]) == {}
    assert process_sm_utilization(nvml, nvml.handles[1]) is None


def test_stall_rule_uses_per_process_utilization_where_there_is_one():
    now = [100.0]
    busy = GpuBusy(clock=lambda: now[0])

    def look():
        # two jobs share a GPU at 90 %: only 1 does the work
        return busy.observe([{"utilization": 0.9, "process_sm": {1: 0.9},
                              "processes": [{"pid": 1}, {"pid": 2}]},
                             {"utilization": 0.5, "process_sm": None,
                              "processes": [{"pid": 3}]}])
    look()
    now[0] = 110.0
    look()
    assert busy.seconds == {1: pytest.approx(9.0), 2: 0.0, 3: pytest.approx(5.0)}
