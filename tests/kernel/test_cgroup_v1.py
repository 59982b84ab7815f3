"""Slurm's cgroup/v1 layout on this hybrid host, for real: jobs in real v1
freezer cgroups named as slurmd names them, their processes in the v2 root
beside the node's other processes. The kernel counts by the freezer cgroup,
so each job's bytes land under its job id and the v2 root's under no job.

Also one node's agent of several on a host (--cgroup-scope): it exports its
node's jobs only.
"""
import json
import os
import subprocess
import tempfile
import threading
import uuid

import pytest

from tracehound.attribution.cgroup_layout import v1_hierarchies
from tracehound.host.procs import proc_cgroups
from tracehound.host.mounts import MountTable
from tracehound.probes.cgroup_names import CgroupNamesProbe

from .conftest import WORKER_ARGV, remove_cgroup, series, start_agent, stop_agent

TAG = uuid.uuid4().hex[:8]
JOB_A, JOB_B = (str(700000 + int(TAG[:4], 16) * 2 + i) for i in range(2))
WRITES = "tracehound_io_write_bytes_total"
READS = "tracehound_io_read_bytes_total"


FREEZER = ""     # the v1 freezer hierarchy's mount point (the fixture below)


@pytest.fixture(scope="module", autouse=True)
def freezer_v1():
    """The host's v1 freezer hierarchy; on a host without one (pure v2), one
    mounted for these tests: freezer is no v2 controller, so the kernel lets
    a v1 hierarchy have it beside cgroup2, which makes the host hybrid."""
    global FREEZER
    found = v1_hierarchies(MountTable()).get("freezer")
    mounted = None
    if found is None:
        mounted = tempfile.mkdtemp(prefix="thtest-freezer-")
        done = subprocess.run(["mount", "-t", "cgroup", "-o", "freezer", "thtest-freezer", mounted],
                              capture_output=True, text=True)
        if done.returncode != 0:
            os.rmdir(mounted)
            pytest.skip(f"no v1 freezer hierarchy and none can be mounted: {done.stderr.strip()}")
        found = mounted
    FREEZER = found
    yield found
    if mounted is not None:
        subprocess.run(["umount", mounted], check=False)
        os.rmdir(mounted)


def started(hook_mode: str, *flags: str):
    """An agent whose output is read as it comes: a kernel log full of GPU
    lines would otherwise fill the pipe and block the agent's logging."""
    agent = start_agent(hook_mode, *flags)
    threading.Thread(target=lambda: agent.proc.stdout.read(), daemon=True).start()
    return agent


def make_step(node_root: str, job: str) -> str:
    """/slurm_<node>/uid_0/job_<job>/step_0 in the freezer hierarchy, as
    slurmd's cgroup/v1 plugin makes it; returns its path in the hierarchy."""
    rel = f"/{node_root}/uid_0/job_{job}/step_0"
    os.makedirs(FREEZER + rel, exist_ok=True)
    return rel


def remove_tree(node_root: str) -> None:
    for dirpath, _dirs, _files in sorted(os.walk(f"{FREEZER}/{node_root}"),
                                         key=lambda t: -len(t[0])):
        remove_cgroup(dirpath)


def run_job(rel: str, plan: list, results: dict, key: str) -> None:
    """The worker joins the job's freezer cgroup only: in the v2 tree it
    stays where this test runs, as a slurmstepd's task does on a hybrid host."""
    out = subprocess.run([*WORKER_ARGV, FREEZER + rel + "/cgroup.procs",
                          json.dumps(plan)],
                         capture_output=True, text=True, timeout=120)
    results[key] = (out.returncode, out.stdout, out.stderr)


