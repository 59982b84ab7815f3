"""Short-lived cgroups: their entries leave the kernel map after one last
export, the agent's memory does not grow, and every byte is exported once."""
import os
import subprocess
import sys
import time
import uuid

import pytest

from .conftest import series

FORKER = os.path.join(os.path.dirname(__file__), "churn_forker.py")

# More cgroups than the kernel table has slots (8,192: each retired cgroup's
# slot must be handed out again, or bytes are dropped) and, with the host's
# own label sets, than the series cap (10,000: retired ones must be
# forgotten, or they fold into __overflow__). And the leak check needs the span after WARMUP to hold the
# agent's full garbage collections: between two, its live blocks climb about
# one per cgroup (measured: 5,800 over 5,000 cgroups), then fall by ~6,000.
CGROUPS = int(os.environ.get("TRACEHOUND_CHURN_CGROUPS", "10000"))
SCRAPE_EVERY = 500
# Caches and the allocator settle after a few rounds of this pattern
# (measured: RSS grows ~7 MiB over the first 2,500 cgroups, then moves within
# ~4 MiB either way, fragmentation rather than growth).
WARMUP = 2500


@pytest.fixture
def forker():
    """A small process that makes the short-lived processes (churn_forker.py)."""
    proc = subprocess.Popen([sys.executable, "-I", "-S", FORKER], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    yield proc
    proc.stdin.close()
    proc.wait(timeout=20)


def _one_write(forker, cgroup_dir: str, path: str, size: int) -> None:
    """A child that joins cgroup_dir, writes `size` bytes, exits."""
    forker.stdin.write(f"{cgroup_dir}/cgroup.procs\t{path}\t{size}\n")
    forker.stdin.flush()
    assert forker.stdout.readline() == "0\n"


def _rss_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise AssertionError("no VmRSS")


def _ours(metrics: dict, tmpfs: str) -> dict:
    """write-bytes series on the test's tmpfs, by cgroup label"""
    return {dict(labels)["cgroup"]: v for (name, labels), v in metrics.items()
            if name == "tracehound_io_write_bytes_total"
            and dict(labels).get("mountpoint") == tmpfs}


def test_short_lived_cgroups_are_exported_once_and_cleaned_up(agent, cgroup_root, tmpfs, forker):
    parent_rel = f"/thtest/churn-{uuid.uuid4().hex[:8]}"
    parent = cgroup_root + parent_rel
    os.makedirs(parent)
    target = os.path.join(tmpfs, "churn")
    final: dict[str, float] = {}

    def record():
        m = agent.scrape()
        for cg, v in _ours(m, tmpfs).items():
            final[cg] = max(v, final.get(cg, 0))
        return m

    # Cgroups of earlier tests wrote to this tmpfs too: let their entries be
    # exported a last time and dropped before counting this run's bytes.
    agent.scrape()
    agent.scrape()
    m = record()
    base_entries = series(m, "tracehound_map_entries", map="io_stats")
    base_tracked = series(m, "tracehound_series_tracked", collector="io")
    written = 0
    rss_start = None
    started = time.monotonic()
    for i in range(CGROUPS):
        if i == WARMUP:
            rss_start = _rss_kib(agent.proc.pid)
            blocks_start = series(agent.scrape(), "tracehound_agent_allocated_blocks")
        d = os.path.join(parent, f"c{i}")
        os.mkdir(d)
        size = 1000 + i % 7
        _one_write(forker, d, target, size)
        written += size
        os.rmdir(d)
        if i % SCRAPE_EVERY == SCRAPE_EVERY - 1:
            record()
            if os.environ.get("TRACEHOUND_CHURN_DEBUG"):
                m = agent.scrape()
                print(i, _rss_kib(agent.proc.pid), "written", written, "seen", sum(final.values()),
                      "entries", series(m, "tracehound_map_entries", map="io_stats"),
                      "drops", series(m, "tracehound_map_full_drops_total"),
                      "unknown", sum(1 for c in final if c.startswith("unknown")),
                      "blocks", series(m, "tracehound_agent_allocated_blocks"), flush=True)
    m = record()
    m = record()  # entries retired in the previous scrape are gone now
    elapsed = time.monotonic() - started
    os.rmdir(parent)
    assert rss_start is not None, f"TRACEHOUND_CHURN_CGROUPS must exceed {WARMUP}"
    print(f"{CGROUPS} cgroups in {elapsed:.1f} s; rss {rss_start} -> "
          f"{_rss_kib(agent.proc.pid)} KiB; {len(final)} label sets")

    # every byte exported exactly once, over the run
    assert sum(final.values()) == written
    # no series of a removed cgroup is still exported
    assert not _ours(m, tmpfs)
    # The kernel map and the agent's own state are back where they started: a
    # leak would leave thousands; the slack is for other cgroups on the host
    # that start doing I/O meanwhile.
    assert series(m, "tracehound_series_tracked", collector="io") <= base_tracked + 64
    assert series(m, "tracehound_map_entries", map="io_stats") <= base_entries + 64
    # Python objects: less than one per cgroup may stay behind (a leak of any
    # per-cgroup state would leave 7,500); resident memory: allocator noise only
    blocks = series(m, "tracehound_agent_allocated_blocks")
    assert blocks - blocks_start < (CGROUPS - WARMUP) // 2, (blocks_start, blocks)
    assert _rss_kib(agent.proc.pid) - rss_start < 16 * 1024
