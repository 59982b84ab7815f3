"""GPU anomaly rules fire once per transition, with the workload attached."""
import json
import logging

from tracehound.detect.gpu import KINDS, GpuDetector

from . import fake_nvml as fn
from .fake_nvml import FakeGpu, FakeNvml
from .gpu_helpers import Events, make_collector, make_host, scrape, value, write

L0 = {"gpu": "0", "uuid": "GPU-aaaa", "model": "H100"}
UNC_VOL = (fn.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, fn.NVML_VOLATILE_ECC)
UNC_AGG = (fn.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, fn.NVML_AGGREGATE_ECC)


def observe(det, unc=None, fail=None, reasons=(), procs=()):
    det.observe(L0, uncorrected_ecc=unc, row_remap_failure=fail, clock_reasons=set(reasons),
                processes=list(procs))


def counts(det):
    return {s.labels["kind"]: s.value for s in det.family().samples}


def test_every_kind_starts_at_zero():
    det = GpuDetector(emit=Events())
    det.add_gpu(L0)
    assert counts(det) == {k: 0 for k in KINDS}


def test_uncorrectable_ecc_fires_on_each_increase_only():
    events = Events()
    det = GpuDetector(emit=events)
    observe(det, unc=5)               # history from before the agent: baseline
    observe(det, unc=5)
    assert events.items == []
    observe(det, unc=7, procs=[{"pid": 9, "job_id": "42"}])
    observe(det, unc=7)
    assert events.kinds() == ["ecc_uncorrectable"]
    assert events.items[0]["increase"] == 2 and events.items[0]["count"] == 7
    assert events.items[0]["processes"] == [{"pid": 9, "job_id": "42"}]
    observe(det, unc=0)               # driver reload resets volatile counts: no event
    observe(det, unc=1)
    assert events.kinds() == ["ecc_uncorrectable", "ecc_uncorrectable"]
    assert counts(det)["ecc_uncorrectable"] == 2


def test_row_remap_failure_fires_once_until_it_clears():
    events = Events()
    det = GpuDetector(emit=events)
    observe(det, fail=0)
    observe(det, fail=1)
    observe(det, fail=1)
    assert events.kinds() == ["row_remap_failure"]
    observe(det, fail=0)
    observe(det, fail=1)
    assert events.kinds() == ["row_remap_failure"] * 2


def test_slowdowns_fire_per_reason_transition():
    events = Events()
    det = GpuDetector(emit=events)
    observe(det, reasons={"hw_thermal_slowdown"})
    observe(det, reasons={"hw_thermal_slowdown"})
    observe(det, reasons={"hw_thermal_slowdown", "sw_power_cap", "gpu_idle"})  # cap: normal at load
    assert events.kinds() == ["thermal_slowdown"]
    observe(det, reasons={"hw_power_brake_slowdown", "hw_slowdown"})
    assert events.kinds() == ["thermal_slowdown", "power_slowdown", "hw_slowdown"]
    observe(det, reasons=set())
    observe(det, reasons={"sw_thermal_slowdown"})
    assert events.kinds()[-1] == "thermal_slowdown"
    assert events.items[-1]["reason"] == "sw_thermal_slowdown"
    assert counts(det)["thermal_slowdown"] == 2


def test_gpu_lost_fires_once_per_loss():
    events = Events()
    det = GpuDetector(emit=events)
    for lost in (True, True, False, False, True):
        det.gpu_lost(L0, lost)
    assert events.kinds() == ["gpu_lost", "gpu_lost"]


def test_events_are_json_lines_on_the_events_logger(caplog):
    det = GpuDetector()
    with caplog.at_level(logging.WARNING, logger="tracehound.events"):
        det.xid(L0, 79, [{"pid": 1, "pod": "trainer-0"}])
    [rec] = [r for r in caplog.records if r.name == "tracehound.events"]
    event = json.loads(rec.getMessage())
    assert event["event"] == "gpu_anomaly" and event["kind"] == "xid" and event["xid"] == 79
    assert event["gpu"] == "0" and event["uuid"] == "GPU-aaaa" and event["model"] == "H100"
    assert event["processes"] == [{"pid": 1, "pod": "trainer-0"}]
    assert event["time"].endswith("+00:00")


