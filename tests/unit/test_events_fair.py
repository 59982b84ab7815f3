"""A flood of one kind of event cannot push the others out of /events.

The flood goes the real way: driver lines parsed by the kernel-log parser,
merged by the GPU kernel-log hub, raised by the GPU detector on the
tracehound.events logger, kept by the agent's EventLog and read over HTTP
from a real Exporter. Before, the buffer was one FIFO ring: 3,000 XID 13
lines evicted a fatal XID of another GPU, a GPU health change and another
detector's crash event."""
import json
import urllib.request

import pytest
from prometheus_client import CollectorRegistry

from tracehound.detect import log_event, now_iso
from tracehound.detect.gpu import GpuDetector
from tracehound.detect.gpu_kmsg import GpuKernelLog
from tracehound.exporter.events import EventLog
from tracehound.exporter.server import Exporter
from tracehound.gpu.kmsg import parse_gpu_line

CAPACITY = 512
FLOOD = 3000


@pytest.fixture
def served():
    log = EventLog(capacity=CAPACITY).attach()
    exporter = Exporter(CollectorRegistry(), "127.0.0.1:0", {"/events": log.wsgi}).start()
    exporter.set_ready(True)
    yield exporter.url.removesuffix("/metrics") + "/events", log
    log.detach()
    exporter.stop()


def page(url: str, since: int = 0) -> dict:
    with urllib.request.urlopen(f"{url}?since={since}", timeout=10) as r:
        return json.load(r)


def test_a_flood_of_one_xid_keeps_a_fatal_xid_and_other_detectors_events(served):
    url, _ = served
    hub = GpuKernelLog(GpuDetector(emit=log_event), fatal_window_s=600)
    hub.kernel_event(parse_gpu_line("NVRM: Xid (PCI:0000:3b:00): 79, pid=1, name=x, "
                                    "GPU has fallen off the bus."))
    hub.run_once(0)                             # the health change: lost, recent fatal XID
    log_event({"time": now_iso(), "event": "exits_anomaly", "kind": "process_crash",
               "pid": 4242, "comm": "trainer"})
    for n in range(FLOOD):                      # one user's faulting kernels on another GPU
        hub.kernel_event(parse_gpu_line(f"NVRM: Xid (PCI:0000:86:00): 13, pid={n}, name=u, "
                                        "Graphics Exception"))
    got = page(url)
    events = got["events"]
    assert len(events) == CAPACITY and got["dropped"] and got["next"] == FLOOD + 4
    fatal = [e for e in events if e["event"] == "gpu_anomaly" and e["xid"] == 79]
    assert len(fatal) == 1 and fatal[0]["pci_bus_id"] == "0000:3b:00.0"
    assert {e["condition"] for e in events if e["event"] == "gpu_health"} == {
        "lost", "recent_fatal_xid"}
    assert [e["comm"] for e in events if e["event"] == "exits_anomaly"] == ["trainer"]
    flood = [e["driver_pid"] for e in events if e.get("xid") == 13]
    # the flood kept its newest, in order, and gave up only its own oldest
    assert flood == list(range(FLOOD - len(flood), FLOOD))
    assert [e["seq"] for e in events] == sorted(e["seq"] for e in events)


def test_two_floods_share_the_buffer_and_a_reader_is_told_what_it_missed(served):
    url, log = served
    for n in range(CAPACITY):
        log_event({"event": "exits_anomaly", "kind": "process_crash", "n": n})
    for n in range(CAPACITY):
        log_event({"event": "rdma_anomaly", "kind": "error_burst", "n": n})
    events = page(url)["events"]
    kinds = [e["event"] for e in events]
    assert kinds.count("exits_anomaly") == kinds.count("rdma_anomaly") == CAPACITY // 2
    newest = page(url, since=2 * CAPACITY - 1)
    assert [e["n"] for e in newest["events"]] == [CAPACITY - 1] and not newest["dropped"]
    assert page(url, since=CAPACITY)["dropped"]     # rdma events after it were evicted
