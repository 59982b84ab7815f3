"""Stopping and starting the kernel-log watcher again, and a record it cannot
read: the position it saved and what it hands on."""
import threading

from tracehound.gpu import kmsg
from tracehound.gpu.kmsg import KmsgWatcher

from .test_gpu_kmsg import FakeReader, FakeRing, Run, saved, state, xid  # noqa: F401 (state: a fixture)
from .waiting import DEADLINE_S, wait_for, wait_until


class BlockingSource:
    """A quiet log: each read blocks, as poll() does, until the timeout or
    until the test releases it."""

    def __init__(self):
        self.reads = 0
        self.reading = threading.Event()
        self.release = threading.Event()
        self.closed = False

    def read(self, timeout):
        self.reads += 1
        self.reading.set()
        self.release.wait(timeout)
        return None

    def close(self):
        self.closed = True


def test_stop_ends_the_watcher_after_the_read_in_progress(state):
    source = BlockingSource()
    # a poll far longer than the test: only the release ends the blocked read
    w = KmsgWatcher(state_file=state, open_source=lambda: source, boot_id=lambda: None,
                    poll_s=3600).start()
    assert source.reading.wait(DEADLINE_S)
    stopped = []
    stopper = threading.Thread(target=lambda: stopped.append(w.stop()), daemon=True)
    stopper.start()
    # released only once the stop is asked for, so a read begun after it is seen
    wait_until(lambda: w._stop.is_set(), "stop() to ask the watcher to end")
    source.release.set()            # the read in progress returns, as poll() would
    stopper.join(DEADLINE_S)
    assert stopped == [True] and not w.running
    assert source.reads == 1        # no read begun after stop() was asked
    assert source.closed


def test_watcher_can_be_started_again_after_stop(state):
    ring = FakeRing()
    ring.log(xid(79))
    r = Run(ring, state)
    with r:
        pass
    ring.log(xid(64))
    with r:
        pass
    assert r.numbers() == [79, 64]
    # the second start reads record 0 again, to skip it
    assert r.w.gpu_events == 2 and r.w.records_read == 3


class FailingReader(FakeReader):
    """Reads `good` records, then fails every read with EIO."""

    def __init__(self, ring, good):
        super().__init__(ring)
        self.good = good
        self.failures = 0

    def read(self, timeout):
        if self.good == 0:
            self.failures += 1
            raise OSError(5, "Input/output error")
        self.good -= 1
        return super().read(timeout)


def test_stopping_before_the_saved_position_is_reached_keeps_it(state, caplog):
    ring = FakeRing()
    ring.log(*[xid(n) for n in range(10)])
    with Run(ring, state):
        pass
    assert saved(state)["seq"] == 9
    reader = FailingReader(ring, 4)
    w = KmsgWatcher(state_file=state, on_event=lambda ev: None, boot_id=lambda: "boot-a",
                    open_source=lambda: reader, poll_s=0.02, backoff_s=(0.01, 0.04)).start()
    assert wait_for(lambda: w.records_read == 4)
    wait_until(lambda: reader.failures >= 3, "the watcher to retry the failing read")
    assert not w.wait_caught_up(0) and w.gpu_events == 0
    assert w.stop()
    assert saved(state)["seq"] == 9
    # one line per restart, each after a longer pause: never one per read
    # (a failure seen as the stop was asked for ends the reader unlogged)
    assert caplog.text.count("Input/output error") == w.restarts >= 2
    assert reader.failures in (w.restarts, w.restarts + 1)


def test_a_record_that_cannot_be_read_is_counted_and_the_watcher_goes_on(state, monkeypatch):
    real = kmsg.parse_gpu_line

    def parse(message):
        if "poison" in message:
            raise ValueError("a parser bug")
        return real(message)

    monkeypatch.setattr(kmsg, "parse_gpu_line", parse)
    ring = FakeRing()
    ring.log(xid(13), "NVRM: poison", xid(31))
    with Run(ring, state) as r:
        assert wait_for(lambda: len(r.events) == 2)
        assert [e.number for e in r.events] == [13, 31]
        assert r.w.malformed == 1 and r.w.running