def test_collector_runs_the_rules_at_scrape_time(tmp_path):
    host = make_host(tmp_path, nodes={0: "0-3"}, pci={"0000:3b:00.0": 0},
                     procs={77: ("/slurm/job_9", "0-3", "0")})
    gpu = FakeGpu(uuid="GPU-aaaa", pci_bus_id="00000000:3B:00.0", ecc={UNC_VOL: 0, UNC_AGG: 4},
                  remapped_rows=(0, 0, 0, 0), compute_procs=[(77, 1 << 30)])
    events = Events()
    col = make_collector(FakeNvml([gpu]), host, events=events)
    scrape(col)
    gpu.ecc[UNC_VOL] = 1
    gpu.ecc[UNC_AGG] = 5          # the same error seen by both scopes: one event
    gpu.remapped_rows = (0, 1, 0, 1)
    gpu.clock_reasons = fn.nvmlClocksEventReasonSwThermalSlowdown
    f = scrape(col)
    scrape(col)
    assert sorted(events.kinds()) == ["ecc_uncorrectable", "row_remap_failure", "thermal_slowdown"]
    for e in events.items:
        assert e["processes"] == [{"pid": 77, "cgroup": "/slurm/job_9"}]
    assert value(f, "tracehound_gpu_anomalies", gpu=0, kind="ecc_uncorrectable") == 1
    assert value(f, "tracehound_gpu_anomalies", gpu=0, kind="row_remap_failure") == 1
    assert value(f, "tracehound_gpu_anomalies", gpu=0, kind="thermal_slowdown") == 1
    assert value(f, "tracehound_gpu_anomalies", gpu=0, kind="gpu_lost") == 0


def test_numa_misplacement_fires_once_per_transition(tmp_path):
    host = make_host(tmp_path, nodes={0: "0-3", 1: "4-7"}, pci={"0000:3b:00.0": 0},
                     procs={501: ("/kubepods/podA", "4-7", "0-1")})
    gpu = FakeGpu(uuid="GPU-aaaa", pci_bus_id="00000000:3B:00.0", compute_procs=[(501, 1 << 30)])
    events = Events()
    col = make_collector(FakeNvml([gpu]), host, events=events)
    f = scrape(col)
    scrape(col)
    assert value(f, "tracehound_gpu_numa_misplaced", gpu=0, pid=501, cgroup="/kubepods/podA") == 1
    assert events.kinds() == ["numa_misplaced"]
    e = events.items[0]
    assert e["processes"] == [{"pid": 501, "cgroup": "/kubepods/podA"}]
    assert e["gpu_numa_node"] == 0 and e["cpu_numa_nodes"] == [1] and e["mem_numa_nodes"] == [0, 1]

    # the job is re-pinned next to its GPU
    write(host, "proc/501/status", "Cpus_allowed_list:\t0-3\nMems_allowed_list:\t0\n")
    f = scrape(col)
    assert value(f, "tracehound_gpu_numa_misplaced", pid=501) == 0
    # and pinned away again: a new transition
    write(host, "proc/501/status", "Cpus_allowed_list:\t0-3\nMems_allowed_list:\t1\n")
    f = scrape(col)
    assert value(f, "tracehound_gpu_numa_misplaced", pid=501) == 1
    assert events.kinds() == ["numa_misplaced", "numa_misplaced"]
    assert value(f, "tracehound_gpu_anomalies", gpu=0, kind="numa_misplaced") == 2


def test_unknown_gpu_node_or_gone_process_is_not_judged(tmp_path):
    # no sysfs numa_node for the GPU and no NVML affinity: placement unknown
    host = make_host(tmp_path, nodes={0: "0-3", 1: "4-7"},
                     procs={600: ("/a", "4-7", "1")})
    gpu = FakeGpu(uuid="GPU-aaaa", compute_procs=[(600, 1), (601, 1)])   # 601 has exited
    events = Events()
    f = scrape(make_collector(FakeNvml([gpu]), host, events=events))
    assert value(f, "tracehound_gpu_numa_node", gpu=0) == -1
    assert f["tracehound_gpu_numa_misplaced"] == []
    assert value(f, "tracehound_gpu_process_info", pid=601, cgroup="unknown") == 1
    assert events.items == []
