"""Data moved past the read/write calls, counted exactly: io_uring and Linux
AIO requests, copies between files (copy_file_range, sendfile, splice) and
file pages brought into the page cache (memory-mapped and plain reads).

Real programs do the I/O (fio's io_uring and libaio engines, the worker's
syscalls) in a fresh cgroup on a tmpfs and on an ext4 of their own, and the
agent's series for that cgroup and mount must equal the bytes moved. The VM
tier runs this file in every hook mode."""
import json
import os
import subprocess

import pytest

from .conftest import exec_in_cgroup, run_in_cgroup, series

MIB = 1 << 20
SIZE = 4 * MIB
BS = 64 * 1024


@pytest.fixture(params=["tmpfs", "ext4"])
def fs(request):
    return request.getfixturevalue(request.param)


def make_file(path: str, size: int) -> None:
    """Written by the test itself (outside the measured cgroup), on disk."""
    with open(path, "wb") as f:
        f.write(os.urandom(size))
        f.flush()
        os.fsync(f.fileno())


def drop_cache(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def resident_bytes(path: str) -> int:
    """How much of the file is in the page cache now (util-linux fincore)."""
    out = subprocess.run(["fincore", "--bytes", "--noheadings", "--output", "RES", path],
                         capture_output=True, text=True, check=True).stdout
    return int(out.strip())


def fio(cgroup_root, cgroup, *args) -> dict:
    out = exec_in_cgroup(cgroup_root, cgroup, ["fio", "--output-format=json", "--name=t",
                                               "--thread=0", *args])
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    return json.loads(out.stdout[out.stdout.index("{"):])["jobs"][0]


def io_series(agent, cgroup, mnt):
    m = agent.scrape()

    def get(name):
        suffix = "" if name.endswith(("_count", "_sum")) else "_total"
        return series(m, f"tracehound_io_{name}{suffix}", cgroup=cgroup, mountpoint=mnt)
    return get


ENGINES = {
    "io_uring": ["--ioengine=io_uring", "--nonvectored=1"],
    "io_uring-vectored": ["--ioengine=io_uring", "--nonvectored=0"],
    "io_uring-fixed": ["--ioengine=io_uring", "--fixedbufs=1"],
    "libaio": ["--ioengine=libaio", "--iodepth=8"],
}


# the most calls an interval of sampled timing leaves untimed (io.h SAMPLE_K_MAX)
UNTIMED_TAIL = 2 ** (8 + 1)


@pytest.mark.parametrize("engine", list(ENGINES))
def test_async_engines_count_exact_bytes(agent, cgroup_root, cgroup, fs, engine):
    """Writes then reads through the engine: bytes and requests equal what
    fio moved; fsync requests are counted too."""
    args = [*ENGINES[engine], f"--bs={BS}", f"--size={SIZE}", f"--filename={fs}/async-{engine}"]
    # O_DIRECT where the file system takes it (tmpfs only since 6.6)
    direct = ["--direct=1"] if engine == "libaio" and fs.endswith("/mnt") else []
    wrote = fio(cgroup_root, cgroup, "--rw=write", "--fsync=16", *args, *direct)
    assert wrote["write"]["io_bytes"] == SIZE
    got = io_series(agent, cgroup, fs)
    assert got("write_bytes") == SIZE
    assert got("write_requests") == SIZE // BS
    assert got("fsync_requests") == wrote["sync"]["total_ios"] > 0
    assert got("write_errors") == 0
    read = fio(cgroup_root, cgroup, "--rw=read", *args, *direct)
    assert read["read"]["io_bytes"] == SIZE
    got = io_series(agent, cgroup, fs)
    assert got("read_bytes") == SIZE
    assert got("read_requests") == SIZE // BS
    assert got("read_errors") == 0
    if engine.startswith("io_uring"):
        # requests timed from their submission to their completion, each
        # counting as those since its CPU's last timed one (sampled timing):
        # off by at most an interval, the untimed tail of the last one, or
        # other cgroups' calls on the same CPU that a timed one stood for
        for op in ("read", "write"):
            n = got(f"{op}_latency_seconds_count")
            assert n > 0 and abs(n - SIZE // BS) < UNTIMED_TAIL, op


def test_io_uring_latency_spans_submission_to_completion(agent, cgroup_root, cgroup, tmpfs):
    """fio's own completion latency bounds what the kernel measured. At a
    thousand requests a second nearly each is timed (sampled timing times
    every call that comes slower than its gap). Not all need be: on a loaded
    machine fio catches up in bursts, which are sampled, and a request whose
    slot another io_uring user's took is counted untimed (io_async.bpf.h);
    that rare calls are always timed is test_io_accuracy.py's."""
    job = fio(cgroup_root, cgroup, "--ioengine=io_uring", "--rw=write", f"--bs={BS}",
              f"--size={SIZE}", f"--filename={tmpfs}/uring-latency", "--rate_iops=1000")
    m = agent.scrape()
    lb = dict(cgroup=cgroup, mountpoint=tmpfs)
    n = series(m, "tracehound_io_write_latency_seconds_count", **lb)
    total = series(m, "tracehound_io_write_latency_seconds_sum", **lb)
    assert SIZE // BS * 0.9 <= n <= SIZE // BS
    # the kernel's span lies inside fio's (submission to reaping): the timed
    # requests' mean, a subset's, is at most the slowest request fio saw
    assert 0 < total / n <= job["write"]["lat_ns"]["max"] / 1e9


COPIES = ("copy_file_range", "sendfile", "splice")


@pytest.mark.parametrize("how", COPIES)
def test_copies_count_the_source_read_and_the_target_write(agent, cgroup_root, cgroup, fs, how):
    size = SIZE + 12_345
    src, dst = os.path.join(fs, f"{how}-src"), os.path.join(fs, f"{how}-dst")
    make_file(src, size)
    assert run_in_cgroup(cgroup_root, cgroup, [[how, src, dst]]) == [size]
    got = io_series(agent, cgroup, fs)
    assert got("read_bytes") == size
    assert got("write_bytes") == size
    assert got("read_errors") == got("write_errors") == 0


def test_sendfile_to_a_device_counts_only_the_file(agent, cgroup_root, cgroup, tmpfs):
    size = MIB + 7
    src = os.path.join(tmpfs, "sendfile-null-src")
    make_file(src, size)
    assert run_in_cgroup(cgroup_root, cgroup, [["sendfile", src, "/dev/null"]]) == [size]
    m = agent.scrape()
    assert series(m, "tracehound_io_read_bytes_total", cgroup=cgroup, mountpoint=tmpfs) == size
    assert series(m, "tracehound_io_write_bytes_total", cgroup=cgroup) == 0


def test_a_copy_between_two_mounts_reads_on_one_and_writes_on_the_other(
        agent, cgroup_root, cgroup, tmpfs, ext4):
    size = 2 * MIB + 1
    src, dst = os.path.join(ext4, "cross-src"), os.path.join(tmpfs, "cross-dst")
    make_file(src, size)
    assert run_in_cgroup(cgroup_root, cgroup, [["sendfile", src, dst]]) == [size]
    m = agent.scrape()
    assert series(m, "tracehound_io_read_bytes_total", cgroup=cgroup, mountpoint=ext4) == size
    assert series(m, "tracehound_io_write_bytes_total", cgroup=cgroup, mountpoint=ext4) == 0
    assert series(m, "tracehound_io_write_bytes_total", cgroup=cgroup, mountpoint=tmpfs) == size
    assert series(m, "tracehound_io_read_bytes_total", cgroup=cgroup, mountpoint=tmpfs) == 0


@pytest.mark.parametrize("how", ["mmap_read", "read"])
def test_a_cold_read_fills_the_page_cache_with_the_file(agent, cgroup_root, cgroup, ext4, how):
    """Pages come in once: the cold read adds the file's size, a second
    read of the cached file adds nothing."""
    size = 8 * MIB
    path = os.path.join(ext4, f"cold-{how}")
    make_file(path, size)
    drop_cache(path)
    op = [how, path] if how == "mmap_read" else [how, path, BS]
    assert run_in_cgroup(cgroup_root, cgroup, [op]) == [size]
    got = io_series(agent, cgroup, ext4)
    assert got("pagecache_fill_bytes") == size
    assert got("read_bytes") == (size if how == "read" else 0)
    # what memory pressure evicted meanwhile (a busy CI host: a VM beside
    # these tests) comes in again: at least what was gone before the re-read
    # (more may go while it runs), never more than the file
    evicted = size - resident_bytes(path)
    assert run_in_cgroup(cgroup_root, cgroup, [op]) == [size]
    assert size + evicted <= io_series(agent, cgroup, ext4)("pagecache_fill_bytes") <= 2 * size
