"""The fault half of bench/explain: is explain's top line the true cause, and
how soon after the fault?

One fault at a time, each on one node of a fresh three-node job whose ranks
checkpoint (a direct 256 KiB write every 0.2 s to a disk, a 64 KiB rewrite of
a file on the node's own small scratch) and pass data round a ring over
TCP. The catalog's faults go in through the fleet runner (`chaos run
examples/fleet/... --slurm --job ID --nodes NODE`); the OOM kill is the
job's own: one rank allocates past the job's `srun --mem`. The job is
explained over and over; a row keeps the rank of the true cause in the last
answer (1: the top line), how long after the fault it first ranked first, in
seconds and in scrape intervals, and every other finding. The jobs are asked
again once they ended (`rank_after_end`).
"""
from __future__ import annotations

import glob
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

from bench.common import REPO, tracehound

EXAMPLES = os.path.join(REPO, "examples", "fleet")
SCRATCH_MB = 16            # each node's scratch, a tmpfs the ENOSPC fault fills
OOM_MEM = "256M"           # the OOM job's srun --mem

# a rank of a training job until the job ends: it passes 32 KiB to the next
# node's rank every 0.02 s round a ring over TCP (argv: dir, port, scratch
# prefix, node=address...), checkpoints a direct 256 KiB write every 0.2 s
# and checkpoints 64 KiB on its node's scratch (written new, then renamed
# over the old one: a full file system refuses it). A file <dir>/<job>-oom-<node> makes it allocate
# until its memory limit kills it.
CKPT = r'''
import mmap, os, socket, sys, threading, time
me = os.uname().nodename
job = os.environ["SLURM_JOB_ID"]
addr = dict(a.split("=") for a in sys.argv[4:])
order = [a.split("=")[0] for a in sys.argv[4:]]
port = int(sys.argv[2])
scratch = sys.argv[3] + me
server = socket.create_server((addr[me], port))
def drain():
    conn, _ = server.accept()
    while conn.recv(1 << 16):
        pass
def send():
    nxt = order[(order.index(me) + 1) % len(order)]
    while True:
        try:
            out = socket.create_connection((addr[nxt], port), timeout=5)
            break
        except OSError:
            time.sleep(0.1)
    out.settimeout(None)
    chunk = b"x" * (1 << 15)
    while True:
        out.sendall(chunk)
        time.sleep(0.02)
def grow():
    trigger = os.path.join(sys.argv[1], f"{job}-oom-{me}")
    while not os.path.exists(trigger):
        time.sleep(0.1)
    held = []
    while True:
        held.append(b"y" * (32 << 20))
for work in (drain, send, grow):
    threading.Thread(target=work, daemon=True).start()
path = os.path.join(sys.argv[1], job + "-" + me)
fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_DIRECT, 0o600)
block = mmap.mmap(-1, 1 << 18)
block.write(b"x" * (1 << 18))
small = b"s" * (1 << 16)
i = 0
while True:
    os.pwrite(fd, block, (i % 16) << 18)
    new = os.path.join(scratch, "ckpt.new")
    try:
        with open(new, "wb") as f:
            f.write(small)
        os.replace(new, os.path.join(scratch, "ckpt"))
    except OSError:
        try:
            os.unlink(new)          # a full scratch: the rank goes on
        except OSError:
            pass
    i += 1
    time.sleep(0.2)
'''
# name, experiment (None: the job's own), its environment, the rules that are
# the true cause, which node. A GPU's fatal XID last: its node's unfitness
# lasts the agent's window, and the clean jobs after it start once it cleared
FAULTS = (
    ("SIGKILL", "job-proc-kill.yaml", {}, ("killed_by_signal",), 1),
    ("SIGSEGV", "job-proc-kill.yaml", {"CHAOS_SIGNAL": "SEGV"}, ("killed_by_signal",), 0),
    ("SIGSTOP", "job-proc-stop.yaml", {"CHAOS_HOLD_SECONDS": "5"},
     ("stopped_processes", "job_stalled"), 2),
    ("io.throttle", "job-io-throttle.yaml", {"CHAOS_HOLD_SECONDS": "5"}, ("slow_writes",), 0),
    ("net.loss", "node-net-loss.yaml", {"CHAOS_HOLD_SECONDS": "8", "CHAOS_LOSS_PERCENT": "20"},
     ("node_tcp_retransmits",), 2),
    ("ENOSPC", "job-io-fill.yaml", {"CHAOS_HOLD_SECONDS": "5"}, ("write_errors",), 1),
    ("OOM", None, {}, ("oom_kill",), 2),
    # 74 (NVLink): fatal, its unfitness lasts the agent's window; 79 (fallen
    # off the bus) would leave the GPU lost until a reset
    ("fatal XID", "../gpu-xid.yaml", {"CHAOS_XID": "74"}, ("gpu_xid", "node_unfit"), 1),
)
POLL_S = 0.25       # how often the answer is asked while the fault goes in


def scratch_prefix(work: str) -> str:
    return os.path.join(work, "scratch-")


def mount_scratch(cluster, work: str) -> None:
    for node in cluster.nodes:
        path = scratch_prefix(work) + node
        os.makedirs(path)
        subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={SCRATCH_MB}m,mode=1777",
                        "thbench-scratch", path], check=True)


def unmount_scratch(cluster, work: str) -> None:
    for node in cluster.nodes:
        subprocess.run(["umount", scratch_prefix(work) + node], capture_output=True)


