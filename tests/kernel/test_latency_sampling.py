"""Sampled timing against the real kernel: a storm of page-cache reads is
timed in part while its bytes and calls stay exact and its histogram still
counts about every call; the calls that follow it at a low rate are all
timed again; `--latency every` times every call. (Calls slower than the
sampling gap are all timed: test_io_accuracy.py, in every hook mode.)"""
import math
import os
import sys

import pytest

from tests.kernel.conftest import (exec_in_cgroup, remove_cgroup, require_tools, run_in_cgroup,
                                   mount_of, series, start_agent, stop_agent)
from testbed.io_audit import buckets, full_histograms, summed
from tracehound.host.mounts import MountTable

MiB = 1 << 20
READS = 8192            # 4 KiB random reads of a 32 MiB file
TIMED = "tracehound_io_latency_timed_calls_total"


def read_storm(cgroup_root: str, cgroup: str, path: str) -> None:
    """fio's 4 KiB random reads of a page-cached file, the fastest I/O call
    there is: hundreds of thousands a second."""
    require_tools("fio")
    out = exec_in_cgroup(cgroup_root, cgroup, [
        "fio", "--name=storm", f"--filename={path}", "--size=32M", "--bs=4k", "--rw=randread",
        "--ioengine=psync", "--output-format=terse"])
    assert out.returncode == 0, out.stdout + out.stderr


def reads(metrics: dict, cgroup: str, mountpoint: str) -> tuple[float, float]:
    """(read requests, the read histogram's count) of one cgroup and mount"""
    lb = {"cgroup": cgroup, "mountpoint": mountpoint}
    return (series(metrics, "tracehound_io_read_requests_total", **lb),
            series(metrics, "tracehound_io_read_latency_seconds_count", **lb))


@pytest.fixture
def quiet(cgroup_root):
    rel = f"/thtest/quiet-{os.getpid()}-{os.urandom(4).hex()}"
    os.makedirs(cgroup_root + rel)
    yield rel
    remove_cgroup(cgroup_root + rel)


def test_a_storm_of_reads_is_timed_in_part_and_counted_in_full(agent, cgroup_root, cgroup,
                                                               tmpfs):
    before = series(agent.scrape(), TIMED, op="read")
    read_storm(cgroup_root, cgroup, os.path.join(tmpfs, "storm"))
    m = agent.scrape()
    requests, counted = reads(m, cgroup, tmpfs)
    assert requests == READS
    assert series(m, "tracehound_io_read_bytes_total", cgroup=cgroup, mountpoint=tmpfs) == 32 * MiB
    # every cgroup's timed reads together, the node's background included:
    # still far fewer than the storm's reads alone
    assert series(m, TIMED, op="read") - before < READS / 2
    # each timed read stands for those since the CPU's last timed one: the
    # count misses at most the untimed tail of each CPU's last interval
    assert abs(counted - READS) <= READS / 10, counted


def test_calls_that_follow_a_storm_at_a_low_rate_are_all_timed(agent, cgroup_root, cgroup, quiet,
                                                               tmpfs):
    read_storm(cgroup_root, cgroup, os.path.join(tmpfs, "storm-before"))
    f = os.path.join(tmpfs, "after-storm")
    run_in_cgroup(cgroup_root, quiet, [["write", f, 8 * MiB, MiB], ["read", f, MiB]])
    m = agent.scrape()
    requests, counted = reads(m, quiet, tmpfs)
    assert requests == 9 and counted == requests       # 8 MiB and the read at the end
    lb = {"cgroup": quiet, "mountpoint": tmpfs}
    assert series(m, "tracehound_io_write_latency_seconds_count", **lb) == \
        series(m, "tracehound_io_write_requests_total", **lb) == 8


def test_calls_that_sleep_weigh_as_much_as_the_rest(hook_mode, cgroup_root, cgroup, disk_dir):
    """O_DIRECT reads of a disk file sleep in every call, and come fast
    enough for a wide gap to sample them: those the sampler leaves out still
    count in the weights of those it times, so the histogram's count follows
    the requests (had a sleeping call given its place back, the count would
    be about one call in an interval)."""
    require_tools("fio")
    wide = start_agent(hook_mode, "--latency-sample-gap", "1000")
    try:
        path = os.path.join(disk_dir, "direct")
        out = exec_in_cgroup(cgroup_root, cgroup, [
            "fio", "--name=direct", f"--filename={path}", "--size=16M", "--bs=4k",
            "--rw=randread", "--direct=1", "--ioengine=psync", "--number_ios=4096",
            "--output-format=terse"])
        assert out.returncode == 0, out.stdout + out.stderr
        m = wide.scrape()
    finally:
        stop_agent(wide)
    requests, counted = reads(m, cgroup, mount_of(disk_dir))
    assert requests >= 4096
    assert series(m, TIMED, op="read") < requests        # sampled, not all timed
    assert abs(counted - requests) <= requests / 10, (counted, requests)


