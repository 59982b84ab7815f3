"""Fault to drain: how long from a GPU's kernel-log line to slurmctld
showing its node DRAIN, on a real Slurm cluster of --nodes N (each with its
own agent, `run --subsystems gpu`, and `tracehound health` as its real
HealthCheckProgram), against HealthCheckInterval; then the breaker's worst
instant when every node fails at once.

For each size: --trials faults, one node at a time (a fatal XID 48 line
naming the node's GPU; the node resumes by itself once the agent's window,
two intervals and five seconds, passes), each timed from the write to the first 0.1 s poll of
`scontrol show node` that shows DRAIN with a tracehound reason. Then XID 79
on every node at once, slurmctld sampled every 0.5 s for three intervals:
the most nodes drained by tracehound at one sample, against the limit.
Goal: p99 <= interval + 1 s; worst instant <= limit.

    sudo .venv/bin/python -m bench.health_drain [--nodes 20,100] [--interval 15,30] [--trials 6]

Writes health-drain.md, health-drain.json and health-drain.png to bench/report (--out).
"""
from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.common import REPORT, log, loadavg, stamp, verdict
from testbed.agents import Agents
from testbed.slurm import Cluster

# the agent's fatal-XID window: two health intervals and a little (a run
# may come a whole interval after the line, and start seconds late when a
# hundred nodes' agents share two CPUs: at interval + 5 s the 100-node run
# missed its second trial twice), short enough for the node to resume soon
WINDOW_PAST_INTERVAL_S = 5
REASON = "tracehound:"


def write_kmsg(text: str) -> None:
    fd = os.open("/dev/kmsg", os.O_WRONLY)
    try:
        os.write(fd, f"<4>{text}\n".encode())
    finally:
        os.close(fd)


def xid_line(bus: str, xid: int) -> str:
    domain, bus_no, rest = bus.split(":")
    return (f"NVRM: Xid (PCI:{domain}:{bus_no}:{rest.split('.')[0]}): {xid}, pid=4242, "
            "name=python, Channel 00000010")


def drained_by_us(cluster: Cluster, errors: list) -> list[str] | None:
    """The nodes slurmctld shows drained by tracehound; None (and the error
    kept) when it did not answer this poll: a loaded controller times out."""
    try:
        info = cluster.node_info()
    except subprocess.CalledProcessError as exc:
        errors.append((exc.stderr or "").strip()[-200:])
        return None
    return sorted(n for n, i in info.items()
                  if "DRAIN" in i["Flags"] and i.get("Reason", "").startswith(REASON))


def node_drained(cluster: Cluster, node: str, errors: list) -> bool:
    out = cluster.scontrol("show", "node", node, "-o", check=False)
    if out.returncode != 0:
        errors.append(out.stderr.strip()[-200:])
        return False
    return " Reason=" + REASON in out.stdout and "DRAIN" in out.stdout


def health_program(run_dir: str, tracehound: str) -> str:
    path = os.path.join(run_dir, "healthcheck")
    node = f'{run_dir}/"$SLURMD_NODENAME"'
    with open(path, "w") as f:
        f.write(f"#!/bin/sh\nexec {tracehound} health --slurm-conf {run_dir}/slurm.conf "
                f"--instance thtest-\"$SLURMD_NODENAME\" --state-file {node}/health.json "
                f">>{node}/health.log 2>&1\n")
    os.chmod(path, 0o755)
    return path


