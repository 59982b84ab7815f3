"""Exact byte and call accounting per (cgroup, mount) against the real kernel."""
import json
import os

import pytest

from tracehound.attribution.workload import WORKLOAD_LABELS

from tests.kernel.conftest import (
    exec_in_cgroup,
    fstype_of,
    mount_of,
    require_tools,
    run_in_cgroup,
    series,
)

MiB = 1 << 20


def probe_mode(metrics, probe):
    return next(dict(ls)["mode"] for (n, ls), v in metrics.items()
                if n == "tracehound_probe_info" and dict(ls)["probe"] == probe)


def labels(cgroup, mountpoint):
    return {"cgroup": cgroup, "mountpoint": mountpoint}


@pytest.mark.parametrize("fs", ["tmpfs", "disk"])
def test_python_worker_bytes_exact(agent, cgroup_root, cgroup, fs, tmpfs, disk_dir, hook_mode):
    base = tmpfs if fs == "tmpfs" else disk_dir
    mnt = mount_of(base)
    f = os.path.join(base, "data")
    # odd sizes so a request-size count could not pass by accident
    res = run_in_cgroup(cgroup_root, cgroup, [
        ["write", f, 3 * MiB + 123, 65536],
        ["read", f, 100_000],
        ["pread", f, 5000, 3 * MiB],          # short read: only 123 bytes exist there
        ["writev", f, [10, 20, 30]],
        ["readv", f, [1000, 7]],
    ])
    assert res[0] == 3 * MiB + 123 and res[1] == 3 * MiB + 123 and res[2] == 123
    m = agent.scrape()
    lb = labels(cgroup, mnt)
    assert series(m, "tracehound_io_write_bytes_total", **lb) == 3 * MiB + 123 + 60
    assert series(m, "tracehound_io_read_bytes_total", **lb) == 3 * MiB + 123 + 123 + 1007
    # write: ceil((3 MiB + 123) / 64 KiB) calls + 1 writev
    assert series(m, "tracehound_io_write_requests_total", **lb) == 49 + 1
    # read loop: 31 full + 1 partial + 1 at EOF; then 1 pread, 1 readv
    assert series(m, "tracehound_io_read_requests_total", **lb) == 31 + 1 + 1 + 1 + 1
    assert series(m, "tracehound_io_read_errors_total", **lb) == 0
    # exactly one series, with the file system's type; workload labels that
    # do not apply are left out, never exported empty
    rows = [dict(ls) for (n, ls), _ in m.items()
            if n == "tracehound_io_write_bytes_total" and lb.items() <= dict(ls).items()]
    assert len(rows) == 1 and rows[0]["fstype"] == fstype_of(base), rows
    assert {"cgroup", "mountpoint", "fstype"} <= set(rows[0]) \
        <= {"cgroup", "mountpoint", "fstype", *WORKLOAD_LABELS}
    assert all(rows[0].values()), rows
    record_for_parity(f"worker-{fs}", m, lb, hook_mode)


def record_for_parity(name, metrics, lb, hook_mode):
    """The VM tier runs this suite once per hook mode and compares these."""
    out = os.environ.get("TRACEHOUND_PARITY_DIR")
    if not out:
        return
    counters = {n: v for (n, ls), v in metrics.items()
                if n.startswith("tracehound_io_") and n.endswith("_total")
                and set(lb.items()) <= set(ls)}
    with open(os.path.join(out, f"{hook_mode}-{name}.json"), "w") as f:
        json.dump(counters, f, sort_keys=True)


