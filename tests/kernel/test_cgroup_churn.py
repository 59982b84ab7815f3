"""Short-lived cgroups: their entries leave the kernel map, whether or not
anyone scrapes, and are exported once more; the agent's memory does not
grow, and every byte is exported once."""
import json
import os
import subprocess
import sys
import time
import uuid

import pytest

from tracehound.bpf.held import held_ids

from .conftest import series, start_agent, stop_agent

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


def whole_turns(agent, scrape=None) -> None:
    """Waits, scraping, until the agent's schedule has run two more turns
    from now: one whole turn of retirements and name pruning came after."""
    scrape = scrape or agent.scrape
    runs = lambda: series(scrape(), "tracehound_detector_runs_total",  # noqa: E731
                          detector="owners_pruning")
    start, deadline = runs(), time.monotonic() + 60
    while runs() < start + 2:
        assert time.monotonic() < deadline, "the agent's schedule stopped"
        time.sleep(0.2)


def _rss_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise AssertionError("no VmRSS")


def _ours(metrics: dict, tmpfs: str, parent: str) -> dict:
    """write-bytes series of the cgroups below PARENT on the test's tmpfs,
    by cgroup label (other tests' live cgroups write to that tmpfs too)"""
    return {dict(labels)["cgroup"]: v for (name, labels), v in metrics.items()
            if name == "tracehound_io_write_bytes_total"
            and dict(labels).get("mountpoint") == tmpfs
            and dict(labels).get("cgroup", "").startswith(parent + "/")}


def test_short_lived_cgroups_are_exported_once_and_cleaned_up(agent, cgroup_root, tmpfs, forker):
    parent_rel = f"/thtest/churn-{uuid.uuid4().hex[:8]}"
    parent = cgroup_root + parent_rel
    os.makedirs(parent)
    target = os.path.join(tmpfs, "churn")
    final: dict[str, float] = {}
    rss_start = None
    blocks_seen: list[float] = []       # the agent's live blocks at each scrape after WARMUP

    def record():
        m = agent.scrape()
        for cg, v in _ours(m, tmpfs, parent_rel).items():
            final[cg] = max(v, final.get(cg, 0))
        if rss_start is not None:
            blocks_seen.append(series(m, "tracehound_agent_allocated_blocks"))
        return m

    # Cgroups of earlier tests wrote to this tmpfs too: let the agent's
    # schedule retire their entries, and a scrape export them a last time,
    # before counting this run's bytes.
    whole_turns(agent)
    agent.scrape()
    m = record()
    base_entries = series(m, "tracehound_map_entries", map="io_stats")
    base_tracked = series(m, "tracehound_series_tracked", collector="io")
    written = 0
    started = time.monotonic()
    for i in range(CGROUPS):
        if i == WARMUP:
            rss_start = _rss_kib(agent.proc.pid)
        d = os.path.join(parent, f"c{i}")
        os.mkdir(d)
        size = 1000 + i % 7
        _one_write(forker, d, target, size)
        written += size
        os.rmdir(d)
        if i % SCRAPE_EVERY == SCRAPE_EVERY - 1:
            record()
            if os.environ.get("TRACEHOUND_CHURN_DEBUG"):
                m = record()
                print(i, _rss_kib(agent.proc.pid), "written", written, "seen", sum(final.values()),
                      "entries", series(m, "tracehound_map_entries", map="io_stats"),
                      "drops", series(m, "tracehound_map_full_drops_total"),
                      "unknown", sum(1 for c in final if c.startswith("unknown")),
                      "blocks", series(m, "tracehound_agent_allocated_blocks"), flush=True)
    # the agent's schedule retires the last ones within seconds (a scrape
    # never does): after a whole turn of it, the next scrape exports them
    # once more, and the one after has them no more (nor the label blocks
    # rendered for that last export)
    whole_turns(agent, record)
    record()
    m = record()
    elapsed = time.monotonic() - started
    os.rmdir(parent)
    assert rss_start is not None, f"TRACEHOUND_CHURN_CGROUPS must exceed {WARMUP}"
    print(f"{CGROUPS} cgroups in {elapsed:.1f} s; rss {rss_start} -> "
          f"{_rss_kib(agent.proc.pid)} KiB; {len(final)} label sets")

    # every byte exported exactly once, over the run
    assert sum(final.values()) == written
    # no series of a removed cgroup is still exported
    assert not _ours(m, tmpfs, parent_rel)
    # The kernel map and the agent's own state are back where they started: a
    # leak would leave thousands; the slack is for other cgroups on the host
    # that start doing I/O meanwhile.
    assert series(m, "tracehound_series_tracked", collector="io") <= base_tracked + 64
    assert series(m, "tracehound_map_entries", map="io_stats") <= base_entries + 64
    # Python objects: less than one per cgroup may stay behind (a leak of any
    # per-cgroup state would leave 7,500). The live blocks swing by some
    # 20,000 with each scrape's batch and the collections of cyclic garbage
    # that follow, so floors are compared: the lowest of the first scrapes
    # after WARMUP, and the lowest of the scrapes after the churn, taken until
    # it is under the limit or a few more scrapes (each allocating, so the
    # collector runs) have not brought it there: a leak never comes down.
    start = min(blocks_seen[:3])
    limit = start + (CGROUPS - WARMUP) // 2
    for _ in range(10):
        if min(blocks_seen[-3:]) < limit:
            break
        record()
    assert min(blocks_seen[-3:]) < limit, (start, blocks_seen[-3:])
    assert _rss_kib(agent.proc.pid) - rss_start < 16 * 1024