def measure(nodes: int, interval: int, trials: int) -> dict:
    run_dir = tempfile.mkdtemp(prefix="thbench-drain-")
    tracehound = os.path.join(os.path.dirname(sys.executable), "tracehound")
    cluster = Cluster(run_dir, nodes, prefix=f"d{nodes}n",
                      health_program=health_program(run_dir, tracehound),
                      health_interval=interval)
    window = 2 * interval + WINDOW_PAST_INTERVAL_S
    agents = Agents.with_unseen_gpus(cluster, extra=("--subsystems", "gpu",
                                                     "--gpu-fatal-xid-window", str(window)))
    out = {"nodes": nodes, "interval_s": interval, "drain_s": []}
    errors: list = []
    try:
        log(f"{nodes} nodes: starting slurmd and an agent each")
        out["start_s"] = round(cluster.up(before_slurmd=agents.start_all, timeout=600), 1)
        for k in range(trials):
            node = cluster.nodes[(k * 7) % nodes]
            cluster.wait_nodes(lambda n: "DRAIN" not in n["Flags"], window + 3 * interval + 30,
                               "none drained")
            t0 = time.monotonic()
            write_kmsg(xid_line(agents.bus_ids[node], 48))
            while not node_drained(cluster, node, errors):
                if time.monotonic() - t0 > 3 * interval + 30:
                    raise RuntimeError(f"{node} not drained in {3 * interval + 30} s")
                time.sleep(0.1)
            out["drain_s"].append(round(time.monotonic() - t0, 2))
            log(f"{nodes} nodes: trial {k + 1}: {node} drained {out['drain_s'][-1]} s after "
                "its line")
        cluster.wait_nodes(lambda n: "DRAIN" not in n["Flags"], window + 3 * interval + 30,
                           "none drained")
        limit = max(1, math.floor(nodes * 0.10))
        for node in cluster.nodes:
            write_kmsg(xid_line(agents.bus_ids[node], 79))
        worst, end = 0, time.monotonic() + 3 * interval
        samples = 0
        while time.monotonic() < end:
            now = drained_by_us(cluster, errors)
            if now is not None:
                worst, samples = max(worst, len(now)), samples + 1
            time.sleep(0.5)
        at_end = None
        while at_end is None:
            at_end = drained_by_us(cluster, errors)
        out.update(limit=limit, worst_instant=worst, samples=samples,
                   drained_at_end=len(at_end), load=loadavg(),
                   unanswered_polls=len(errors), last_error=errors[-1] if errors else "")
    except BaseException:
        failed = True
        raise
    else:
        failed = False
    finally:
        if failed:      # the nodes' health and agent logs, slurmctld's: the cluster removes its own
            kept = shutil.copytree(run_dir, f"{run_dir}-kept", ignore_dangling_symlinks=True,
                                   ignore=shutil.ignore_patterns("*.sock", "spool", "state"))
            log(f"{nodes} nodes: failed; its logs are kept in {kept}")
        agents.stop_all()
        cluster.down()
        agents.forget()
        shutil.rmtree(run_dir, ignore_errors=True)
    d = sorted(out["drain_s"])
    out["p50_s"] = round(statistics.median(d), 2)
    out["p99_s"] = round(d[min(len(d) - 1, math.ceil(0.99 * len(d)) - 1)], 2)
    return out


def markdown(results: list[dict], st: dict) -> str:
    lines = ["# Fault to drain: a kernel-log line to slurmctld's DRAIN", "",
             f"Commit {st['commit']}, {st['machine']}, {st['date']}. A real Slurm 22.05 cluster "
             "on this machine, an agent per node (`--subsystems gpu`), `tracehound health` as "
             "every node's HealthCheckProgram (`HealthCheckNodeState=ANY,CYCLE`). With "
             "trials this few, p99 is the slowest trial.", "",
             "| nodes | interval | trials | p50 | p99 | goal p99 <= interval + 1 s | breaker's "
             "worst instant | limit | drained at end | load after |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        ok = r["p99_s"] <= r["interval_s"] + 1
        lines.append(f"| {r['nodes']} | {r['interval_s']} s | {len(r['drain_s'])} | "
                     f"{r['p50_s']} s | {r['p99_s']} s | {verdict(ok)} | {r['worst_instant']} | "
                     f"{r['limit']} ({verdict(r['worst_instant'] <= r['limit'])}) | "
                     f"{r['drained_at_end']} | {' '.join(r['load'])} |")
    lines += ["", "Every trial, in seconds:", ""]
    lines += [f"- {r['nodes']} nodes (cluster up in {r['start_s']} s): "
              + ", ".join(map(str, r["drain_s"])) + f"; {r['samples']} samples of the storm; "
              f"{r['unanswered_polls']} polls slurmctld did not answer"
              + (f" (last: {r['last_error']})" if r["last_error"] else "") for r in results]
    return "\n".join(lines) + "\n"


def plot(results: list[dict], path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(6, 3.5))
    for r in results:
        ax.plot(sorted(r["drain_s"]), [(i + 1) / len(r["drain_s"]) for i in range(len(r["drain_s"]))],
                marker="o", label=f"{r['nodes']} nodes")
        ax.axvline(r["interval_s"] + 1, ls="--", color="grey")
    ax.set_xlabel("kernel-log line to DRAIN (s)")
    ax.set_ylabel("share of trials")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--nodes", default="20,100")
    p.add_argument("--interval", default="15,30",
                   help="HealthCheckInterval for each size, in order (one value: for all)")
    p.add_argument("--trials", type=int, default=6)
    p.add_argument("--out", type=Path, default=REPORT)
    args = p.parse_args()
    sizes = [int(n) for n in args.nodes.split(",")]
    intervals = [int(i) for i in args.interval.split(",")]
    intervals += intervals[-1:] * (len(sizes) - len(intervals))
    results = [measure(n, i, args.trials) for n, i in zip(sizes, intervals)]
    st = stamp()
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "health-drain.json").write_text(json.dumps({**st, "results": results}, indent=1))
    (args.out / "health-drain.md").write_text(markdown(results, st))
    plot(results, args.out / "health-drain.png")
    print(markdown(results, st))
    return 0


if __name__ == "__main__":
    sys.exit(main())