def test_calls_slower_than_the_sampling_gap_are_all_timed(agent, cgroup_root, cgroup, tmpfs):
    """Sampled timing (the default) times every call of a kind that comes
    less often than one per sampling gap on its CPU: the 1 MiB writes and
    reads each start a pause longer than the gap after the one before, and
    the fsync and fdatasync are the first of their kind in a long while. So
    each histogram counts every call."""
    pause = 0.005
    assert series(agent.scrape(), "tracehound_io_latency_sample_gap_seconds") < pause
    f = os.path.join(tmpfs, "hist")
    run_in_cgroup(cgroup_root, cgroup, [["write", f, 4 * MiB, MiB, pause],
                                        ["read", f, MiB, pause], ["fsync", f]])
    m = agent.scrape()
    lb = labels(cgroup, tmpfs)
    for op in ("read", "write", "fsync"):
        reqs = series(m, f"tracehound_io_{op}_requests_total", **lb)
        assert reqs > 0
        assert series(m, f"tracehound_io_{op}_latency_seconds_count", **lb) == reqs
        assert series(m, f"tracehound_io_{op}_latency_seconds_bucket", le="+Inf", **lb) == reqs
        assert series(m, f"tracehound_io_{op}_latency_seconds_sum", **lb) > 0
    assert series(m, "tracehound_io_fsync_requests_total", **lb) == 2  # fsync + fdatasync
    # buckets are cumulative
    buckets = sorted((float(dict(ls)["le"]), v) for (n, ls), v in m.items()
                     if n == "tracehound_io_read_latency_seconds_bucket"
                     and set(lb.items()) <= set(ls))
    assert [v for _, v in buckets] == sorted(v for _, v in buckets)


def test_failing_calls_are_errors(agent, cgroup_root, cgroup, tmpfs):
    d = os.path.join(tmpfs, "errs")
    os.makedirs(d, exist_ok=True)
    f = os.path.join(d, "ro")
    open(f, "w").close()
    res = run_in_cgroup(cgroup_root, cgroup, [["read_dir_fd", d], ["write_rdonly", f]])
    assert res == [-21, -9]  # EISDIR, EBADF
    m = agent.scrape()
    lb = labels(cgroup, tmpfs)
    assert series(m, "tracehound_io_read_errors_total", **lb) == 1
    assert series(m, "tracehound_io_read_requests_total", **lb) == 1
    assert series(m, "tracehound_io_write_errors_total", **lb) == 1
    assert series(m, "tracehound_io_read_bytes_total", **lb) == 0


def test_namespace_operations(agent, cgroup_root, cgroup, tmpfs):
    d = os.path.join(tmpfs, "ns-" + cgroup.rsplit("/", 1)[1])
    res = run_in_cgroup(cgroup_root, cgroup, [
        ["mkdir", d],
        ["mkdir", d],                               # EEXIST
        ["create", d + "/a"],
        ["open", d + "/a"],
        ["open", d + "/missing"],                   # ENOENT
        ["rename", d + "/a", d + "/b"],
        ["unlink", d + "/b"],
        ["unlink", d + "/b"],                       # ENOENT
        ["chdir", d],
        ["mkdir", "rel"],                           # relative to the cwd on tmpfs
        ["rmdir", "rel"],
        ["rmdir", d + "/nope"],                     # ENOENT
        ["create", d],                              # EISDIR: an error, not a missing name
    ])
    assert res == [0, -17, 0, 0, -2, 0, 0, -2, 0, 0, 0, -2, -21]
    m = agent.scrape()
    lb = labels(cgroup, tmpfs)
    if probe_mode(m, "io.mkdir") == "tracepoint":
        # syscall level: every call, failing lookups included; create = O_CREAT
        # asked; ENOENT is counted as not found, apart from the errors
        expect = {"mkdir": (3, 1, 0), "create": (2, 1, 0), "open": (4, 1, 1),
                  "rename": (1, 0, 0), "unlink": (2, 0, 1), "rmdir": (2, 0, 1)}
    else:
        # VFS level: calls whose path lookup failed never reach vfs_*, nor
        # does an open refused before the file is opened (EISDIR); the
        # create's open is also a vfs_open
        expect = {"mkdir": (2, 0, 0), "create": (1, 0, 0), "open": (2, 0, 0),
                  "rename": (1, 0, 0), "unlink": (1, 0, 0), "rmdir": (1, 0, 0)}
    for op, (calls, errors, not_found) in expect.items():
        assert series(m, f"tracehound_io_{op}_requests_total", **lb) == calls, op
        assert series(m, f"tracehound_io_{op}_errors_total", **lb) == errors, op
        assert series(m, f"tracehound_io_{op}_not_found_total", **lb) == not_found, op