def cgroups_in_io_map(pid: int) -> set[int]:
    """The cgroup ids of the agent's io_slots keys, read from the kernel
    (bpftool), not from a scrape: a key starts with its cgroup id."""
    for map_id in held_ids(pid)["map"]:
        show = subprocess.run(["bpftool", "-j", "map", "show", "id", str(map_id)],
                              capture_output=True, text=True)
        if show.returncode == 0 and json.loads(show.stdout).get("name") == "io_slots":
            dump = subprocess.run(["bpftool", "-j", "map", "dump", "id", str(map_id)],
                                  capture_output=True, text=True, check=True)
            return {int.from_bytes(bytes(int(b, 16) for b in e["key"][:8]), sys.byteorder)
                    for e in json.loads(dump.stdout)}
    raise AssertionError(f"process {pid} holds no io_slots map")


def test_removed_cgroups_leave_the_map_when_nobody_scrapes(hook_mode, cgroup_root, tmpfs, forker):
    """No scrape at all while 300 cgroups write and go: the agent's own
    schedule frees their entries; the first scrape after exports every
    byte once more, and the next has none of them."""
    agent = start_agent(hook_mode)
    try:
        parent = f"{cgroup_root}/thtest/quiet-{uuid.uuid4().hex[:8]}"
        os.makedirs(parent)
        target = os.path.join(tmpfs, f"quiet-{uuid.uuid4().hex[:8]}")
        written, ids = 0, set()
        for i in range(300):
            d = os.path.join(parent, f"c{i}")
            os.mkdir(d)
            ids.add(os.stat(d).st_ino)
            _one_write(forker, d, target, 2000 + i)
            written += 2000 + i
            os.rmdir(d)
        os.rmdir(parent)
        assert ids & cgroups_in_io_map(agent.proc.pid)     # counted, not yet retired
        deadline = time.monotonic() + 60
        while left := ids & cgroups_in_io_map(agent.proc.pid):
            assert time.monotonic() < deadline, f"{len(left)} cgroups still in the map"
            time.sleep(0.2)
        ours = lambda m: _ours(m, tmpfs, parent.removeprefix(cgroup_root))  # noqa: E731
        assert sum(ours(agent.scrape()).values()) == written
        assert ours(agent.scrape()) == {}
    finally:
        stop_agent(agent)