def test_every_call_is_timed_when_asked(hook_mode, cgroup_root, cgroup, tmpfs):
    every = start_agent(hook_mode, "--latency", "every")
    try:
        read_storm(cgroup_root, cgroup, os.path.join(tmpfs, "storm-every"))
        m = every.scrape()
        assert reads(m, cgroup, tmpfs) == (READS, READS)
        assert not any(name == TIMED for name, _labels in m)
    finally:
        stop_agent(every)


# A loop of page-cache reads, each after twenty reads of a pipe the loop
# fills itself: reads the probe sees and does not count (a pipe is on no
# counted mount). Only the counted ones reach the sampler, so the file's
# timed reads stand for the file's reads: its count is its requests, less
# the untimed tail of the last interval, give or take the few calls of the
# interpreter's own start (its modules, on another mount) the first timed
# read stands for. Had the pipe's reads a share of the weights, the count
# would scatter by several percent around the requests.
PIPE_AND_FILE = """
import os, sys
fd = os.open(sys.argv[1], os.O_RDONLY)
r, w = os.pipe()
for i in range(int(sys.argv[2])):
    os.write(w, b"x" * 20)
    for _ in range(20):
        os.read(r, 1)
    os.pread(fd, 4096, (i % 256) * 4096)
"""


def test_reads_the_probe_does_not_count_take_no_share_of_the_histogram(agent, cgroup_root, cgroup,
                                                                      tmpfs):
    path = os.path.join(tmpfs, "beside-a-pipe")
    with open(path, "wb") as f:
        f.write(os.urandom(MiB))
    loops, counts = 20_000, []
    # four runs, each in a cgroup of its own: a count that scatters by
    # percents would leave the band in one of them at least
    for n in range(4):
        rel = f"{cgroup}/beside-a-pipe-{n}"
        os.makedirs(cgroup_root + rel)
        try:
            out = exec_in_cgroup(cgroup_root, rel, [sys.executable, "-c", PIPE_AND_FILE, path,
                                                    str(loops)])
            assert out.returncode == 0, out.stderr
            counts.append(reads(agent.scrape(), rel, tmpfs))
        finally:
            remove_cgroup(cgroup_root + rel)
    for requests, counted in counts:
        assert requests == loops
        assert abs(counted - loops) <= loops / 100, counts


def test_audit_keeps_the_full_histogram_of_the_same_calls_beside_the_sampled_one(
        hook_mode, cgroup_root, cgroup, quiet, tmpfs):
    """--latency audit: the sampler still picks (few reads of a storm timed
    into the exported histogram) while the kernel's own histogram counts
    every call once; calls at a low rate are all picked, so there the two
    are the same, bucket for bucket."""
    require_tools("bpftool")
    audit = start_agent(hook_mode, "--latency", "audit")
    try:
        before = series(audit.scrape(), TIMED, op="read")
        read_storm(cgroup_root, cgroup, os.path.join(tmpfs, "storm-audit"))
        f = os.path.join(tmpfs, "after-storm-audit")
        run_in_cgroup(cgroup_root, quiet, [["write", f, 8 * MiB, MiB], ["read", f, MiB]])
        m = audit.scrape()
        full = full_histograms(audit.proc.pid)
    finally:
        stop_agent(audit)
    mnt = {m_.mnt_id for m_ in MountTable().mounts if m_.mountpoint == tmpfs}
    storm = summed(full, os.stat(cgroup_root + cgroup).st_ino, mnt)
    requests, counted = reads(m, cgroup, tmpfs)
    assert requests == READS and sum(storm) == READS        # every call, once
    assert series(m, TIMED, op="read") - before < READS / 2    # still sampled
    assert abs(counted - READS) <= READS / 10, counted
    for op in ("read", "write"):
        calm = summed(full, os.stat(cgroup_root + quiet).st_ino, mnt, op)
        calls = series(m, f"tracehound_io_{op}_requests_total", cgroup=quiet, mountpoint=tmpfs)
        exported = {le: series(m, f"tracehound_io_{op}_latency_seconds_bucket", cgroup=quiet,
                               mountpoint=tmpfs, le="+Inf" if le == math.inf else repr(le))
                    for le in buckets(calm)}
        assert calls >= 8 and sum(calm) == calls and exported == buckets(calm), op
