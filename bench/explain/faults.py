"""The fault half of bench/explain: how soon after a fault `explain` ranks it
first, on its node.

One fault at a time, each on one node of a fresh three-node job whose ranks
checkpoint (a direct 256 KiB write every 0.2 s to a disk) and pass data round
a ring over TCP, injected by the
chaos engine through Slurm (`chaos run examples/fleet/... --slurm --job ID
--nodes NODE`), while the job is explained over and over. The delay runs
from the fault's apply (its node's clock, in the fleet report) to the first
answer whose top finding is the fault's rule on that node, in seconds and
in scrape intervals (the bar: 2).
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

# a rank of a training job until the job ends: it passes 32 KiB to the next
# node's rank every 0.02 s round a ring over TCP (argv: dir, port,
# node=address...) and checkpoints a direct 256 KiB write every 0.2 s
CKPT = r'''
import mmap, os, socket, sys, threading, time
me = os.uname().nodename
addr = dict(a.split("=") for a in sys.argv[3:])
order = [a.split("=")[0] for a in sys.argv[3:]]
port = int(sys.argv[2])
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
for work in (drain, send):
    threading.Thread(target=work, daemon=True).start()
path = os.path.join(sys.argv[1], os.environ["SLURM_JOB_ID"] + "-" + me)
fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_DIRECT, 0o600)
block = mmap.mmap(-1, 1 << 18)
block.write(b"x" * (1 << 18))
i = 0
while True:
    os.pwrite(fd, block, (i % 16) << 18)
    i += 1
    time.sleep(0.2)
'''
# fault, experiment, its environment, the rules one of which should rank
# first, which node
FAULTS = (
    ("proc.kill", "job-proc-kill.yaml", {}, ("killed_by_signal",), 1),
    ("proc.stop", "job-proc-stop.yaml", {"CHAOS_HOLD_SECONDS": "5"}, ("stopped_processes",), 2),
    ("io.throttle", "job-io-throttle.yaml", {"CHAOS_HOLD_SECONDS": "5"}, ("slow_writes",), 0),
    ("net.loss", "node-net-loss.yaml", {"CHAOS_HOLD_SECONDS": "8", "CHAOS_LOSS_PERCENT": "20"},
     ("node_tcp_retransmits",), 2),
    # last: a GPU's XID is its node's, and would show in the jobs after it; a
    # fatal one is as much the XID as the node's unfitness, equal in rank
    ("gpu.xid", "../gpu-xid.yaml", {"CHAOS_XID": "79"}, ("gpu_xid", "node_unfit"), 1),
)
POLL_S = 0.25       # how often the answer is asked while the fault goes in


def run_faults(cluster, bus_ids: dict, url: str, explain, until) -> list[dict]:
    """One row per fault. `explain(url, job)` answers; `until(cond, what)` waits."""
    data = tempfile.mkdtemp(prefix="thbench-ckpt-", dir="/var/tmp")      # a disk, not tmpfs
    rows = []
    try:
        for fault, experiment, env, rules, index in FAULTS:
            node = cluster.nodes[index]
            env = {**env, "CHAOS_DATA_DIR": data, "CHAOS_GPU_PCI": bus_ids[node]}
            rows.append(_one(cluster, url, explain, until, data, fault, experiment, env, rules,
                             node))
            print(f"fault {fault} on {node}: ranked first after "
                  f"{rows[-1]['ranked_first_s']} s", flush=True)
    finally:
        shutil.rmtree(data, ignore_errors=True)
    return rows


def _one(cluster, url, explain, until, data, fault, experiment, env, rules, node) -> dict:
    name = f"thbench-ckpt-{fault}"
    ring = [f"{n}={cluster.state['addr_of'][n]}" for n in cluster.nodes]
    port = str(20000 + FAULTS.index(next(f for f in FAULTS if f[0] == fault)))
    job_proc = subprocess.Popen(
        ["srun", f"--nodelist={','.join(cluster.nodes)}", f"--nodes={len(cluster.nodes)}",
         f"--ntasks={len(cluster.nodes)}", "--ntasks-per-node=1", f"--job-name={name}",
         sys.executable, "-I", "-c", CKPT, data, port, *ring],
        env=cluster.env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    work = tempfile.mkdtemp(prefix="thbench-fault-")
    try:
        job = until(lambda: _job_id(cluster, name), f"job {name} running")
        until(lambda: all(explain(url, job).activity.get(n, {}).get("write_bytes", 0) > 0
                          for n in cluster.nodes), f"job {job} writing on every node")
        run = subprocess.Popen(
            [*tracehound(), "chaos", "run", os.path.join(EXAMPLES, experiment), "--slurm",
             "--job", job, "--nodes", node, "--journal", os.path.join(work, "journal"),
             "--report", os.path.join(work, "reports"), "--no-plot", "--max-share", "100",
             "--yes"], env={**cluster.env(), **env}, stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT, text=True)
        first_at, top, deadline = None, None, time.monotonic() + 120
        while first_at is None and time.monotonic() < deadline:
            answer = explain(url, job)
            lead = answer.findings[0] if answer.findings else None
            if lead is not None and lead.rule in rules and lead.node == node:
                first_at, top = time.time(), lead
            else:
                time.sleep(POLL_S)      # the pace of asking, not a wait for a condition
        output = run.communicate(timeout=300)[0]
        [path] = glob.glob(os.path.join(work, "reports", "fleet-*", "fleet.json"))
        with open(path) as f:
            report = json.load(f)
        applied = report["nodes"][node]["faults"][0]["applied_wall"]
        return {"fault": fault, "node": node, "job": job, "rule": top.rule if top else rules[0],
                "rc": run.returncode,
                "ranked_first_s": None if first_at is None else round(first_at - applied, 2),
                "says": top.says if top else None,
                "fleet_tail": output.strip().splitlines()[-1:] if run.returncode else []}
    finally:
        subprocess.run(["scancel", "--full", "--quiet", f"--name={name}"], env=cluster.env(),
                       capture_output=True, timeout=30)
        job_proc.wait(timeout=60)
        shutil.rmtree(work, ignore_errors=True)


def _job_id(cluster, name: str) -> str | None:
    out = subprocess.run(["squeue", "-h", "-t", "R", "-n", name, "-o", "%i"],
                         env=cluster.env(), capture_output=True, text=True).stdout.split()
    return out[0] if len(out) == 1 else None


def markdown(rows: list[dict], scrape: float) -> list[str]:
    out = ["## A fault on one node: how soon explain ranks it first", "",
           f"Each on one node of a fresh three-node job of checkpointing ranks; from the fault's "
           f"apply to the first answer that ranks it first on its node. Scrape interval "
           f"{scrape:g} s; the bar is 2 intervals.", "",
           "| fault | node | ranked first after | scrape intervals | the top finding |",
           "|---|---|---|---|---|"]
    for r in rows:
        after = r["ranked_first_s"]
        out.append(f"| {r['fault']} | {r['node']} | "
                   + (f"{after:.2f} s | {after / scrape:.1f} | {r['says']} |" if after is not None
                      else f"never (fleet run rc {r['rc']}) | - | - |"))
    return out + [""]