def start_job(cluster, name: str, data: str, work: str, port: int,
              mem: str | None = None) -> subprocess.Popen:
    ring = [f"{n}={cluster.state['addr_of'][n]}" for n in cluster.nodes]
    return subprocess.Popen(
        ["srun", f"--nodelist={','.join(cluster.nodes)}", f"--nodes={len(cluster.nodes)}",
         f"--ntasks={len(cluster.nodes)}", "--ntasks-per-node=1", f"--job-name={name}",
         *([f"--mem={mem}"] if mem else []),
         sys.executable, "-I", "-c", CKPT, data, str(port), scratch_prefix(work), *ring],
        env=cluster.env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def end_job(cluster, name: str, proc: subprocess.Popen) -> None:
    subprocess.run(["scancel", "--full", "--quiet", f"--name={name}"], env=cluster.env(),
                   capture_output=True, timeout=30)
    proc.wait(timeout=60)


def job_writing(cluster, url, explain, until, name: str) -> str:
    job = until(lambda: _job_id(cluster, name), f"job {name} running")
    until(lambda: all(explain(url, job).activity.get(n, {}).get("write_bytes", 0) > 0
                      for n in cluster.nodes), f"job {job} writing on every node")
    return job


def run_faults(cluster, bus_ids: dict, url: str, explain, until, work: str) -> list[dict]:
    """One row per fault. `explain(url, job)` answers; `until(cond, what)` waits."""
    data = tempfile.mkdtemp(prefix="thbench-ckpt-", dir="/var/tmp")      # a disk, not tmpfs
    os.chmod(data, 0o777)
    rows = []
    try:
        for i, (fault, experiment, env, rules, index) in enumerate(FAULTS):
            node = cluster.nodes[index]
            env = {**env, "CHAOS_DATA_DIR": data, "CHAOS_GPU_PCI": bus_ids[node]}
            if fault == "ENOSPC":
                env["CHAOS_DATA_DIR"] = scratch_prefix(work) + node
            rows.append(_one(cluster, url, explain, until, data, work, 20000 + i, fault,
                             experiment, env, rules, node))
            print(f"fault {fault} on {node}: rank {rows[-1]['rank']}, first after "
                  f"{rows[-1]['ranked_first_s']} s", flush=True)
    finally:
        shutil.rmtree(data, ignore_errors=True)
    return rows


def _one(cluster, url, explain, until, data, work, port, fault, experiment, env, rules,
         node) -> dict:
    name = f"thbench-fault-{port}"
    job_proc = start_job(cluster, name, data, work, port, OOM_MEM if fault == "OOM" else None)
    reports = tempfile.mkdtemp(prefix="thbench-fault-")
    try:
        job = job_writing(cluster, url, explain, until, name)
        run, applied = None, time.time()
        if experiment is None:       # the job's own rank outgrows its memory
            open(os.path.join(data, f"{job}-oom-{node}"), "w").close()
        else:
            run = subprocess.Popen(
                [*tracehound(), "chaos", "run", os.path.join(EXAMPLES, experiment), "--slurm",
                 "--job", job, "--nodes", node, "--journal", os.path.join(reports, "journal"),
                 "--report", os.path.join(reports, "reports"), "--no-plot", "--max-share",
                 "100", "--yes"], env={**cluster.env(), **env}, stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT, text=True)
        first_at, answer, deadline = None, None, time.monotonic() + 120
        while first_at is None and time.monotonic() < deadline:
            answer = explain(url, job)
            if rank_of(answer, rules, node) == 1:
                first_at = time.time()
            else:
                time.sleep(POLL_S)      # the pace of asking, not a wait for a condition
        output = run.communicate(timeout=300)[0] if run else ""
        if run:
            [path] = glob.glob(os.path.join(reports, "reports", "fleet-*", "fleet.json"))
            with open(path) as f:
                applied = json.load(f)["nodes"][node]["faults"][0]["applied_wall"]
        answer = explain(url, job)          # once the fault is over (rolled back)
        return {"fault": fault, "node": node, "job": job, "rules": list(rules),
                "rc": run.returncode if run else 0, "rank": rank_of(answer, rules, node),
                "ranked_first_s": None if first_at is None else round(first_at - applied, 2),
                "answer_s": answer.seconds, "top": top_line(answer),
                "others": others(answer, rules, node), "detail": detail(answer),
                "fleet_tail": output.strip().splitlines()[-1:] if run and run.returncode else []}
    finally:
        end_job(cluster, name, job_proc)
        shutil.rmtree(reports, ignore_errors=True)


def rank_of(answer, rules, node) -> int | None:
    """1-based place of the first finding of the true cause, None if absent."""
    return next((i for i, f in enumerate(answer.findings, 1)
                 if f.rule in rules and f.node == node), None)


def others(answer, rules, node) -> list[str]:
    return [f"{f.rule}@{f.node}" for f in answer.findings
            if not (f.rule in rules and f.node == node)]


def detail(answer) -> list[dict]:
    """Each finding as the report's JSON keeps it: enough to tell why."""
    return [{"rule": f.rule, "node": f.node, "labels": f.labels, "since": f.since,
             "value": f.value} for f in answer.findings]


def top_line(answer) -> str | None:
    return f"{answer.findings[0].node}: {answer.findings[0].says}" if answer.findings else None


def _job_id(cluster, name: str) -> str | None:
    out = subprocess.run(["squeue", "-h", "-t", "R", "-n", name, "-o", "%i"],
                         env=cluster.env(), capture_output=True, text=True).stdout.split()
    return out[0] if len(out) == 1 else None
