"""The kernel log beside a real GPU: an XID line naming a GPU NVML enumerated
is counted under that GPU's index and UUID, once, with an event naming it.

The line is XID 14, the number NVIDIA reserves for an injected test error
(severity info), written by the gpu.xid fault with the real GPU's bus id:
NVML reports nothing for it, so the count must be exactly one."""
import os
import time

import pytest

from tracehound.chaos.faults import get as fault
from tracehound.collectors.gpu import open_gpu_collector
from tracehound.collectors.gpu_kmsg import GpuKernelLogCollector
from tracehound.detect.gpu import GpuDetector
from tracehound.detect.gpu_kmsg import GpuKernelLog
from tracehound.gpu.kmsg import KmsgWatcher

# the bus id of the marker line: PCI bus 0xff, device 0x1f names no GPU
MARKER_BUS_ID = "0000:ff:1f.0"

pytestmark = pytest.mark.skipif(not os.access("/dev/kmsg", os.R_OK | os.W_OK),
                                reason="reading and writing /dev/kmsg needs root")


def test_a_kernel_log_xid_is_counted_under_the_nvml_gpu(tmp_path):
    events = []
    detector = GpuDetector(emit=events.append)
    hub = GpuKernelLog(detector)
    col, reason = open_gpu_collector(detector=detector, xid_sink=hub.nvml_xid)
    assert col is not None, reason
    watcher = None
    try:
        hub.set_gpus(col.gpus)
        col.start()
        gpu = next(g for g in col.gpus if g.pci_bus_id)
        watcher = KmsgWatcher(state_file=str(tmp_path / "kmsg-seq"),
                              on_event=hub.kernel_event).start()
        assert watcher.wait_caught_up(30), watcher.error
        xid = fault("gpu.xid")
        state = xid.prepare(xid.with_defaults({"xid": 14, "pci_bus_id": gpu.pci_bus_id}),
                            "gpu-tier").state
        xid.apply(state)
        # a second line, for a bus id no device has: the log is read in order,
        # so once it is counted the real GPU's count is final
        marker = xid.prepare(xid.with_defaults({"xid": 14, "pci_bus_id": MARKER_BUS_ID}),
                             "gpu-tier-marker").state
        xid.apply(marker)

        def counted(bus_id):
            return [s for f in GpuKernelLogCollector(hub, watcher).collect()
                    if f.name == "tracehound_gpu_xid_errors" for s in f.samples
                    if s.labels["pci_bus_id"] == bus_id and s.labels["xid"] == "14"]

        deadline = time.monotonic() + 30
        while not counted(MARKER_BUS_ID):
            assert time.monotonic() < deadline, "the marker XID line was never counted"
            time.sleep(0.05)
        samples = counted(gpu.pci_bus_id)
        assert [(s.labels["gpu"], s.labels["uuid"], s.value) for s in samples] == [
            (str(gpu.index), gpu.uuid, 1)]
        (event,) = [e for e in events if e.get("xid") == 14]
        assert (event["gpu"], event["uuid"], event["severity"]) == (str(gpu.index), gpu.uuid,
                                                                   "info")
    finally:
        if watcher is not None:
            watcher.stop()
        col.close()
