"""Agent options that change what the kernel counts or how it is exported: skip list,
map size, mount namespace, latency histograms, latency off."""
import json
import os
import subprocess

import pytest

from tests.kernel.conftest import run_in_cgroup, series, start_agent, stop_agent


@pytest.fixture
def agent_all_fstypes(hook_mode):
    a = start_agent(hook_mode, "--count-all-fstypes")
    yield a
    stop_agent(a)


def test_pseudo_fs_skipped_by_default_and_counted_on_request(agent, agent_all_fstypes,
                                                             cgroup_root, cgroup):
    res = run_in_cgroup(cgroup_root, cgroup, [["read", "/proc/self/status", 4096]])
    assert res[0] > 0
    lb = {"cgroup": cgroup, "fstype": "proc"}
    assert series(agent.scrape(), "tracehound_io_read_bytes_total", **lb) == 0
    assert series(agent_all_fstypes.scrape(), "tracehound_io_read_bytes_total", **lb) == res[0]


def test_full_map_is_counted_not_silent(hook_mode, cgroup_root, tmpfs):
    a = start_agent(hook_mode, "--max-entries", "1")
    made = []
    try:
        for i in range(3):
            rel = f"/thtest/full-{os.getpid()}-{i}"
            os.makedirs(cgroup_root + rel)
            made.append(cgroup_root + rel)
            run_in_cgroup(cgroup_root, rel, [["write", os.path.join(tmpfs, f"full{i}"), 10, 10]])
        m = a.scrape()
        # (which of them has the one slot depends on when the agent's schedule
        # last made room: tests/kernel/test_io_table_room.py)
        assert series(m, "tracehound_map_full_drops_total", map="io_stats") > 0
    finally:
        stop_agent(a)
        for d in made:
            os.rmdir(d)


@pytest.mark.parametrize("mountinfo", ["own", "host"])
def test_agent_in_its_own_mount_namespace(hook_mode, cgroup_root, cgroup, tmpfs, mountinfo):
    """Like a containerised agent: its own mount namespace has other mount
    ids, so mounts can only be named from the host's table (--mountinfo)."""
    extra = ("--mountinfo", f"/proc/{os.getpid()}/mountinfo") if mountinfo == "host" else ()
    a = start_agent(hook_mode, *extra, wrapper=("unshare", "--mount"))
    try:
        size = 12_345
        assert run_in_cgroup(cgroup_root, cgroup, [
            ["write", os.path.join(tmpfs, "own-ns"), size, 4096]]) == [size]
        m = a.scrape()
        named = series(m, "tracehound_io_write_bytes_total", cgroup=cgroup, mountpoint=tmpfs,
                       fstype="tmpfs")
        total = series(m, "tracehound_io_write_bytes_total", cgroup=cgroup)
        assert total == size
        assert named == (size if mountinfo == "host" else 0)
    finally:
        stop_agent(a)


def test_latency_histograms_per_mount(hook_mode, cgroup_root, cgroup, tmpfs):
    a = start_agent(hook_mode, "--latency-histograms", "mount")
    try:
        # 1 MiB writes: each slower than the sampling gap, so each is timed
        run_in_cgroup(cgroup_root, cgroup, [["write", os.path.join(tmpfs, "lat"), 3 << 20, 1 << 20]])
        m = a.scrape()
        # the counters keep the cgroup; the histogram is summed over cgroups
        assert series(m, "tracehound_io_write_requests_total", cgroup=cgroup) == 3
        hist = [ls for (name, ls), _ in m.items()
                if name == "tracehound_io_write_latency_seconds_count"]
        assert hist and all("cgroup" not in dict(ls) for ls in hist)
        mine = [v for (name, ls), v in m.items()
                if name == "tracehound_io_write_latency_seconds_count"
                and dict(ls).get("mountpoint") == tmpfs]
        assert mine and mine[0] >= 3
    finally:
        stop_agent(a)


def _program_names(pid: int) -> set[str]:
    from tracehound.bpf.held import held_ids
    names = set()
    for ident in held_ids(pid)["prog"]:
        res = subprocess.run(["bpftool", "prog", "show", "id", str(ident), "-j"],
                             capture_output=True, text=True)
        if res.returncode == 0:
            names.add(json.loads(res.stdout).get("name", ""))
    return names


@pytest.mark.parametrize("latency", ["off", "io.fsync"])
def test_latency_off_keeps_counters_exact(hook_mode, cgroup_root, cgroup, tmpfs, latency):
    """Counters only: bytes, calls and errors as exact as with latency on;
    histograms only for the probes still timed, and no clock-starting
    programs for the others."""
    a = start_agent(hook_mode, "--latency", latency)
    try:
        f = os.path.join(tmpfs, "untimed")
        res = run_in_cgroup(cgroup_root, cgroup, [
            ["write", f, 100_003, 4096], ["fsync", f], ["read", f, 8192]])
        assert res[0] == 100_003 and res[2] == 100_003
        m = a.scrape()
        lb = {"cgroup": cgroup, "mountpoint": tmpfs}
        assert series(m, "tracehound_io_write_bytes_total", **lb) == 100_003
        assert series(m, "tracehound_io_read_bytes_total", **lb) == 100_003
        assert series(m, "tracehound_io_write_requests_total", **lb) == 25
        assert series(m, "tracehound_io_read_requests_total", **lb) == 13 + 1
        # the worker's fsync step is an fsync and an fdatasync
        assert series(m, "tracehound_io_fsync_requests_total", **lb) == 2
        families = {n.removesuffix("_count") for (n, _ls), _v in m.items()
                    if n.endswith("_latency_seconds_count")}
        timed = {"off": set(), "io.fsync": {"tracehound_io_fsync_latency_seconds"}}[latency]
        assert families == timed
        if timed:
            assert series(m, "tracehound_io_fsync_latency_seconds_count", **lb) == 2
        names = _program_names(a.proc.pid)
        assert not names & {"fe_vfs_read", "fe_vfs_readv", "fe_vfs_write", "fe_vfs_writev"}, names
        if hook_mode == "tracepoint":
            # syscall mode: only the exit hook, unless fsync is still timed
            assert ("tp_sys_enter" in names) == (latency != "off")
    finally:
        stop_agent(a)