def test_two_v1_jobs_count_apart_and_the_v2_root_is_no_job(hook_mode, tmpfs):
    if proc_cgroups("self").get("") != "/":
        pytest.skip("the test must run in the v2 root, where the jobs' processes stay")
    node = f"slurm_thtest{TAG}"
    step_a, step_b = make_step(node, JOB_A), make_step(node, JOB_B)
    agent = started(hook_mode, "--cgroup-key", "auto")
    try:
        sizes = {"a": (300_007, 200_003), "b": (500_009, 100_001)}     # write, read
        files = {k: os.path.join(tmpfs, f"v1-{k}-{TAG}") for k in sizes}
        for k, (_w, r) in sizes.items():        # the files each job reads, made outside the jobs
            with open(files[k] + ".in", "wb") as f:
                f.write(b"r" * r)
        results: dict = {}
        # the node's other processes: I/O in the v2 root and the freezer root
        other = subprocess.Popen(["sh", "-c", f"for i in 1 2 3 4 5 6 7 8; do head -c 1000000 "
                                  f"/dev/zero > {tmpfs}/v1-other-{TAG}; done"])
        jobs = [threading.Thread(target=run_job, args=(
            step, [["write", files[k], sizes[k][0], 65536], ["read", files[k] + ".in", 65536]],
            results, k)) for k, step in (("a", step_a), ("b", step_b))]
        for t in jobs:
            t.start()
        for t in jobs:
            t.join()
        assert other.wait(timeout=60) == 0
        for k, (w, r) in sizes.items():
            rc, out, err = results[k]
            assert rc == 0 and out.strip() == f"[{w}, {r}]", err
        m = agent.scrape()
        for k, step, job in (("a", step_a, JOB_A), ("b", step_b, JOB_B)):
            labels = dict(cgroup=step, mountpoint=tmpfs, workload="slurm", job_id=job, step="0")
            assert series(m, WRITES, **labels) == sizes[k][0], \
                [dict(ls) for (n, ls), _ in m.items() if n == WRITES and ("mountpoint", tmpfs) in ls]
            assert series(m, READS, **labels) == sizes[k][1]
            # the exit probe counts by the same key: the job's one worker, clean
            assert series(m, "tracehound_process_exits_total", cgroup=step, job_id=job,
                          reason="clean") == 1
        # the root carries the other processes' 8 MB, and no job
        root = [(dict(ls), v) for (n, ls), v in m.items()
                if n == WRITES and ("cgroup", "/") in ls and ("mountpoint", tmpfs) in ls]
        assert root and sum(v for _, v in root) >= 8_000_000, root
        assert all(ls.get("job_id", "") == "" and ls.get("workload", "") == ""
                   for ls, _ in root), root
        # every tmpfs byte the jobs wrote is under a job, none elsewhere
        jobs_total = sum(v for (n, ls), v in m.items() if n == WRITES
                         and ("mountpoint", tmpfs) in ls and dict(ls).get("job_id") in (JOB_A, JOB_B))
        assert jobs_total == sizes["a"][0] + sizes["b"][0]
        info = agent.scrape_text()
        assert f'tracehound_cgroup_key_info{{hierarchy="{FREEZER}",key="freezer",' \
               'layout="hybrid"} 1.0' in info
    finally:
        try:
            stop_agent(agent)
        finally:
            remove_tree(node)


def test_each_nodes_agent_exports_its_own_nodes_jobs(hook_mode, tmpfs):
    """Two simulated nodes' agents on one host, each scoped to its slurmd's
    tree: each exports its node's job and nothing of the other node's."""
    nodes = {"n1": (f"slurm_th{TAG}n1", JOB_A, 111_111), "n2": (f"slurm_th{TAG}n2", JOB_B, 222_222)}
    steps = {n: make_step(root, job) for n, (root, job, _size) in nodes.items()}
    agents = {}
    try:
        for n, (root, _job, _size) in nodes.items():
            agents[n] = started(hook_mode, "--cgroup-key", "freezer", "--cgroup-scope", f"/{root}")
        for n, (_root, _job, size) in nodes.items():
            results: dict = {}
            run_job(steps[n], [["write", os.path.join(tmpfs, f"scope-{n}-{TAG}"), size, 65536]],
                    results, n)
            assert results[n][0] == 0 and results[n][1].strip() == f"[{size}]", results[n][2]
        for n, agent in agents.items():
            m = agent.scrape()
            root, job, size = nodes[n]
            assert series(m, WRITES, cgroup=steps[n], mountpoint=tmpfs, job_id=job) == size
            cgroups = {dict(ls)["cgroup"] for (name, ls), _ in m.items() if name == WRITES}
            assert cgroups and all(c.startswith(f"/{root}/") or c == f"/{root}" for c in cgroups), \
                cgroups
    finally:
        try:
            for agent in agents.values():
                stop_agent(agent)
        finally:
            for root, _job, _size in nodes.values():
                remove_tree(root)


def test_the_kernel_names_cgroups_of_the_hierarchy_counted_by_only():
    """Keyed by freezer, the name probe holds freezer cgroups' paths; the v2
    one holds none of them (ids are per hierarchy: one could name another)."""
    freezer = CgroupNamesProbe("freezer").start()
    v2 = CgroupNamesProbe("v2").start()
    try:
        assert freezer.available and v2.available, (freezer.reason, v2.reason)
        rel = f"/thtest-names-{TAG}"
        os.mkdir(FREEZER + rel)
        ino = os.stat(FREEZER + rel).st_ino
        os.rmdir(FREEZER + rel)
        assert freezer.lookup(ino) == rel
        assert v2.lookup(ino) != rel
    finally:
        freezer.close()
        v2.close()
