"""Fleet cost: the series a real Prometheus holds for N nodes of one GPU
training node's exposition, recorded from a real agent (node.py), and what
each job adds.

For N = 100, 1,000 and 2,000 targets (fleet.py, each node its own target
and `node` label, its counters moving on at every scrape), one Prometheus
each: head series and resident memory after three scrapes of every node;
then every node's job ends and the next starts, and the series created
per node after two more scrapes are the churn per job; `tracehound
explain` (fleet mode) is timed for a job on 16 nodes and one on 256, as a
host with no Slurm commands runs it (the job's span from its series). The
recorded exposition's own figures (samples on the node, those of the job)
come first; node_exporter's, where it is installed, beside them for scale.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import tempfile
import time
import urllib.request

from bench.common import REPORT, log, stamp, tracehound
from bench.fleet_cost import fleet as fleet_mod
from bench.fleet_cost import node
from testbed import prometheus

SIZES = (100, 1000, 2000)
JOBS = {"810016": 16, "810256": 256}
INTERVAL_S = 15


def node_exporter_samples() -> int | None:
    """Samples of node_exporter with its defaults on this host, if installed."""
    exe = shutil.which("prometheus-node-exporter") or shutil.which("node_exporter")
    if not exe:
        return None
    port = prometheus.free_port()
    proc = subprocess.Popen([exe, f"--web.listen-address=127.0.0.1:{port}"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
                    return len(node.samples(r.read().decode()))
            except OSError:
                time.sleep(0.2)
        return None
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def explain_seconds(url: str, job: str) -> tuple[float, int]:
    """Wall time and exit status of `tracehound explain JOB --prometheus URL`,
    with no Slurm command on PATH."""
    start = time.monotonic()
    done = subprocess.run([*tracehound(), "explain", job, "--prometheus", url, "--json"],
                          capture_output=True, text=True, timeout=600,
                          env={**os.environ, "PATH": "/nonexistent"})
    return time.monotonic() - start, done.returncode


def one_size(expo: fleet_mod.Exposition, nodes: int, workdir: str) -> dict:
    jobs = {j: n for j, n in JOBS.items() if sum(JOBS.values()) <= nodes} or {"810016": 16}
    fleet = fleet_mod.Fleet(expo, nodes, jobs)
    port = fleet.start()
    row: dict = {"nodes": nodes}
    try:
        with prometheus.serving(workdir, fleet.config(port, f"{INTERVAL_S}s")) as url:
            fleet_mod.wait_turns(fleet, 3, timeout=30 * INTERVAL_S)
            first = fleet_mod.own_metrics(url)
            row["head_series"] = first["prometheus_tsdb_head_series"]
            row["rss_bytes"] = first["process_resident_memory_bytes"]
            for job, size in jobs.items():
                took, rc = explain_seconds(url, job)
                row[f"explain_{size}_nodes_s"], row[f"explain_{size}_nodes_rc"] = took, rc
            fleet.new_jobs("1")
            fleet_mod.wait_turns(fleet, 2, timeout=30 * INTERVAL_S)
            after = fleet_mod.own_metrics(url)
            created = (after["prometheus_tsdb_head_series_created_total"]
                       - first["prometheus_tsdb_head_series_created_total"])
            row["new_series_per_node_per_job"] = created / nodes
            row["rss_after_churn_bytes"] = after["process_resident_memory_bytes"]
    finally:
        fleet.stop()
    log(f"{nodes} nodes: {row}")
    return row


def markdown(meta: dict, rec: dict, rows: list[dict]) -> str:
    out = [f"# Fleet cost\n\n{meta['date']}, commit {meta['commit']}, {meta['machine']}.\n",
           f"One GPU training node (a real agent, defaults): a job step of {rec['ranks']} tasks "
           f"writing, syncing and reading on {rec['mounts']} mounts. **{rec['samples']} samples "
           f"on the node, {rec['of_job']} of them labelled with the job** ({rec['before']} "
           "before it started)."
           + (f" node_exporter on this host, its defaults: {rec['node_exporter']} samples."
              if rec.get("node_exporter") else "") + "\n",
           "| nodes | head series | Prometheus RSS | new series per node per job | "
           "explain, job on 16 nodes | explain, job on 256 nodes |",
           "|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        def ex(size):
            s = r.get(f"explain_{size}_nodes_s")
            return "-" if s is None else f"{s:.2f} s (exit {r[f'explain_{size}_nodes_rc']})"
        out.append(f"| {r['nodes']:,} | {r['head_series']:,.0f} | {r['rss_bytes'] / 2**20:,.0f} MiB"
                   f" | {r['new_series_per_node_per_job']:.0f} | {ex(16)} | {ex(256)} |")
    out.append(f"\nScrape interval {INTERVAL_S} s; figures after three scrapes of every node, "
               "churn after two more once every node's job was replaced.")
    return "\n".join(out) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.fleet_cost", description=__doc__)
    ap.add_argument("--sizes", default=",".join(map(str, SIZES)))
    ap.add_argument("--out", default=str(REPORT))
    args = ap.parse_args()
    meta = stamp()
    rec = node.record()
    rec["node_exporter"] = node_exporter_samples()
    expo = fleet_mod.Exposition(rec["text"], rec["job"])
    rows = []
    for n in (int(x) for x in args.sizes.split(",")):
        with tempfile.TemporaryDirectory(prefix="fleet-cost-prom-") as d:
            rows.append(one_size(expo, n, d))
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "fleet-cost.json"), "w") as f:
        json.dump({"meta": meta, "node": {k: v for k, v in rec.items() if k != "text"},
                   "fleet": rows}, f, indent=1)
    with open(os.path.join(args.out, "fleet-cost.md"), "w") as f:
        f.write(markdown(meta, rec, rows))
    print(markdown(meta, rec, rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
