"""Kernel-log GPU errors: the watcher against a fake ring that behaves like
/dev/kmsg (oldest record first after open, EPIPE once overtaken). The
parsers' own tests are in test_gpu_kmsg_parse.py."""
import logging
import os
import threading
import time

import pytest

from tracehound.gpu import kmsg
from tracehound.gpu.kmsg import KmsgWatcher
from tracehound.gpu.kmsg_state import parse_position

from .waiting import DEADLINE_S, wait_for, wait_until


# -- a fake /dev/kmsg ----------------------------------------------------------

class FakeRing:
    """The kernel's ring: records by sequence number, oldest ones dropped."""

    def __init__(self, first_seq=0):
        self.lock = threading.Lock()
        self.records = {}
        self.first = self.next = first_seq
        self.opened = 0
        self.idle_reads = 0     # reads that found no record (the watcher's idle rounds)

    def log(self, *messages):
        with self.lock:
            for m in messages:
                self.records[self.next] = b"3,%d,%d,-;%s\n" % (self.next, self.next * 10, m.encode())
                self.next += 1

    def drop_to(self, first):
        with self.lock:
            for seq in range(self.first, first):
                self.records.pop(seq, None)
            self.first = first

    def open(self):
        self.opened += 1
        return FakeReader(self)


class FakeReader:
    def __init__(self, ring):
        self.ring, self.pos, self.closed = ring, ring.first, False

    def read(self, timeout):
        with self.ring.lock:
            if self.pos < self.ring.first:
                self.pos = self.ring.first
                raise BrokenPipeError(32, "Broken pipe")
            rec = self.ring.records.get(self.pos)
            if rec is not None:
                self.pos += 1
                return rec
        time.sleep(min(timeout, 0.005))     # a quiet log: poll() waits a little
        with self.ring.lock:
            self.ring.idle_reads += 1
        return None

    def close(self):
        self.closed = True


def xid(n, tag="x"):
    return f"NVRM: Xid (PCI:0000:3b:00): {n}, pid=1, name={tag}, test"


NOISE = "usb 1-1: new high-speed USB device number 2 using xhci_hcd"


class Run:
    """A watcher over `ring` with its events collected."""

    def __init__(self, ring, state, boot="boot-a", **kw):
        self.events = []
        kw.setdefault("poll_s", 0.05)
        self.w = KmsgWatcher(state_file=state, on_event=self.events.append,
                             open_source=ring.open, boot_id=lambda: boot, **kw)

    def __enter__(self):
        self.w.start()
        assert self.w.wait_caught_up(DEADLINE_S)
        return self

    def __exit__(self, *exc):
        assert self.w.stop()

    def numbers(self):
        return [e.number for e in self.events]


@pytest.fixture
def state(tmp_path):
    return str(tmp_path / "var" / "lib" / "tracehound" / "kmsg-seq")


def saved(state):
    with open(state, "rb") as f:
        seq, boot = parse_position(f.read())
    return {"seq": seq, "boot_id": boot}


def test_restarts_hand_each_record_on_once(state):
    ring = FakeRing()
    ring.log(NOISE, xid(79), NOISE, xid(13), "nvidia-nvswitch1: SXid (PCI:0000:c7:00.0): "
             "12028, Non-fatal, Link 3 error")
    with Run(ring, state) as r1:
        pass
    assert r1.numbers() == [79, 13, 12028]
    assert [e.kind for e in r1.events] == ["xid", "xid", "sxid"]
    assert [e.seq for e in r1.events] == [1, 3, 4] and r1.events[0].usec == 10
    assert saved(state) == {"seq": 4, "boot_id": "boot-a"}
    assert r1.w.records_read == 5 and r1.w.gpu_events == 3
    ring.log(NOISE, xid(48))
    with Run(ring, state) as r2:
        pass
    assert r2.numbers() == [48]
    with Run(ring, state) as r3:
        pass
    assert r3.events == []
    assert saved(state)["seq"] == 6
    assert not [n for n in os.listdir(os.path.dirname(state)) if n.endswith(".tmp")]


def test_lines_logged_while_running_are_seen_and_not_repeated(state):
    ring = FakeRing()
    ring.log(NOISE)
    with Run(ring, state) as r1:
        ring.log(xid(31), NOISE, xid(43))
        assert wait_for(lambda: len(r1.events) == 2)
    with Run(ring, state) as r2:
        pass
    assert r1.numbers() == [31, 43] and r2.events == []
    assert [e.replayed for e in r1.events] == [False, False]


def test_what_the_ring_held_at_start_is_marked_replayed(state):
    ring = FakeRing()
    ring.log(xid(79))
    with Run(ring, state) as r:
        ring.log(xid(13))
        assert wait_for(lambda: len(r.events) == 2)
    # no saved position at the first start: the ring's past is history
    assert [(e.number, e.replayed, e.history) for e in r.events] == [
        (79, True, True), (13, False, False)]
    ring.log(xid(31))           # while no agent reads
    with Run(ring, state) as r2:
        pass
    # missed while down: replayed, and news
    assert [(e.number, e.replayed, e.history) for e in r2.events] == [(31, True, False)]


def test_reboot_seen_by_a_new_boot_id(state):
    ring = FakeRing()
    ring.log(*[NOISE] * 8, xid(79))
    with Run(ring, state, boot="boot-a"):
        pass
    fresh = FakeRing()          # after the reboot: numbering starts again
    fresh.log(xid(62), NOISE)
    with Run(fresh, state, boot="boot-b") as r:
        pass
    assert r.numbers() == [62]
    assert saved(state) == {"seq": 1, "boot_id": "boot-b"}