def test_dd_on_tmpfs_and_disk(agent, cgroup_root, cgroup, tmpfs, disk_dir):
    for base in (tmpfs, disk_dir):
        f = os.path.join(base, "dd.out")
        out = exec_in_cgroup(cgroup_root, cgroup,
                             ["dd", "if=/dev/zero", f"of={f}", "bs=4096", "count=777"])
        assert out.returncode == 0, out.stderr
    # reading back with dd: the binary's own library loads read from /, so only
    # the tmpfs read is exact
    out = exec_in_cgroup(cgroup_root, cgroup,
                         ["dd", f"if={tmpfs}/dd.out", "of=/dev/null", "bs=1000"])
    assert out.returncode == 0, out.stderr
    m = agent.scrape()
    for base in (tmpfs, disk_dir):
        lb = labels(cgroup, mount_of(base))
        assert series(m, "tracehound_io_write_bytes_total", **lb) == 777 * 4096
    assert series(m, "tracehound_io_read_bytes_total", **labels(cgroup, tmpfs)) == 777 * 4096
    # /dev/zero lives on devtmpfs: skipped by default
    assert not [k for k in m if ("fstype", "devtmpfs") in k[1]]


def test_fio_on_tmpfs(agent, cgroup_root, cgroup, tmpfs):
    require_tools("fio")
    f = os.path.join(tmpfs, "fio.dat")
    common = ["fio", "--name=acc", f"--filename={f}", "--size=8M", "--bs=4k",
              "--ioengine=psync", "--output-format=terse"]
    for rw in ("write", "randread"):
        out = exec_in_cgroup(cgroup_root, cgroup, common + [f"--rw={rw}"])
        assert out.returncode == 0, out.stdout + out.stderr
    m = agent.scrape()
    lb = labels(cgroup, tmpfs)
    assert series(m, "tracehound_io_write_bytes_total", **lb) == 8 << 20
    assert series(m, "tracehound_io_read_bytes_total", **lb) == 8 << 20
    assert series(m, "tracehound_io_read_requests_total", **lb) == 2048


def is_counter(name: str) -> bool:
    return name.endswith(("_total", "_count", "_bucket", "_sum"))


def test_counters_never_decrease(agent, cgroup_root, cgroup, tmpfs):
    """Scrapes taken between writes: every counter series present in two
    consecutive scrapes holds or grows, and this cgroup's grow by exactly
    what it wrote (so the check covers series that really move)."""
    f = os.path.join(tmpfs, "mono")
    lb = labels(cgroup, mount_of(tmpfs))
    scrapes = []
    for _ in range(3):
        run_in_cgroup(cgroup_root, cgroup, [["write", f, 1 << 20, 4096]])
        scrapes.append(agent.scrape())
    written = [series(m, "tracehound_io_write_bytes_total", **lb) for m in scrapes]
    calls = [series(m, "tracehound_io_write_requests_total", **lb) for m in scrapes]
    assert written == [1 << 20, 2 << 20, 3 << 20], written
    assert calls == [256, 512, 768], calls
    for before, after in zip(scrapes, scrapes[1:]):
        common = [k for k in before if is_counter(k[0]) and k in after]
        mine = [k for k in common if ("cgroup", cgroup) in k[1]]
        assert mine and any(after[k] > before[k] for k in mine), mine
        fell = {k: (before[k], after[k]) for k in common if after[k] < before[k]}
        assert not fell, fell


def test_probe_modes_reported(agent, hook_mode):
    m = agent.scrape()
    modes = {dict(ls)["probe"]: dict(ls)["mode"] for (n, ls), v in m.items()
             if n == "tracehound_probe_info" and v == 1}
    io = {p: mode for p, mode in modes.items() if p.startswith("io.")}
    assert set(io) == {"io.read", "io.write", "io.fsync", "io.open", "io.remove",
                       "io.mkdir", "io.rename", "io.uring", "io.aio", "io.copy", "io.pagecache"}
    # io_uring completions and page-cache fills are trace events in every mode
    completions = {p: io.pop(p) for p in ("io.uring", "io.pagecache")}
    assert set(completions.values()) == {"tracepoint"}, completions
    if hook_mode != "auto":
        assert set(io.values()) == {hook_mode}
    # the exit and TCP hooks are tracepoints, whatever --hook-mode asks of the I/O probe
    jobs = {p: mode for p, mode in modes.items() if p == "exits" or p.startswith("net.")}
    assert set(jobs) == {"exits", "net.retransmit", "net.connect", "net.reset"}
    assert set(jobs.values()) <= {"tp_btf", "raw_tp", "tracepoint"}, jobs
