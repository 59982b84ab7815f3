"""Kernel-log GPU errors merged with NVML's XIDs: one count and one event per
XID, catalog meaning on every event, the info metric, the other kernel
counters, health gauges and their transition events."""
from dataclasses import replace

from tracehound.collectors.gpu import GpuCollector
from tracehound.collectors.gpu_kmsg import GpuKernelLogCollector
from tracehound.detect.gpu import GpuDetector
from tracehound.detect.gpu_kmsg import GpuKernelLog
from tracehound.gpu.device import enumerate_gpus
from tracehound.gpu.kmsg import KmsgWatcher, parse_gpu_line
from tracehound.gpu.xid_catalog import CATALOG
from tracehound.gpu.xid_ledger import XidLedger
from tracehound.host.topology import Topology

from . import fake_nvml as fn
from .fake_nvml import FakeGpu, FakeNvml
from .gpu_helpers import Events, make_host, value
from .test_gpu_health import Clock
from .waiting import wait_for

PCI = "0000:3b:00.0"


def line(text: str, usec: int | None = None, replayed: bool = False, history: bool = False):
    return replace(parse_gpu_line(text), usec=usec, replayed=replayed, history=history)


def scrape(*collectors) -> dict:
    fams = [f for c in collectors for f in c.collect()]
    return {f.name: [(s.name, s.labels, s.value) for s in f.samples] for f in fams}


def hub_only(clock=None, window=600.0):
    events = Events()
    clock = clock or Clock(5000.0)
    hub = GpuKernelLog(GpuDetector(emit=events), fatal_window_s=window, clock=clock,
                       ledger=XidLedger(clock=clock))
    return hub, events, GpuKernelLogCollector(hub)


def test_nvml_and_kernel_log_report_one_xid_once(tmp_path):
    nvml = FakeNvml([FakeGpu(uuid="GPU-aaaa", pci_bus_id="00000000:3B:00.0",
                             compute_procs=[(4242, 1 << 20)])])
    nvml.nvmlInit()
    topo = Topology(make_host(tmp_path, nodes={0: "0-1"}))
    gpus, lost = enumerate_gpus(nvml, topo)
    events = Events()
    detector = GpuDetector(emit=events)
    hub = GpuKernelLog(detector)
    hub.set_gpus(gpus)
    col = GpuCollector(nvml, gpus, lost, topology=topo, detector=detector,
                       workload_labels=lambda pid: {"job": "7"}, event_wait_ms=20,
                       xid_sink=hub.nvml_xid).start()
    try:
        assert nvml.queue_event(0, fn.nvmlEventTypeXidCriticalError, 79)
        assert wait_for(lambda: len(events.items) == 1)
        hub.kernel_event(line("NVRM: Xid (PCI:0000:3b:00): 79, pid=4242, name=python, "
                              "GPU has fallen off the bus."))
        # and one the kernel log saw first, then NVML
        hub.kernel_event(line("NVRM: Xid (PCI:0000:3b:00): 13, Graphics Exception"))
        assert nvml.queue_event(0, fn.nvmlEventTypeXidCriticalError, 13)
        # NVML's report of it reaches the hub as a duplicate of the kernel log's
        assert wait_for(lambda: value(scrape(GpuKernelLogCollector(hub)),
                                      "tracehound_gpu_xid_duplicates", source="nvml") == 1)
        f = scrape(col, GpuKernelLogCollector(hub))
        xid = "tracehound_gpu_xid_errors"
        assert value(f, xid, gpu=0, uuid="GPU-aaaa", pci_bus_id=PCI, xid=79) == 1
        assert value(f, xid, gpu=0, xid=13) == 1
        assert len(f[xid]) == 2                      # the NVML collector no longer exports it
        assert value(f, "tracehound_gpu_xid_duplicates", source="kmsg") == 1
        assert value(f, "tracehound_gpu_xid_duplicates", source="nvml") == 1
        assert [e["source"] for e in events.items] == ["nvml", "kmsg"]
        first = events.items[0]
        assert (first["kind"], first["xid"], first["name"], first["severity"]) == (
            "xid", 79, "GPU fell off the bus", "fatal")
        assert first["processes"] == [{"pid": 4242, "job": "7"}] and first["action"]
        assert first["pci_bus_id"] == PCI and first["gpu"] == "0"
    finally:
        col.close()


