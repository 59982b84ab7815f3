"""GPU collector over the NVML test double: every family, its labels and values."""
import dataclasses
import sys

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.openmetrics.exposition import (
    generate_latest as generate_openmetrics,
)
from prometheus_client.parser import text_string_to_metric_families

from tracehound.collectors.gpu_kmsg import GpuKernelLogCollector

from . import fake_nvml as fn
from .fake_nvml import FakeGpu, FakeNvml
from .gpu_helpers import (
    Events,
    kmsg_hub,
    label_sets,
    make_collector,
    make_host,
    open_collector,
    scrape,
    value,
)

GIB = 1 << 30
G0 = {"gpu": 0, "uuid": "GPU-aaaa", "model": "NVIDIA H100 80GB HBM3"}
G1 = {"gpu": 1, "uuid": "GPU-bbbb", "model": "NVIDIA H100 80GB HBM3"}


def full_gpu(**over):
    gpu = FakeGpu(
        uuid="GPU-aaaa", pci_bus_id="00000000:3B:00.0", temperature=41, memory_temperature=47,
        power_mw=123_456, power_limit_mw=700_000,
        clocks_mhz={fn.NVML_CLOCK_SM: 1980, fn.NVML_CLOCK_MEM: 2619},
        clock_reasons=fn.nvmlClocksEventReasonSwPowerCap | fn.nvmlClocksEventReasonHwThermalSlowdown,
        utilization=(87, 33), memory=(5 * GIB, 80 * GIB),
        ecc={(fn.NVML_MEMORY_ERROR_TYPE_CORRECTED, fn.NVML_VOLATILE_ECC): 3,
             (fn.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, fn.NVML_VOLATILE_ECC): 0,
             (fn.NVML_MEMORY_ERROR_TYPE_CORRECTED, fn.NVML_AGGREGATE_ECC): 10,
             (fn.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, fn.NVML_AGGREGATE_ECC): 1},
        retired_pages={fn.NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS: [0x1000, 0x2000],
                       fn.NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR: [0x3000]},
        retired_pending=fn.NVML_FEATURE_ENABLED,
        remapped_rows=(2, 1, 1, 0), pcie_replays=7,
        nvlinks={0: {0: 1, 1: 2, 2: 3, 3: 4, 4: 5}, 1: {0: 0, 1: 0, 2: 9, 3: 0, 4: 0}},
        compute_procs=[(1234, GIB)], graphics_procs=[(1234, None), (5678, None)],
    )
    return dataclasses.replace(gpu, **over)


def second_gpu(**over):
    gpu = FakeGpu(uuid="GPU-bbbb", pci_bus_id="00000000:86:00.0", temperature=38, power_mw=80_000)
    return dataclasses.replace(gpu, **over)


@pytest.fixture
def host(tmp_path):
    return make_host(
        tmp_path,
        nodes={0: "0-3", 1: "4-7"},
        pci={"0000:3b:00.0": 0, "0000:86:00.0": 1},
        nics={("net", "eth0"): 0, ("net", "lo"): None, ("infiniband", "mlx5_0"): 1},
        procs={1234: ("/slurm/job_42", "0-3", "0"), 5678: ("/kubepods/pod1", "4-7", "1")},
    )