def test_reboot_seen_by_sequence_numbers_when_no_boot_id(state):
    ring = FakeRing()
    ring.log(*[NOISE] * 20, xid(79))
    with Run(ring, state, boot=None):
        pass
    fresh = FakeRing()
    fresh.log(NOISE, xid(119), xid(120))
    with Run(fresh, state, boot=None) as r:
        pass
    assert r.numbers() == [119, 120]
    assert fresh.opened == 2    # read once to find the end, once to hand on
    assert saved(state)["seq"] == 2
    with Run(fresh, state, boot=None) as again:
        pass
    assert again.events == []


def test_records_overwritten_while_down_are_counted_lost(state):
    ring = FakeRing()
    ring.log(NOISE, NOISE, xid(8))
    with Run(ring, state):
        pass
    ring.log(xid(45), NOISE, NOISE, xid(94), NOISE)    # seq 3..7
    ring.drop_to(6)                                     # 3, 4, 5 never read
    with Run(ring, state) as r:
        pass
    assert r.numbers() == [94]
    assert r.w.records_lost == 3


def test_overrun_while_reading_is_counted_and_reading_goes_on(state):
    ring = FakeRing()
    ring.log(xid(13))
    with Run(ring, state) as r:
        with ring.lock:     # the reader cannot read in between: as a burst would
            for n in range(30):
                ring.records[ring.next] = b"3,%d,0,-;%s\n" % (ring.next, xid(n).encode())
                ring.next += 1
            for seq in range(ring.first, 21):
                ring.records.pop(seq)
            ring.first = 21
        assert wait_for(lambda: len(r.events) == 11)
        assert r.w.overruns == 1
        assert r.w.records_lost == 20
        ring.log(xid(95))
        assert wait_for(lambda: len(r.events) == 12)
    assert r.numbers() == [13, *range(20, 30), 95]


@pytest.mark.parametrize("content", [b"", b"not json", b'{"seq": "12"}', b"[1, 2]",
                                     b'{"seq": -1}', b'{"seq": true}', b'{"boot_id": "a"}',
                                     b"\xff\xfe\x00garbage", b"7", b"7 boot a", b"-1 boot-a",
                                     b"\xd9\xa3 boot-a", b'{"seq": 7, "boot_id": ["a"]}'])
def test_unreadable_state_is_ignored_with_a_warning(state, content, caplog):
    os.makedirs(os.path.dirname(state), exist_ok=True)
    with open(state, "wb") as f:
        f.write(content)
    ring = FakeRing()
    ring.log(xid(79), xid(48))
    with caplog.at_level(logging.WARNING, logger=kmsg.__name__):
        with Run(ring, state) as r:
            pass
    assert r.numbers() == [79, 48]
    assert "ignoring kernel log position" in caplog.text
    assert saved(state) == {"seq": 1, "boot_id": "boot-a"}


def idle_rounds(ring, rounds=3):
    """Wait until the watcher has gone through `rounds` whole idle rounds
    (a read that found nothing, and the save that follows it) from now."""
    with ring.lock:
        target = ring.idle_reads + rounds + 1     # the read after a round ends it
    wait_until(lambda: ring.idle_reads >= target, f"{rounds} idle rounds of the watcher")


def test_state_is_saved_at_most_once_per_interval_and_on_stop(state):
    now = [100.0]
    ring = FakeRing()
    ring.log(xid(13))
    with Run(ring, state, clock=lambda: now[0], persist_interval_s=1.0) as r:
        assert r.w.state_writes == 1 and saved(state)["seq"] == 0
        for n in range(5):
            ring.log(xid(n))
            assert wait_for(lambda: len(r.events) == n + 2)
        idle_rounds(ring)   # each one saves if it may: still inside the interval
        assert r.w.state_writes == 1 and saved(state)["seq"] == 0
        now[0] += 1.0
        assert wait_for(lambda: r.w.state_writes == 2)
        assert saved(state)["seq"] == 5
        ring.log(NOISE)
        assert wait_for(lambda: r.w.records_read == 7)
        idle_rounds(ring)
        assert r.w.state_writes == 2 and saved(state)["seq"] == 5
    assert r.w.state_writes == 3 and saved(state)["seq"] == 6


def test_malformed_lines_are_counted_not_handed_on(state):
    ring = FakeRing()
    ring.log("NVRM: Xid (PCI:0000:3b:00): garbled", xid(79), "nvidia-nvswitch0: SXid junk")
    with Run(ring, state) as r:
        pass
    assert r.numbers() == [79]
    assert r.w.malformed == 2 and r.w.gpu_events == 1


def test_a_failing_handler_does_not_stop_the_watcher(state):
    ring = FakeRing()
    ring.log(xid(13), xid(31))
    seen = []

    def handler(ev):
        seen.append(ev.number)
        raise RuntimeError("handler bug")
    w = KmsgWatcher(state_file=state, on_event=handler, open_source=ring.open,
                    boot_id=lambda: "b", poll_s=0.05).start()
    assert w.wait_caught_up(DEADLINE_S) and w.running
    assert w.stop()
    assert seen == [13, 31]


def test_without_a_state_file_the_whole_ring_is_handed_on_each_time():
    ring = FakeRing()
    ring.log(xid(79))
    for _ in range(2):
        with Run(ring, None) as r:
            pass
        assert r.numbers() == [79]


def test_unopenable_kmsg_is_reported_not_raised(state):
    def refuse():
        raise PermissionError(13, "Operation not permitted")
    w = KmsgWatcher(path="/dev/kmsg", state_file=state, open_source=refuse).start()
    assert not w.running
    assert "Operation not permitted" in w.error
    assert w.stop()


def test_default_source_is_the_kernel_log_path(tmp_path):
    missing = str(tmp_path / "no-kmsg")
    w = KmsgWatcher(path=missing, state_file=None).start()
    assert missing in w.error and not w.running
