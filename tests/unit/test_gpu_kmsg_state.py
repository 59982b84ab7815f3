"""The kernel-log position file (--state-dir/kmsg-seq) against what another
user can plant: real symbolic links at the temp and final names, a real
300 MB (sparse) file, a real deeply nested file, a FIFO, and real directories
writable by others. The watcher must neither write through a link, nor read
a big file whole, nor fail to start, nor trust a directory others can write;
it keeps reading the kernel log in every case."""
import logging
import os
import resource
import stat

import pytest

from tracehound.gpu import kmsg
from tracehound.gpu.kmsg import KmsgWatcher
from tracehound.gpu.kmsg_state import MAX_BYTES, StateFile, parse_position

from .test_gpu_kmsg import FakeRing, Run, xid

BOOT = "boot-a"


@pytest.fixture
def state_dir(tmp_path):
    d = tmp_path / "state"
    d.mkdir(mode=0o700)
    return d


def saved(path) -> tuple[int, str | None]:
    with open(path, "rb") as f:
        return parse_position(f.read())


def run_once(ring, path):
    with Run(ring, str(path), boot=BOOT) as r:
        pass
    return r


def test_the_position_is_a_plain_line_written_0600(state_dir):
    ring = FakeRing()
    ring.log(xid(13), xid(31))
    run_once(ring, state_dir / "kmsg-seq")
    assert (state_dir / "kmsg-seq").read_bytes() == b"1 boot-a\n"
    assert stat.S_IMODE(os.stat(state_dir / "kmsg-seq").st_mode) == 0o600
    assert os.listdir(state_dir) == ["kmsg-seq"]
    ring.log(xid(48))
    assert [e.number for e in run_once(ring, state_dir / "kmsg-seq").events] == [48]


def test_the_older_json_position_is_still_read(state_dir):
    (state_dir / "kmsg-seq").write_text('{"seq": 1, "boot_id": "boot-a"}')
    ring = FakeRing()
    ring.log(xid(13), xid(31), xid(48))
    assert [e.number for e in run_once(ring, state_dir / "kmsg-seq").events] == [48]


def test_a_link_planted_at_the_temp_names_is_never_written_through(state_dir, tmp_path):
    """Before, the temp file was `kmsg-seq.<pid>.tmp`, opened with
    open(tmp, "w"): root followed a link planted there and overwrote its
    target. Now the temp name is random and created O_EXCL|O_NOFOLLOW."""
    target = tmp_path / "precious"
    target.write_bytes(b"root's file\n")
    for pid in {os.getpid(), *range(os.getpid() - 2, os.getpid() + 3)}:
        os.symlink(target, state_dir / f"kmsg-seq.{pid}.tmp")
    ring = FakeRing()
    ring.log(xid(13))
    run_once(ring, state_dir / "kmsg-seq")
    assert target.read_bytes() == b"root's file\n"
    assert saved(state_dir / "kmsg-seq") == (0, BOOT)


def test_a_link_planted_at_the_name_is_neither_read_nor_written_through(state_dir, tmp_path,
                                                                        caplog):
    target = tmp_path / "precious"
    position = b'{"seq": 5, "boot_id": "boot-a"}'     # a usable position, if followed
    target.write_bytes(position)
    os.symlink(target, state_dir / "kmsg-seq")
    ring = FakeRing()
    ring.log(*[xid(n) for n in range(8)])
    with caplog.at_level(logging.WARNING, logger=kmsg.__name__):
        r = run_once(ring, state_dir / "kmsg-seq")
    assert len(r.events) == 8       # the link's position was not taken
    assert "ignoring kernel log position" in caplog.text
    assert target.read_bytes() == position
    assert not os.path.islink(state_dir / "kmsg-seq")     # the rename replaced the link
    assert saved(state_dir / "kmsg-seq") == (7, BOOT)


