"""Pressure and process states from this host's real cgroup tree: a CPU hog
stalls its own cgroup, not an idle one beside it; a stopped process shows
as stopped in its cgroup's gauge."""
import os
import signal
import subprocess
import time
import uuid

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from tracehound.attribution.cgroups import CgroupResolver
from tracehound.attribution.owners import Owners
from tracehound.attribution.resolver import WorkloadResolver
from tracehound.collectors.pressure import PressureCollector
from tracehound.host import cgroup_state

from .conftest import remove_cgroup, require_tools


@pytest.fixture
def cgroups(cgroup_root):
    made = []

    def make(n):
        out = []
        for _ in range(n):
            rel = f"/thtest/{uuid.uuid4().hex[:12]}"
            os.makedirs(cgroup_root + rel)
            made.append(cgroup_root + rel)
            out.append(rel)
        return out
    yield make
    for d in made:
        remove_cgroup(d)


@pytest.fixture(autouse=True)
def needs_psi(cgroup_root):
    why = cgroup_state.psi_absent(cgroup_root)
    if why:
        pytest.skip(why)


def start_in(cgroup_dir: str, argv: list[str]) -> subprocess.Popen:
    return subprocess.Popen(["sh", "-c", 'echo $$ > "$0" && exec "$@"',
                             cgroup_dir + "/cgroup.procs", *argv])


def stall_usec(cgroup_dir: str, resource: str = "cpu", kind: str = "some") -> int:
    with open(f"{cgroup_dir}/{resource}.pressure", "rb") as f:
        return cgroup_state.parse_pressure(f.read())[kind]


def wait_for(cond, what: str, timeout: float = 20.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return
        time.sleep(0.05)
    pytest.fail(f"{what}: not within {timeout} s")


def scrape(root: str) -> dict:
    owners = Owners(CgroupResolver(root), WorkloadResolver(root, job_id_source=None,
                                                           pod_source=None))
    reg = CollectorRegistry(auto_describe=False)
    reg.register(PressureCollector(root, owners, 4096))
    return {(s.name, frozenset(s.labels.items())): s.value
            for fam in text_string_to_metric_families(generate_latest(reg).decode())
            for s in fam.samples}


def series(metrics: dict, name: str, **labels) -> float | None:
    want = set(labels.items())
    found = [v for (n, ls), v in metrics.items() if n == name and want <= ls]
    return sum(found) if found else None


def test_a_cpu_hog_stalls_its_own_cgroup_not_an_idle_one(cgroup_root, cgroups):
    require_tools("stress-ng")
    hog_rel, idle_rel = cgroups(2)
    hog, idle = cgroup_root + hog_rel, cgroup_root + idle_rel
    workers = max(4, 2 * (os.cpu_count() or 1))
    sleeper = start_in(idle, ["sleep", "60"])
    stress = start_in(hog, ["stress-ng", "--cpu", str(workers), "--timeout", "4s", "--quiet"])
    try:
        wait_for(lambda: cgroup_state.process_states(hog)["running"] >= 2, "the hog runs")
        before = scrape(cgroup_root)
        hog0, idle0 = stall_usec(hog), stall_usec(idle)
        wait_for(lambda: stall_usec(hog) - hog0 >= 200_000, "0.2 s of cpu stall in the hog")
        after = scrape(cgroup_root)
        hog_grew, idle_grew = stall_usec(hog) - hog0, stall_usec(idle) - idle0
        # a sleeping process is never runnable, so never waits for a CPU
        assert idle_grew * 10 < hog_grew, (idle_grew, hog_grew)
        name = "tracehound_pressure_stalled_seconds_total"
        grew = series(after, name, cgroup=hog_rel, resource="cpu", kind="some") - \
            series(before, name, cgroup=hog_rel, resource="cpu", kind="some")
        assert grew > 0
        for resource in ("memory", "io"):
            assert series(after, name, cgroup=hog_rel, resource=resource, kind="some") is not None
        assert series(after, "tracehound_cgroup_processes", cgroup=hog_rel, state="running") >= 1
        assert series(after, "tracehound_cgroup_processes", cgroup=idle_rel,
                      state="sleeping") == 1
    finally:
        stress.kill()
        sleeper.kill()
        stress.wait()
        sleeper.wait()


def test_a_stopped_process_shows_as_stopped(cgroup_root, cgroups):
    (rel,) = cgroups(1)
    d = cgroup_root + rel
    p = start_in(d, ["sleep", "60"])
    try:
        wait_for(lambda: cgroup_state.process_states(d)["sleeping"] == 1, "sleep joins")
        os.kill(p.pid, signal.SIGSTOP)
        wait_for(lambda: cgroup_state.process_states(d)["stopped"] == 1, "the process stops")
        m = scrape(cgroup_root)
        assert series(m, "tracehound_cgroup_processes", cgroup=rel, state="stopped") == 1
        assert series(m, "tracehound_cgroup_processes", cgroup=rel, state="sleeping") is None
        walked = {c.path: c for c in cgroup_state.walk(cgroup_root, 4096).cgroups}
        assert walked[rel].cgroup_id == os.stat(d).st_ino
        assert walked["/"].pressure[("cpu", "some")] > 0
    finally:
        p.kill()
        p.wait()
    # an empty cgroup is skipped with its subtree
    wait_for(lambda: not cgroup_state.populated(d), "the cgroup empties")
    assert rel not in {c.path for c in cgroup_state.walk(cgroup_root, 4096).cgroups}
