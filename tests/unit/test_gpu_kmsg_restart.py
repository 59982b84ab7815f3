"""A kernel-log reader that fails is reopened after a growing pause, says so
(a log line, tracehound_gpu_kmsg_restarts_total) and shows it in
tracehound_gpu_kmsg_up; what it handed on before is not handed on again.

The failures are real where they can be made: the real reader (DevKmsg)
pointed at a directory (read() fails with EISDIR) or at a regular file
(read() reaches its end, which /dev/kmsg never does). An exception outside
one record's handling cannot be caused by any record (each one is caught),
so it is injected at the boundary: the source's read() raises it once."""
import logging
import re

from tracehound.collectors.gpu_kmsg import GpuKernelLogCollector
from tracehound.detect.gpu import GpuDetector
from tracehound.detect.gpu_kmsg import GpuKernelLog
from tracehound.gpu import kmsg
from tracehound.gpu.kmsg import KmsgWatcher

from .test_gpu_kmsg import FakeReader, FakeRing, xid
from .waiting import DEADLINE_S, wait_for, wait_until

FAST = (0.01, 0.08)


def metric(watcher, name):
    hub = GpuKernelLog(GpuDetector(emit=lambda e: None))
    for fam in GpuKernelLogCollector(hub, watcher).collect():
        if fam.name == name:
            return fam.samples[0].value
    raise AssertionError(f"no {name}")


def test_a_read_error_restarts_the_reader_with_backoff(tmp_path, caplog):
    """Before, a read error was retried on the same descriptor every poll,
    forever, and tracehound_gpu_kmsg_up said 1 all along."""
    directory = tmp_path / "not-a-log"
    directory.mkdir()
    w = KmsgWatcher(path=str(directory), state_file=None, poll_s=0.02, backoff_s=FAST)
    with caplog.at_level(logging.WARNING, logger=kmsg.__name__):
        w.start()
        try:
            wait_until(lambda: w.restarts >= 4, "four restarts of the failing reader")
            assert w.running and not w.up
            assert metric(w, "tracehound_gpu_kmsg_up") == 0
            assert metric(w, "tracehound_gpu_kmsg_restarts") >= 4
        finally:
            assert w.stop()
    lines = [r.getMessage() for r in caplog.records if "reader stopped" in r.getMessage()]
    assert len(lines) == w.restarts
    assert "Is a directory" in lines[0]
    # the pause doubles up to its bound
    pauses = [float(re.search(r" in ([0-9.]+) s \(restart", line)[1]) for line in lines]
    assert pauses[:4] == [0.01, 0.02, 0.04, 0.08] and max(pauses) == 0.08


def test_a_reader_that_reaches_an_end_restarts_and_hands_nothing_on_twice(tmp_path):
    log = tmp_path / "log"
    log.write_bytes(b"4,5,100,-;" + xid(79).encode() + b"\n")
    events = []
    w = KmsgWatcher(path=str(log), state_file=None, on_event=events.append,
                    boot_id=lambda: "b", poll_s=0.02, backoff_s=FAST).start()
    try:
        wait_until(lambda: w.restarts >= 3, "three restarts at the file's end")
        assert [e.number for e in events] == [79]       # read again after each reopen: skipped
    finally:
        assert w.stop()


class RaisesOnce(FakeReader):
    """The source's read() raises what no record can cause, once in all."""

    def __init__(self, ring, raised: list):
        super().__init__(ring)
        self.raised = raised

    def read(self, timeout):
        if not self.raised and self.pos == 2:
            self.raised.append(True)
            raise RuntimeError("the reader's own bug")
        return super().read(timeout)


def test_an_unexpected_exception_restarts_the_reader_which_then_reads_on(caplog):
    """Before, the thread ended for good and up said 0 until the agent restarted."""
    ring = FakeRing()
    ring.log(xid(13), xid(31), xid(48))
    opened, raised = [], []

    def open_source():
        opened.append(RaisesOnce(ring, raised))
        return opened[-1]
    events = []
    w = KmsgWatcher(state_file=None, on_event=events.append, open_source=open_source,
                    boot_id=lambda: "b", poll_s=0.02, backoff_s=FAST)
    with caplog.at_level(logging.WARNING, logger=kmsg.__name__):
        w.start()
        try:
            assert w.wait_caught_up(DEADLINE_S)
            ring.log(xid(64))
            assert wait_for(lambda: len(events) == 4)
            assert [e.number for e in events] == [13, 31, 48, 64]
            assert w.restarts == 1 and len(opened) == 2 and w.up and w.running
            assert metric(w, "tracehound_gpu_kmsg_up") == 1
        finally:
            assert w.stop()
    assert "RuntimeError: the reader's own bug" in caplog.text
    assert opened[0].closed