def test_a_300_mb_position_file_is_refused_unread(state_dir, caplog):
    """Before, the whole file was read and parsed (+600 MB resident)."""
    with open(state_dir / "kmsg-seq", "wb") as f:
        f.truncate(300 << 20)       # sparse: costs no disk, reads as 300 MB of zeros
    ring = FakeRing()
    ring.log(xid(13))
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss     # KiB
    with caplog.at_level(logging.WARNING, logger=kmsg.__name__):
        r = run_once(ring, state_dir / "kmsg-seq")
    grown_mib = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - peak) / 1024
    assert grown_mib < 50, f"peak resident memory grew {grown_mib:.0f} MiB"
    assert f"more than a position ({MAX_BYTES} at most)" in caplog.text
    assert [e.number for e in r.events] == [13]
    assert saved(state_dir / "kmsg-seq") == (0, BOOT)


@pytest.mark.parametrize("depth", [10 ** 6, 2000])
def test_a_deeply_nested_position_file_does_not_stop_the_start(state_dir, depth, caplog):
    """Before, json.load raised RecursionError out of start()."""
    (state_dir / "kmsg-seq").write_bytes(b"[" * depth)
    ring = FakeRing()
    ring.log(xid(13))
    with caplog.at_level(logging.WARNING, logger=kmsg.__name__):
        r = run_once(ring, state_dir / "kmsg-seq")
    assert "ignoring kernel log position" in caplog.text
    assert [e.number for e in r.events] == [13]


def test_a_fifo_at_the_name_does_not_hang_the_start(state_dir, caplog):
    os.mkfifo(state_dir / "kmsg-seq")
    ring = FakeRing()
    ring.log(xid(13))
    with caplog.at_level(logging.WARNING, logger=kmsg.__name__):
        r = run_once(ring, state_dir / "kmsg-seq")
    assert "is not a regular file" in caplog.text
    assert [e.number for e in r.events] == [13]


@pytest.mark.parametrize("mode", [0o777, 0o1777, 0o770, 0o722])
def test_a_directory_others_can_write_is_refused_and_the_log_still_read(state_dir, mode,
                                                                        caplog):
    os.chmod(state_dir, mode)
    (state_dir / "kmsg-seq").write_bytes(b"0 boot-a\n")     # planted: would skip record 0
    ring = FakeRing()
    ring.log(xid(13), xid(31))
    with caplog.at_level(logging.WARNING, logger=kmsg.__name__):
        r = run_once(ring, state_dir / "kmsg-seq")
    assert [e.number for e in r.events] == [13, 31]      # the planted position is not trusted
    assert "kernel log position not kept" in caplog.text
    assert "writable by other users" in caplog.text
    assert r.w.state_error and r.w.state_writes == 0
    assert (state_dir / "kmsg-seq").read_bytes() == b"0 boot-a\n"
    assert sorted(os.listdir(state_dir)) == ["kmsg-seq"]


@pytest.mark.skipif(os.geteuid() != 0, reason="giving a directory to another user needs root")
def test_a_directory_another_user_owns_is_refused(state_dir, caplog):
    os.chown(state_dir, 65534, 65534)
    ring = FakeRing()
    ring.log(xid(13))
    with caplog.at_level(logging.WARNING, logger=kmsg.__name__):
        r = run_once(ring, state_dir / "kmsg-seq")
    assert "is owned by uid 65534" in caplog.text
    assert [e.number for e in r.events] == [13] and not os.listdir(state_dir)


def test_a_missing_directory_is_created_for_the_agent_only(tmp_path):
    path = tmp_path / "var" / "lib" / "tracehound" / "kmsg-seq"
    assert StateFile(str(path)).refused() is None
    ring = FakeRing()
    ring.log(xid(13))
    w = KmsgWatcher(state_file=str(path), open_source=ring.open, boot_id=lambda: BOOT,
                    poll_s=0.05).start()
    assert w.wait_caught_up(30) and w.stop()
    assert stat.S_IMODE(os.stat(path.parent).st_mode) == 0o700
    assert saved(path) == (0, BOOT)
