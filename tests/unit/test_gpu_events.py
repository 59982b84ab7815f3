"""The NVML event thread: XIDs and other events become counters, never latched."""
import ctypes
import threading
import time

import pytest

from tracehound.gpu.device import Gpu
from tracehound.gpu.events import EventWatcher, handle_key

from . import fake_nvml as fn
from .fake_nvml import FakeGpu, FakeNvml
from .gpu_helpers import Events, make_collector, make_host, scrape, value

XID = fn.nvmlEventTypeXidCriticalError


def wait_for(cond, timeout=5.0):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if cond():
            return True
        time.sleep(0.01)
    return cond()


def two_gpus():
    return [FakeGpu(uuid="GPU-aaaa", pci_bus_id="00000000:3B:00.0", compute_procs=[(4242, 1 << 20)]),
            FakeGpu(uuid="GPU-bbbb", pci_bus_id="00000000:86:00.0")]


def started(tmp_path, nvml, events=None):
    host = make_host(tmp_path, nodes={0: "0-1"}, procs={4242: ("/slurm/job_7", "0-1", "0")})
    return make_collector(nvml, host, events=events, start=True)


def test_xid_events_count_every_occurrence(tmp_path):
    nvml = FakeNvml(two_gpus())
    events = Events()
    col = started(tmp_path, nvml, events)
    try:
        assert nvml.queue_event(0, XID, 79)
        assert nvml.queue_event(0, XID, 79)
        assert nvml.queue_event(0, XID, 13)
        assert nvml.queue_event(1, fn.nvmlEventTypeSingleBitEccError)
        assert wait_for(lambda: nvml.pending_events() == 0 and len(events.items) == 3)

        f = scrape(col)
        xid = "tracehound_gpu_xid_errors"
        assert value(f, xid, gpu=0, uuid="GPU-aaaa", xid=79) == 2     # a counter, not a 0/1 flag
        assert value(f, xid, gpu=0, xid=13) == 1
        assert value(f, xid, gpu=1) is None
        ev = "tracehound_gpu_events"
        assert value(f, ev, gpu=1, type="single_bit_ecc") == 1
        # registered types are exported from the start, at 0
        assert value(f, ev, gpu=0, type="single_bit_ecc") == 0
        assert value(f, ev, gpu=0, type="pstate") == 0
        assert value(f, ev, gpu=1, type="clock") == 0
        assert value(f, "tracehound_gpu_anomalies", gpu=0, kind="xid") == 3

        # each XID is its own anomaly event, naming the process on that GPU
        first = events.items[0]
        assert first["kind"] == "xid" and first["xid"] == 79 and first["uuid"] == "GPU-aaaa"
        assert first["processes"] == [{"pid": 4242, "cgroup": "/slurm/job_7"}]

        # the same XID again, after a scrape, keeps counting
        nvml.queue_event(0, XID, 79)
        assert wait_for(lambda: len(events.items) == 4)
        assert value(scrape(col), xid, gpu=0, xid=79) == 3
    finally:
        col.close()


def test_stop_joins_the_thread_and_frees_the_set(tmp_path):
    nvml = FakeNvml(two_gpus())
    before = set(threading.enumerate())
    col = started(tmp_path, nvml)
    thread = col.events._thread
    assert thread.is_alive()
    assert wait_for(lambda: nvml.calls["nvmlEventSetWait_v2"] >= 2)   # timing out and looping
    col.close()
    assert not thread.is_alive()
    assert nvml.freed_sets == 1 and nvml.shutdowns == 1
    # no thread the collector started is left to wait on the freed set
    assert [t.name for t in threading.enumerate() if t not in before] == []
    assert not any(t.name == "nvml-events" for t in threading.enumerate())


def test_wait_errors_do_not_end_event_collection(tmp_path):
    nvml = FakeNvml(two_gpus())
    nvml.wait_errors = [fn.NVML_ERROR_UNKNOWN, fn.NVML_ERROR_GPU_IS_LOST]
    col = started(tmp_path, nvml)
    try:
        nvml.queue_event(0, XID, 48)
        assert wait_for(lambda: value(scrape(col), "tracehound_gpu_xid_errors", xid=48) == 1)
        assert col.events.running
    finally:
        col.close()


def test_only_supported_event_types_are_registered(tmp_path):
    gpus = two_gpus()
    gpus[1].supported_events = XID | fn.nvmlEventTypeDoubleBitEccError
    nvml = FakeNvml(gpus)
    col = started(tmp_path, nvml)
    try:
        assert nvml.registered[0] == 0x1F
        assert nvml.registered[1] == XID | fn.nvmlEventTypeDoubleBitEccError
        assert col.events.registered[1] == ["xid", "double_bit_ecc"]
        f = scrape(col)
        assert {lbl["type"] for _, lbl, _ in f["tracehound_gpu_events"] if lbl["gpu"] == "1"} \
            == {"double_bit_ecc"}
        # the driver does not deliver what was not registered
        assert not nvml.queue_event(1, fn.nvmlEventTypeClock)
    finally:
        col.close()


def test_a_refused_mask_falls_back_to_single_types():
    class Picky(FakeNvml):
        def nvmlDeviceRegisterEvents(self, h, event_types, event_set):
            if event_types & fn.nvmlEventTypePState:
                raise fn.NVMLError(fn.NVML_ERROR_NOT_SUPPORTED)
            super().nvmlDeviceRegisterEvents(h, event_types, event_set)

    nvml = Picky([FakeGpu()])
    gpu = Gpu(0, nvml.handles[0], "GPU-x", "m")
    watcher = EventWatcher(nvml, [gpu], lambda *a: None, wait_ms=10).start()
    try:
        assert watcher.registered[0] == ["xid", "single_bit_ecc", "double_bit_ecc", "clock"]
        assert nvml.registered[0] == 0x1F & ~fn.nvmlEventTypePState
    finally:
        watcher.stop()


def test_no_event_set_still_scrapes(tmp_path):
    nvml = FakeNvml(two_gpus(), event_set_error=fn.NVML_ERROR_NOT_SUPPORTED)
    col = started(tmp_path, nvml)
    assert not col.events.running
    f = scrape(col)
    assert value(f, "tracehound_gpu_lost", gpu=0) == 0
    assert f["tracehound_gpu_events"] == []
    col.close()
    assert nvml.freed_sets == 0 and nvml.shutdowns == 1


def test_ctypes_handles_compare_by_address():
    import pynvml   # nvidia-ml-py, a dependency of the package
    a = ctypes.cast(ctypes.c_void_p(0x1000), pynvml.c_nvmlDevice_t)
    b = ctypes.cast(ctypes.c_void_p(0x1000), pynvml.c_nvmlDevice_t)
    c = ctypes.cast(ctypes.c_void_p(0x2000), pynvml.c_nvmlDevice_t)
    assert a is not b and handle_key(a) == handle_key(b) != handle_key(c)


def test_a_thread_stuck_in_nvml_keeps_the_library_up(tmp_path):
    release = threading.Event()

    class Stuck(FakeNvml):
        def nvmlEventSetWait_v2(self, event_set, timeoutms):
            release.wait(10)      # a driver that ignores the timeout
            raise fn.NVMLError(fn.NVML_ERROR_TIMEOUT)

    nvml = Stuck(two_gpus())
    col = started(tmp_path, nvml)
    try:
        col.close()
        # freeing the set or shutting NVML down under the waiting thread would crash it
        assert nvml.freed_sets == 0 and nvml.shutdowns == 0
    finally:
        release.set()