def test_every_family_reports_the_gpu_values(host):
    nvml = FakeNvml([full_gpu(), second_gpu()])
    f = scrape(make_collector(nvml, host))

    assert value(f, "tracehound_gpu", **G0) == 1
    assert label_sets(f, "tracehound_gpu")[0]["pci_bus_id"] == "0000:3b:00.0"
    assert label_sets(f, "tracehound_gpu")[0]["driver_version"] == "550.54.15"
    assert value(f, "tracehound_gpu_lost", gpu=0, uuid="GPU-aaaa") == 0
    assert value(f, "tracehound_gpu_lost", gpu=1, uuid="GPU-bbbb") == 0

    assert value(f, "tracehound_gpu_temperature_celsius", sensor="gpu", **G0) == 41
    assert value(f, "tracehound_gpu_temperature_celsius", sensor="memory", **G0) == 47
    assert value(f, "tracehound_gpu_power_watts", **G0) == pytest.approx(123.456)
    assert value(f, "tracehound_gpu_power_limit_watts", **G0) == 700.0
    assert value(f, "tracehound_gpu_clock_hertz", clock="sm", **G0) == 1980e6
    assert value(f, "tracehound_gpu_clock_hertz", clock="memory", **G0) == 2619e6
    assert value(f, "tracehound_gpu_utilization_ratio", engine="gpu", **G0) == pytest.approx(0.87)
    assert value(f, "tracehound_gpu_utilization_ratio", engine="memory", **G0) == pytest.approx(0.33)
    assert value(f, "tracehound_gpu_memory_used_bytes", **G0) == 5 * GIB
    assert value(f, "tracehound_gpu_memory_total_bytes", **G0) == 80 * GIB

    active = {lbl["reason"]: v for _, lbl, v in f["tracehound_gpu_clock_event_active"]
              if lbl["gpu"] == "0"}
    assert active.pop("sw_power_cap") == 1
    assert active.pop("hw_thermal_slowdown") == 1
    # one series per reason, named after the NVML bitmask constants, all others 0
    assert set(active) == {"gpu_idle", "applications_clocks_setting", "hw_slowdown", "sync_boost",
                           "sw_thermal_slowdown", "hw_power_brake_slowdown",
                           "display_clock_setting", "board_limit", "reliability"}
    assert set(active.values()) == {0}

    ecc = "tracehound_gpu_ecc_errors"
    assert value(f, ecc, type="corrected", scope="volatile", **G0) == 3
    assert value(f, ecc, type="uncorrected", scope="volatile", **G0) == 0
    assert value(f, ecc, type="corrected", scope="aggregate", **G0) == 10
    assert value(f, ecc, type="uncorrected", scope="aggregate", **G0) == 1
    assert value(f, "tracehound_gpu_retired_pages", cause="single_bit_ecc", **G0) == 2
    assert value(f, "tracehound_gpu_retired_pages", cause="double_bit_ecc", **G0) == 1
    assert value(f, "tracehound_gpu_retired_pages_pending", **G0) == 1
    assert value(f, "tracehound_gpu_remapped_rows", type="correctable", **G0) == 2
    assert value(f, "tracehound_gpu_remapped_rows", type="uncorrectable", **G0) == 1
    assert value(f, "tracehound_gpu_row_remap_pending", **G0) == 1
    assert value(f, "tracehound_gpu_row_remap_failure", **G0) == 0
    assert value(f, "tracehound_gpu_pcie_replays", "tracehound_gpu_pcie_replays_total", **G0) == 7

    nvl = "tracehound_gpu_nvlink_errors"
    assert value(f, nvl, link=0, type="replay", **G0) == 1
    assert value(f, nvl, link=0, type="recovery", **G0) == 2
    assert value(f, nvl, link=0, type="crc_flit", **G0) == 3
    assert value(f, nvl, link=0, type="crc_data", **G0) == 4
    assert value(f, nvl, link=0, type="ecc_data", **G0) == 5
    assert value(f, nvl, link=1, type="crc_flit", **G0) == 9
    assert {lbl["link"] for lbl in label_sets(f, nvl)} == {"0", "1"}

    # topology
    assert value(f, "tracehound_gpu_numa_node", pci_bus_id="0000:3b:00.0", **G0) == 0
    assert value(f, "tracehound_gpu_numa_node", pci_bus_id="0000:86:00.0", **G1) == 1
    assert value(f, "tracehound_nic_numa_node", device="eth0", subsystem="net") == 0
    assert value(f, "tracehound_nic_numa_node", device="mlx5_0", subsystem="infiniband") == 1
    assert value(f, "tracehound_nic_numa_node", device="lo") is None

    # processes: 1234 is compute and graphics, 5678 graphics only
    info = "tracehound_gpu_process_info"
    assert value(f, info, pid=1234, cgroup="/slurm/job_42", **G0) == 1
    assert value(f, info, pid=5678, cgroup="/kubepods/pod1", **G0) == 1
    assert len(f[info]) == 2
    mem = "tracehound_gpu_process_memory_used_bytes"
    assert value(f, mem, pid=1234, **G0) == GIB
    assert value(f, mem, pid=5678) is None      # NVML did not say
    mis = "tracehound_gpu_numa_misplaced"
    assert value(f, mis, pid=1234, cgroup="/slurm/job_42", **G0) == 0
    assert value(f, mis, pid=5678, cgroup="/kubepods/pod1", **G0) == 1

    # event families exist before any event
    assert f["tracehound_gpu_xid_errors"] == []
    assert value(f, "tracehound_gpu_anomalies", gpu=0, uuid="GPU-aaaa", kind="xid") == 0


def test_counters_follow_the_hardware_between_scrapes(host):
    gpu = full_gpu()
    nvml = FakeNvml([gpu])
    col = make_collector(nvml, host)
    scrape(col)
    gpu.pcie_replays = 11
    gpu.nvlinks[1][2] = 12
    gpu.temperature = 77
    f = scrape(col)
    assert value(f, "tracehound_gpu_pcie_replays", **G0) == 11
    assert value(f, "tracehound_gpu_nvlink_errors", link=1, type="crc_flit", **G0) == 12
    assert value(f, "tracehound_gpu_temperature_celsius", sensor="gpu", **G0) == 77
    # NVLink links are discovered once (links 0, 1 and the first that does
    # not answer, 2), not on every scrape; after that each read asks the
    # state of the two links only (two scrapes, each with a detector read)
    assert nvml.calls["nvmlDeviceGetNvLinkState"] == 3 + 2 * 4