def test_kernel_only_xid_event_names_the_gpu_by_bus_id_and_the_driver_process():
    hub, events, col = hub_only()
    hub.workload_labels = lambda pid: {"job": "42"}
    hub.kernel_event(line("NVRM: Xid (PCI:0000:ff:00): 48, pid=777, name=train.py, "
                          "An uncorrectable double bit error"))
    (e,) = events.items
    assert e["event"] == "gpu_anomaly" and e["kind"] == "xid" and e["source"] == "kmsg"
    assert (e["gpu"], e["uuid"], e["pci_bus_id"]) == ("", "", "0000:ff:00.0")
    assert (e["name"], e["severity"]) == ("double-bit ECC error", "fatal")
    assert (e["driver_pid"], e["driver_process"]) == (777, "train.py")
    assert e["processes"] == [{"job": "42", "pid": 777, "name": "train.py"}]
    assert e["detail"] == "An uncorrectable double bit error"
    f = scrape(col)
    assert value(f, "tracehound_gpu_xid_errors", pci_bus_id="0000:ff:00.0", xid=48, gpu="") == 1
    assert value(scrape(hub.detector), "tracehound_gpu_anomalies", kind="xid", gpu="") == 1


def test_info_metric_holds_the_catalog_and_unknown_numbers_seen():
    hub, _, col = hub_only()
    hub.kernel_event(line("NVRM: Xid (PCI:0000:ff:00): 999, something new"))
    info = scrape(col)["tracehound_gpu_xid"]
    by_xid = {lbl["xid"]: lbl for _, lbl, _ in info}
    assert set(by_xid) == {str(x) for x in CATALOG} | {"999"}
    assert by_xid["79"]["name"] == "GPU fell off the bus" and by_xid["79"]["severity"] == "fatal"
    assert by_xid["999"]["name"] == "unknown XID"
    assert all(v == 1 for _, _, v in info)


def test_sxid_fallen_off_bus_and_init_failures_count_and_raise_events():
    hub, events, col = hub_only()
    hub.kernel_event(line("nvidia-nvswitch3: SXid (PCI:0000:c8:00.0): 12028, Non-fatal, "
                          "Link 47 egress non-posted PRIV error (First)"))
    hub.kernel_event(line("nvidia-nvswitch3: SXid (PCI:0000:c8:00.0): 24007, Fatal, Link 32"))
    hub.kernel_event(line("NVRM: GPU 0000:3b:00.0: GPU has fallen off the bus."))
    hub.kernel_event(line("NVRM: RmInitAdapter failed! (0x26:0x65:1424)"))
    hub.kernel_event(line("NVRM: Xid (PCI:0000:3b:00): 13, x"))
    f = scrape(col)
    sx = "tracehound_gpu_nvswitch_sxid_errors"
    assert value(f, sx, device="nvidia-nvswitch3", sxid=12028, severity="non_fatal") == 1
    assert value(f, sx, pci_bus_id="0000:c8:00.0", sxid=24007, severity="fatal") == 1
    assert value(f, "tracehound_gpu_fallen_off_bus", pci_bus_id=PCI) == 1
    assert value(f, "tracehound_gpu_init_failures", pci_bus_id="") == 1
    assert value(f, "tracehound_gpu_xid_errors", pci_bus_id=PCI, xid=13) == 1
    kinds = [(e["kind"], e["severity"]) for e in events.items]
    assert kinds == [("sxid", "warning"), ("sxid", "fatal"), ("fallen_off_bus", "fatal"),
                     ("init_failed", "fatal"), ("xid", "error")]
    assert events.items[-1]["pci_bus_id"] == PCI
    assert all(e["name"] and e["action"] for e in events.items)
    assert value(f, "tracehound_gpu_health", pci_bus_id=PCI, condition="lost") == 1


def test_health_gauge_and_events_for_a_fatal_xid_until_the_window_passes():
    clock = Clock(5000.0)
    hub, events, col = hub_only(clock, window=60)
    # read back from the ring at start-up, logged 10 s ago by the kernel's clock
    hub.kernel_event(line("NVRM: Xid (PCI:0000:3b:00): 95, Uncontained", usec=int(4990e6),
                          replayed=True))
    hub.run_once(clock.t)
    f = scrape(col)
    assert value(f, "tracehound_gpu_health", pci_bus_id=PCI, condition="recent_fatal_xid") == 1
    assert value(f, "tracehound_gpu_health", pci_bus_id=PCI, condition="lost") == 0
    clock.t += 49
    hub.run_once(clock.t)
    assert value(scrape(col), "tracehound_gpu_health", condition="recent_fatal_xid") == 1
    clock.t += 2
    hub.run_once(clock.t)
    assert value(scrape(col), "tracehound_gpu_health", condition="recent_fatal_xid") == 0
    health = [e for e in events.items if e["event"] == "gpu_health"]
    assert [(e["condition"], e["state"]) for e in health] == [
        ("recent_fatal_xid", "active"), ("recent_fatal_xid", "cleared")]
    assert health[1]["xid"] == 95 and health[1]["pci_bus_id"] == PCI
    assert events.items[0]["uptime_seconds"] == 4990.0      # when the kernel logged it


