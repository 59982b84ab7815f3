"""Sampled timing against the real kernel: a storm of page-cache reads is
counted exact, bytes and calls, while its histogram still counts about
every call (and, measured by `--latency audit`, only part of them timed);
the calls that follow it at a low rate are all timed again; `--latency every` times every call. (Calls slower than the
sampling gap are all timed: test_io_accuracy.py, in every hook mode.)"""
import contextlib
import math
import os
import sys

import pytest

from tests.kernel.conftest import (exec_in_cgroup, remove_cgroup, require_tools, run_in_cgroup,
                                   mount_of, series, start_agent, stop_agent)
from testbed.io_audit import buckets, full_histograms, mount_ids, picked_by, summed

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


def test_a_storm_of_reads_is_counted_in_full_and_its_histogram_weighs_about_every_call(
        agent, cgroup_root, cgroup, tmpfs):
    read_storm(cgroup_root, cgroup, os.path.join(tmpfs, "storm"))
    m = agent.scrape()
    requests, counted = reads(m, cgroup, tmpfs)
    assert requests == READS
    assert series(m, "tracehound_io_read_bytes_total", cgroup=cgroup, mountpoint=tmpfs) == 32 * MiB
    # each timed read stands for those since the CPU's last timed one: the
    # count misses at most the untimed tail of each CPU's last interval
    assert abs(counted - READS) <= READS / 10, counted


@contextlib.contextmanager
def on_one_cpu():
    """This process and what it starts on one CPU: the sampler is per CPU,
    so calls come after a storm only where the storm ran."""
    was = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {min(was)})
    try:
        yield
    finally:
        os.sched_setaffinity(0, was)


def test_calls_that_follow_a_storm_at_a_low_rate_are_all_timed(agent, cgroup_root, cgroup, quiet,
                                                               tmpfs):
    f = os.path.join(tmpfs, "after-storm")
    with on_one_cpu():
        read_storm(cgroup_root, cgroup, os.path.join(tmpfs, "storm-before"))
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
    be about one call in an interval). Audited, so that the reads the sampler
    picked are the cgroup's own count, not the host's."""
    require_tools("fio", "bpftool")
    wide = start_agent(hook_mode, "--latency", "audit", "--latency-sample-gap", "1000")
    try:
        path = os.path.join(disk_dir, "direct")
        out = exec_in_cgroup(cgroup_root, cgroup, [
            "fio", "--name=direct", f"--filename={path}", "--size=16M", "--bs=4k",
            "--rw=randread", "--direct=1", "--ioengine=psync", "--number_ios=4096",
            "--output-format=terse"])
        assert out.returncode == 0, out.stdout + out.stderr
        m = wide.scrape()
        picked: dict = {}
        full_histograms(wide.proc.pid, picked)
    finally:
        stop_agent(wide)
    mnt = mount_of(disk_dir)
    requests, counted = reads(m, cgroup, mnt)
    own = picked_by(picked, os.stat(cgroup_root + cgroup).st_ino, mount_ids({mnt}))
    assert requests >= 4096
    assert 0 < own < requests                               # sampled, not all timed
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
    """--latency audit: the sampler still picks (a storm's reads timed in
    part, by the storm's own count of picks) while the kernel's own
    histogram counts every call once; calls at a low rate are all picked,
    so there the two are the same, bucket for bucket."""
    require_tools("bpftool")
    audit = start_agent(hook_mode, "--latency", "audit")
    try:
        read_storm(cgroup_root, cgroup, os.path.join(tmpfs, "storm-audit"))
        f = os.path.join(tmpfs, "after-storm-audit")
        run_in_cgroup(cgroup_root, quiet, [["write", f, 8 * MiB, MiB], ["read", f, MiB]])
        m = audit.scrape()
        picked: dict = {}
        full = full_histograms(audit.proc.pid, picked)
    finally:
        stop_agent(audit)
    mnt = mount_ids({tmpfs})

    def picks(cg: str, op: str) -> int:
        return picked_by(picked, os.stat(cgroup_root + cg).st_ino, mnt, op)
    storm = summed(full, os.stat(cgroup_root + cgroup).st_ino, mnt)
    requests, counted = reads(m, cgroup, tmpfs)
    assert requests == READS and sum(storm) == READS        # every call, once
    assert 0 < picks(cgroup, "read") < READS / 2             # the storm's own: sampled
    assert abs(counted - READS) <= READS / 10, counted
    for op in ("read", "write"):
        calm = summed(full, os.stat(cgroup_root + quiet).st_ino, mnt, op)
        calls = series(m, f"tracehound_io_{op}_requests_total", cgroup=quiet, mountpoint=tmpfs)
        exported = {le: series(m, f"tracehound_io_{op}_latency_seconds_bucket", cgroup=quiet,
                               mountpoint=tmpfs, le="+Inf" if le == math.inf else repr(le))
                    for le in buckets(calm)}
        assert calls >= 8 and sum(calm) == calls and exported == buckets(calm), op
        assert picks(quiet, op) == calls, op                  # every one picked