def test_not_supported_fields_are_left_out(host):
    bare = FakeGpu(uuid="GPU-aaaa", pci_bus_id="00000000:3B:00.0", temperature=None,
                   memory_temperature=None, power_mw=None, power_limit_mw=None, clock_reasons=None,
                   utilization=None, memory=None, ecc=None, retired_pages=None, retired_pending=None,
                   remapped_rows=None, pcie_replays=None, nvlinks={},
                   errors={"nvmlDeviceGetClockInfo": fn.NVML_ERROR_NO_PERMISSION})
    f = scrape(make_collector(FakeNvml([bare, second_gpu()]), host))
    for fam in ("tracehound_gpu_temperature_celsius", "tracehound_gpu_power_watts",
                "tracehound_gpu_power_limit_watts", "tracehound_gpu_clock_hertz",
                "tracehound_gpu_clock_event_active", "tracehound_gpu_utilization_ratio",
                "tracehound_gpu_memory_used_bytes", "tracehound_gpu_memory_total_bytes",
                "tracehound_gpu_ecc_errors", "tracehound_gpu_retired_pages",
                "tracehound_gpu_retired_pages_pending", "tracehound_gpu_remapped_rows",
                "tracehound_gpu_row_remap_pending", "tracehound_gpu_row_remap_failure",
                "tracehound_gpu_pcie_replays", "tracehound_gpu_nvlink_errors"):
        assert all(lbl["gpu"] != "0" for lbl in label_sets(f, fam)), fam
    # the GPU itself is fine, and the other GPU still reports
    assert value(f, "tracehound_gpu_lost", gpu=0) == 0
    assert value(f, "tracehound_gpu_temperature_celsius", sensor="gpu", **G1) == 38
    assert value(f, "tracehound_gpu_power_watts", **G1) == 80.0


def test_old_driver_falls_back_to_throttle_reasons(host):
    gpu = full_gpu(errors={"nvmlDeviceGetCurrentClocksEventReasons": fn.NVML_ERROR_FUNCTION_NOT_FOUND},
                   clock_reasons=fn.nvmlClocksEventReasonHwSlowdown)
    f = scrape(make_collector(FakeNvml([gpu]), host))
    assert value(f, "tracehound_gpu_clock_event_active", reason="hw_slowdown", **G0) == 1
    assert value(f, "tracehound_gpu_clock_event_active", reason="sw_power_cap", **G0) == 0


def test_gpu_lost_mid_scrape_keeps_the_others(host):
    # temperature answers, then the GPU falls off the bus at the power read
    lost = full_gpu(errors={"nvmlDeviceGetPowerUsage": fn.NVML_ERROR_GPU_IS_LOST})
    events = Events()
    col = make_collector(FakeNvml([lost, second_gpu()]), host, events=events)
    f = scrape(col)
    assert value(f, "tracehound_gpu_lost", gpu=0, uuid="GPU-aaaa") == 1
    assert value(f, "tracehound_gpu_lost", gpu=1, uuid="GPU-bbbb") == 0
    # nothing half-read is exported for the lost GPU
    assert value(f, "tracehound_gpu_temperature_celsius", sensor="gpu", gpu=0) is None
    assert all(lbl["gpu"] != "0" for lbl in label_sets(f, "tracehound_gpu_process_info"))
    assert value(f, "tracehound_gpu_temperature_celsius", sensor="gpu", **G1) == 38
    assert value(f, "tracehound_gpu", **G0) == 1     # still listed
    assert value(f, "tracehound_gpu_anomalies", gpu=0, kind="gpu_lost") == 1
    assert events.kinds() == ["gpu_lost"]

    f = scrape(col)       # still lost: no second event
    assert value(f, "tracehound_gpu_anomalies", gpu=0, kind="gpu_lost") == 1
    assert events.kinds() == ["gpu_lost"]

    lost.errors.clear()   # back after a reset
    f = scrape(col)
    assert value(f, "tracehound_gpu_lost", gpu=0) == 0
    assert value(f, "tracehound_gpu_temperature_celsius", sensor="gpu", **G0) == 41
    lost.lost = True      # and gone again: a new transition
    f = scrape(col)
    assert value(f, "tracehound_gpu_anomalies", gpu=0, kind="gpu_lost") == 2