def test_a_line_read_live_is_timed_by_its_arrival_not_the_kernel_clock():
    clock = Clock(5000.0)
    hub, _, col = hub_only(clock, window=60)
    # the kernel's clock drifted 300 s behind: the line is still news, and pairs
    hub.kernel_event(line("NVRM: Xid (PCI:0000:3b:00): 48, x", usec=int(4700e6)))
    assert value(scrape(col), "tracehound_gpu_health", condition="recent_fatal_xid") == 1
    assert not hub.ledger.report("nvml", PCI, 48)
    # an old line read back at start-up is history
    hub.kernel_event(line("NVRM: Xid (PCI:0000:3c:00): 48, x", usec=int(4700e6), replayed=True))
    assert value(scrape(col), "tracehound_gpu_health", pci_bus_id="0000:3c:00.0",
                 condition="recent_fatal_xid") == 0
    assert hub.ledger.report("nvml", "0000:3c:00.0", 48)


def test_the_rings_history_at_a_first_start_is_counted_without_events():
    clock = Clock(5000.0)
    hub, events, col = hub_only(clock)
    for text in ("NVRM: Xid (PCI:0000:3b:00): 79, pid=1, name=x, gone",
                 "NVRM: GPU 0000:3b:00.0: GPU has fallen off the bus.",
                 "nvidia-nvswitch0: SXid (PCI:0000:c7:00.0): 24007, Fatal, x"):
        hub.kernel_event(line(text, usec=int(4000e6), replayed=True, history=True))
    assert events.items == []
    f = scrape(col)
    assert value(f, "tracehound_gpu_xid_errors", pci_bus_id=PCI, xid=79) == 1
    assert value(f, "tracehound_gpu_fallen_off_bus", pci_bus_id=PCI) == 1
    assert value(f, "tracehound_gpu_nvswitch_sxid_errors", sxid=24007) == 1
    # the health rules still see it: lost (latched), the fatal XID long past
    assert value(f, "tracehound_gpu_health", pci_bus_id=PCI, condition="lost") == 1
    assert value(f, "tracehound_gpu_health", pci_bus_id=PCI, condition="recent_fatal_xid") == 0
    hub.run_once(clock.t)
    assert [(e["event"], e["condition"], e["state"]) for e in events.items] == [
        ("gpu_health", "lost", "active")]


def test_nvml_observations_feed_health_through_the_hub():
    hub, _, col = hub_only()
    obs = [{"labels": {"gpu": "0", "uuid": "u", "model": "m"}, "lost": False, "key": PCI,
            "ecc_pending": 0, "row_remap_failure": 1, "clock_reasons": {"hw_thermal_slowdown"},
            "nvlink_up": {0: True}},
           {"labels": {"gpu": "1", "uuid": "v", "model": "m"}, "lost": True, "key": "nvml:1"}]
    assert hub.observe(obs) is obs
    f = scrape(col)
    assert value(f, "tracehound_gpu_health", pci_bus_id=PCI, condition="row_remap_failure") == 1
    assert value(f, "tracehound_gpu_health", pci_bus_id=PCI, condition="thermal_slowdown") == 1
    assert value(f, "tracehound_gpu_health", pci_bus_id=PCI, condition="nvlink_down") == 0
    assert value(f, "tracehound_gpu_health", pci_bus_id="nvml:1", condition="lost") == 1


def test_watcher_counters_are_exported(tmp_path):
    hub, _, _ = hub_only()
    w = KmsgWatcher(str(tmp_path / "none"), None)
    w.records_read, w.malformed, w.records_lost, w.overruns = 10, 2, 3, 1
    f = scrape(GpuKernelLogCollector(hub, w))
    assert value(f, "tracehound_gpu_kmsg_up") == 0          # never started
    assert value(f, "tracehound_gpu_kmsg_records_read") == 10
    assert value(f, "tracehound_gpu_kmsg_malformed") == 2
    assert value(f, "tracehound_gpu_kmsg_records_lost") == 3
    assert value(f, "tracehound_gpu_kmsg_overruns") == 1
