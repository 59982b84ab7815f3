"""I/O per job, end to end: real Slurm jobs on the real cluster, each node's
agent (its slurmd's freezer tree only, --cgroup-scope /slurm_<node>) as the
only judge. Three jobs run at once on three nodes: a two-node srun, a
two-node batch job whose batch step and step 0 both do I/O, and a one-node
srun. Every task writes and reads its own number of bytes on /dev/shm, then
holds (a read on a FIFO the test keeps open) until the test has scraped:
every node's agent reports each job's bytes on that node exactly, under its
job id and step, nothing of another node's jobs, and no job on the v2 root.
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

import pytest
from prometheus_client.parser import text_string_to_metric_families

SHM = "/dev/shm"
WAIT_S = 60
WRITES = "tracehound_io_write_bytes_total"
READS = "tracehound_io_read_bytes_total"

# a task's I/O: write, seek to 0, read part of it back; then, with a FIFO,
# say ready and block until the test closes the FIFO's last writer
TASK = r'''
import json, os, sys
sizes, out_dir, fifo, ready_dir = json.loads(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4]
node = os.uname().nodename            # each slurmd's UTS namespace names its node
write_n, read_n = sizes[node]
fd = os.open(os.path.join(out_dir, node), os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
chunk = b"x" * 65536
left = write_n
while left:
    left -= os.write(fd, chunk[:min(left, len(chunk))])
os.lseek(fd, 0, os.SEEK_SET)
left = read_n
while left:
    got = len(os.read(fd, min(left, len(chunk))))
    assert got, "short file"
    left -= got
os.close(fd)
if fifo != "-":
    hold = os.open(fifo, os.O_RDONLY)
    os.close(os.open(os.path.join(ready_dir, node), os.O_WRONLY | os.O_CREAT, 0o600))
    os.read(hold, 1)
'''


def scrape(cluster, node: str) -> list:
    """[(name, labels, value)] of the node's agent, reached in its network namespace."""
    out = subprocess.run(["nsenter", f"--net=/run/netns/{cluster.netns(node)}", "--",
                          "curl", "-sf", "--max-time", "10", "http://127.0.0.1:9560/metrics"],
                         capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, f"{node}'s agent: {out.stderr}"
    return [(s.name, s.labels, s.value) for fam in text_string_to_metric_families(out.stdout)
            for s in fam.samples]


def job_bytes(samples: list) -> dict:
    """{(job_id, step): (written, read)} on /dev/shm, of series with a job id."""
    out: dict = {}
    for name, labels, value in samples:
        if name in (WRITES, READS) and labels.get("mountpoint") == SHM and labels.get("job_id"):
            key = (labels["job_id"], labels.get("step", ""))
            w, r = out.get(key, (0, 0))
            out[key] = (w + value, r) if name == WRITES else (w, r + value)
    return out


def poll(cond, what: str, detail=lambda: ""):
    deadline = time.monotonic() + WAIT_S
    while True:
        got = cond()
        if got:
            return got
        if time.monotonic() > deadline:
            pytest.fail(f"no {what} after {WAIT_S} s: {detail()}")
        time.sleep(0.2)


def squeue(cluster, *argv: str) -> str:
    return subprocess.run(["squeue", "-h", *argv], env=cluster.env(), capture_output=True,
                          text=True, timeout=30, check=True).stdout


@pytest.fixture
def cluster(slurm_cluster):
    slurm_cluster.wait_nodes(lambda n: n["State"] == "IDLE" and "DRAIN" not in n["Flags"],
                             WAIT_S, "idle and fit")
    return slurm_cluster


def test_every_nodes_agent_counts_each_jobs_bytes_on_it_exactly(cluster, tmp_path):
    n1, n2, n3 = cluster.nodes
    tag = f"th{os.getpid()}"
    shm = tempfile.mkdtemp(prefix="thtest-jobio-", dir=SHM)
    task = tmp_path / "task.py"
    task.write_text(TASK)
    fifo = str(tmp_path / "hold")
    os.mkfifo(fifo)
    # the test's writer end, open from before the jobs start: every task's
    # open of the FIFO returns at once, its read blocks until this closes
    hold = os.open(fifo, os.O_RDWR | os.O_NONBLOCK)
    # (written, read) per job and node, all distinct; b's batch step on n2
    plan = {"a": {n1: (100_003, 40_009), n2: (110_017, 50_021)},
            "b-batch": {n2: (120_041, 60_053)},
            "b": {n2: (130_069, 70_079), n3: (140_087, 80_107)},
            "c": {n3: (150_151, 90_173)}}
    dirs = {}
    for part in plan:
        dirs[part] = (os.path.join(shm, part), str(tmp_path / f"ready-{part}"))
        for d in dirs[part]:
            os.mkdir(d)

    def task_argv(part: str, held: bool = True) -> list:
        out_dir, ready = dirs[part]
        return [sys.executable, "-I", str(task), json.dumps(plan[part]), out_dir,
                fifo if held else "-", ready]

    env, srun = cluster.env(), ["srun", "--chdir", str(tmp_path), "--quiet"]
    script = tmp_path / "batch.sh"
    script.write_text("#!/bin/sh\nset -e\n" + subprocess.list2cmdline(task_argv("b-batch", False))
                      + "\nexec srun --quiet " + subprocess.list2cmdline(task_argv("b")) + "\n")
    runs = []
    try:
        runs.append(subprocess.Popen([*srun, "-J", f"{tag}-a", "-N2", "-n2", "-w", f"{n1},{n2}",
                                      *task_argv("a")], env=env, stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, text=True))
        runs.append(subprocess.Popen([*srun, "-J", f"{tag}-c", "-N1", "-n1", "-w", n3,
                                      *task_argv("c")], env=env, stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, text=True))
        sbatch = subprocess.run(["sbatch", "--parsable", "-J", f"{tag}-b", "-N2", "-n2",
                                 "-w", f"{n2},{n3}", "--chdir", str(tmp_path),
                                 "--output", str(tmp_path / "b.out"), str(script)],
                                env=env, capture_output=True, text=True, timeout=30)
        assert sbatch.returncode == 0, sbatch.stderr
        # every task did its I/O and holds
        want_ready = {part: set(nodes) for part, nodes in plan.items() if part != "b-batch"}
        poll(lambda: all(set(os.listdir(dirs[p][1])) == n for p, n in want_ready.items()),
             "task ready on every node",
             lambda: {p: os.listdir(dirs[p][1]) for p in want_ready} | {
                 "srun": [r.poll() for r in runs], "queue": squeue(cluster)})
        ids = {}
        for line in squeue(cluster, "-o", "%j %i").splitlines():
            name, job_id = line.split()
            if name.startswith(f"{tag}-"):
                ids[name.removeprefix(f"{tag}-")] = job_id
        assert sorted(ids) == ["a", "b", "c"], ids
        assert ids["b"] == sbatch.stdout.strip().split(";")[0]
        steps = {"a": (ids["a"], "0"), "b-batch": (ids["b"], "batch"),
                 "b": (ids["b"], "0"), "c": (ids["c"], "0")}
        want = {node: {steps[part]: sizes[node] for part, sizes in plan.items() if node in sizes}
                for node in cluster.nodes}
        scraped = {}

        def exact(node):
            scraped[node] = scrape(cluster, node)
            return job_bytes(scraped[node]) == want[node]
        for node in cluster.nodes:
            # the agent reads the counters at scrape time: poll until the
            # tasks' last writes are in, then equality, not a bound
            poll(lambda: exact(node), f"exact job bytes on {node}",
                 lambda: f"want {want[node]}, got {job_bytes(scraped[node])}")
        for node in cluster.nodes:
            samples = scraped[node]
            # no job that ran only on other nodes shows on this node's agent;
            # every job-labelled series (earlier tiers' jobs on this node
            # included) and every counted cgroup is in this node's slurmd tree
            theirs = {job for job, _ in want[node]}
            elsewhere = {job for other in cluster.nodes if other != node
                         for job, _ in want[other]} - theirs
            labelled = [(n, ls) for n, ls, _ in samples if ls.get("job_id")]
            assert labelled and not any(ls["job_id"] in elsewhere for _, ls in labelled), labelled
            assert all(f"{ls['cgroup']}/".startswith(f"/slurm_{node}/uid_0/job_{ls['job_id']}/")
                       for _, ls in labelled if "cgroup" in ls), labelled
            # with the agent's defaults a job's write latency is kept per step
            # and task, without the cgroup: one histogram however many cgroups
            latency = [ls for n, ls in labelled
                       if n.startswith("tracehound_io_write_latency_seconds")]
            assert latency and not any("cgroup" in ls for ls in latency), latency
            io_cgroups = {ls["cgroup"] for n, ls, _ in samples if n in (WRITES, READS)}
            assert all(c.startswith(f"/slurm_{node}/") for c in io_cgroups), io_cgroups
        # the tasks' v2 cgroup (the v2 root the node's processes share, on
        # this hybrid host): whatever series it has carries no job
        pid = poll(lambda: _a_task_pid(n3, ids["c"]), "a task's pid")
        with open(f"/proc/{pid}/cgroup") as f:
            v2 = next(line.split(":", 2)[2].strip() for line in f if line.startswith("0::"))
        for node in cluster.nodes:
            v2_series = [(n, ls) for n, ls, _ in scraped[node] if ls.get("cgroup") == v2]
            # present (sockets, pressure, the cgroup's own counters), and no job's
            assert v2_series and all(not ls.get("job_id") and ls.get("workload", "") != "slurm"
                                     for _, ls in v2_series), v2_series
        # release: the FIFO's last writer closes, every task reads its end
        os.close(hold)
        hold = None
        for run in runs:
            assert run.wait(timeout=WAIT_S) == 0, run.stdout.read()
        poll(lambda: not squeue(cluster, "-j", ids["b"]).strip(), "batch job ended")
    finally:
        if hold is not None:
            os.close(hold)
        mine = [line.split()[1] for line in squeue(cluster, "-o", "%j %i").splitlines()
                if line.startswith(f"{tag}-")]
        if mine:
            subprocess.run(["scancel", *mine], env=env, timeout=30)
        for run in runs:
            if run.poll() is None:
                run.kill()
            run.wait()
        shutil.rmtree(shm, ignore_errors=True)
    with open(tmp_path / "b.out") as f:
        assert f.read() == ""
    cluster.wait_nodes(lambda n: n["State"] == "IDLE", WAIT_S, "idle after the jobs")


def _a_task_pid(node: str, job_id: str):
    step = f"/sys/fs/cgroup/freezer/slurm_{node}/uid_0/job_{job_id}/step_0/cgroup.procs"
    try:
        with open(step) as f:
            pids = f.read().split()
    except FileNotFoundError:
        return None
    return pids[0] if pids else None



GROW = ("import sys\n"
        "held = []\n"
        "for _ in range(int(sys.argv[1])):\n"
        "    held.append(bytearray(1 << 20))\n"
        "print('grew to', len(held), 'MiB', flush=True)\n")


def test_a_task_past_its_srun_mem_is_oom_killed_by_slurm(cluster):
    node = cluster.nodes[0]
    # 32 MiB asked for, 200 touched: the job's v1 memory cgroup kills it
    over = subprocess.run(["srun", f"--nodelist={node}", "-N1", "-n1", "--mem=32M",
                           sys.executable, "-I", "-c", GROW, "200"], env=cluster.env(),
                          capture_output=True, text=True, timeout=120)
    assert over.returncode != 0 and "grew to" not in over.stdout, over.stdout + over.stderr
    assert "out of memory" in over.stderr.lower(), over.stderr
    # within its --mem the same task runs to its end
    under = subprocess.run(["srun", f"--nodelist={node}", "-N1", "-n1", "--mem=256M",
                            sys.executable, "-I", "-c", GROW, "50"], env=cluster.env(),
                           capture_output=True, text=True, timeout=120)
    assert under.returncode == 0 and "grew to 50 MiB" in under.stdout, under.stderr