def test_gpu_lost_before_start(host):
    nvml = FakeNvml([full_gpu(lost=True), second_gpu()])
    col, summary = open_collector(nvml=nvml, root=host, start=False)
    assert "lost: 0" in summary
    f = scrape(col)
    assert value(f, "tracehound_gpu_lost", gpu=0, uuid="unknown") == 1
    assert value(f, "tracehound_gpu_power_watts", **G1) == 80.0
    col.close()


def test_workload_labels_are_injectable(host):
    def workload(pid):
        return {"job_id": f"j{pid}", "pod": "", "bad-name": "x", "pid": "spoof", "gpu": "spoof"}

    f = scrape(make_collector(FakeNvml([full_gpu()]), host, workload_labels=workload))
    lbl = {k for s in label_sets(f, "tracehound_gpu_process_info") for k in s}
    assert lbl == {"gpu", "uuid", "model", "pid", "job_id", "pod"}
    assert value(f, "tracehound_gpu_process_info", pid=1234, job_id="j1234", **G0) == 1
    assert value(f, "tracehound_gpu_numa_misplaced", pid=5678, job_id="j5678", **G0) == 1


def test_a_failing_workload_resolver_does_not_break_the_scrape(host):
    def workload(pid):
        raise RuntimeError("resolver down")

    f = scrape(make_collector(FakeNvml([full_gpu()]), host, workload_labels=workload))
    assert value(f, "tracehound_gpu_process_info", pid=1234, **G0) == 1
    assert set(label_sets(f, "tracehound_gpu_process_info")[0]) == {"gpu", "uuid", "model", "pid"}


@pytest.mark.parametrize("code,needle", [
    (fn.NVML_ERROR_LIBRARY_NOT_FOUND, "libnvidia-ml.so.1 not found"),
    (fn.NVML_ERROR_DRIVER_NOT_LOADED, "driver not loaded"),
    (fn.NVML_ERROR_NO_PERMISSION, "no permission"),
    (fn.NVML_ERROR_UNKNOWN, "NVML initialisation failed"),
])
def test_no_driver_gives_none_and_one_line(code, needle):
    col, reason = open_collector(nvml=FakeNvml([full_gpu()], init_error=code))
    assert col is None
    assert needle in reason and "\n" not in reason


def test_no_gpu_gives_none_and_shuts_nvml_down():
    nvml = FakeNvml([])
    col, reason = open_collector(nvml=nvml)
    assert col is None and reason == "no NVIDIA GPU found"
    assert nvml.shutdowns == nvml.initialized == 1


def test_pynvml_not_importable(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)
    col, reason = open_collector()
    assert col is None and "nvidia-ml-py" in reason


def test_open_starts_events_and_close_releases_nvml(host):
    nvml = FakeNvml([full_gpu(), second_gpu()])
    col, summary = open_collector(nvml=nvml, root=host, event_wait_ms=20)
    try:
        assert summary == "2 GPU(s), driver 550.54.15"
        assert col.events.running
    finally:
        col.close()
    assert not col.events.running
    assert nvml.freed_sets == 1 and nvml.shutdowns == 1
    col.close()    # idempotent
    assert nvml.shutdowns == 1


def test_exposition_is_valid_and_names_do_not_collide(host):
    col = make_collector(FakeNvml([full_gpu(), second_gpu()]), host)
    registry = CollectorRegistry(auto_describe=True)   # raises on duplicated series names
    registry.register(col)
    registry.register(col.detector)                     # served beside it by the agent,
    registry.register(GpuKernelLogCollector(kmsg_hub(col)))    # with the XID counts
    text = generate_latest(registry).decode()
    names = {f.name for f in text_string_to_metric_families(text)}
    assert {"tracehound_gpu_xid_errors", "tracehound_gpu_anomalies", "tracehound_nic_numa_node",
            "tracehound_gpu_clock_event_active", "tracehound_gpu_info"} <= names
    assert 'tracehound_gpu_power_watts{gpu="0",model="NVIDIA H100 80GB HBM3",uuid="GPU-aaaa"} 123.456' \
        in text
    assert generate_openmetrics(registry).decode().endswith("# EOF\n")


def test_an_agent_serves_only_the_gpus_it_is_given(host):
    nvml = FakeNvml([full_gpu(), second_gpu()])
    col, summary = open_collector(nvml=nvml, root=host, start=False,
                                  bus_ids=frozenset({"0000:86:00.0"}))
    assert summary.startswith("1 GPU(s)")
    assert {s["pci_bus_id"] for s in label_sets(scrape(col), "tracehound_gpu")} \
        == {"0000:86:00.0"}
    col.close()
    col, _ = open_collector(nvml=FakeNvml([full_gpu()]), root=host, start=False,
                            bus_ids=frozenset({"0000:86:00.0"}))
    assert col is None
