"""`tracehound explain`'s accuracy and speed on a real fleet. A real Slurm
cluster on this machine (four slurmd, each with its own agent, as the
cluster test tier runs them), a real Prometheus scraping the agents, and
waves of mixed healthy jobs for --seconds (default ten minutes):

  io     4 nodes: each task writes, fsyncs, reads back and removes 32 MiB files
  tcp    2 nodes: task 0 listens, task 1 streams to it over the cluster bridge
  cpu    1 node: a half-busy loop
  short  4 one-node jobs that start and end at once

Every job is explained over its life (no --window) while it runs and again
after it ended: in process (the answer's own seconds and query count) and
through the CLI (what a user waits for, interpreter start included). In the
same run, the floor: one instant query to the same Prometheus. Then, unless
--no-faults, one fault at a time on one node of a fresh four-node job
(bench/explain/faults.py): the rank of the true cause and how soon it was
first; then clean jobs on the nodes once the fatal XID's unfitness cleared;
at the end every job is asked again, minutes after it ended (Slurm has
forgotten the early ones: their span comes from their series). The bar: the
true cause first for every fault, 0 findings on the clean jobs, 2 s per
answer for a job on 4 nodes.

    sudo .venv/bin/python -m bench.explain [--seconds 600] [--scrape 5] [--no-faults]

Writes explain.md, explain.json and explain.png to bench/report (--out).
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

from bench.common import REPORT, commit, machine
# the fault half runs in this run's cluster: its module has no entry of its own
from bench.explain import accuracy
from bench.explain.faults import mount_scratch, run_faults, unmount_scratch
from testbed import prometheus as prometheus_server
from testbed.agents import Agents
from testbed.cli import tracehound_cmd
from testbed.slurm import PARTITION, Cluster
from tracehound.explain.fleet import explain
from tracehound.clients import prometheus

NODES = 4
# one task of a job; its kind and the seconds it runs come as arguments,
# its rank from Slurm. Each writes "<dir>/<kind>-<rank>" once it works.
TASK = r'''
import os, socket, sys, time
kind, seconds, out, peer = sys.argv[1], float(sys.argv[2]), sys.argv[3], sys.argv[4]
rank = int(os.environ["SLURM_PROCID"])
job = os.environ["SLURM_JOB_ID"]
def started():
    open(os.path.join(out, f"{job}-{kind}-{rank}"), "w").close()
end = time.monotonic() + seconds
if kind == "io":
    path = f"/var/tmp/thbench-{job}-{rank}"
    block = os.urandom(1 << 20)
    started()
    while time.monotonic() < end:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
        for _ in range(32):
            os.write(fd, block)
        os.fsync(fd)
        os.lseek(fd, 0, os.SEEK_SET)
        while os.read(fd, 1 << 20):
            pass
        os.close(fd)
        os.unlink(path)
elif kind == "tcp" and rank == 0:
    srv = socket.create_server(("0.0.0.0", 0))
    open(os.path.join(out, f"{job}-port"), "w").write(str(srv.getsockname()[1]))
    conn, _ = srv.accept()
    started()
    while conn.recv(1 << 16):
        pass
elif kind == "tcp":
    port_file = os.path.join(out, f"{job}-port")
    while not os.path.exists(port_file) or not open(port_file).read():
        time.sleep(0.05)            # the listener is not up yet
    conn = socket.create_connection((peer, int(open(port_file).read())))
    started()
    chunk = b"x" * (1 << 16)
    while time.monotonic() < end:
        conn.sendall(chunk)
        time.sleep(0.001)           # a steady stream, not a saturated link
    conn.close()
elif kind == "cpu":
    started()
    while time.monotonic() < end:
        busy = time.monotonic() + 0.05
        while time.monotonic() < busy:
            pass
        time.sleep(0.05)
else:
    started()
'''


class Wave:
    """One wave of jobs, started together; each job's tasks say when they work."""

    def __init__(self, cluster: Cluster, out: str, seconds: float):
        self.cluster, self.out = cluster, out
        n = cluster.nodes
        addr = cluster.state["addr_of"]
        self.procs: dict[str, subprocess.Popen] = {}
        self.tasks: dict[str, int] = {}
        for name, kind, nodes, secs in (("io", "io", n, seconds), ("tcp", "tcp", n[:2], seconds),
                                         ("cpu", "cpu", n[2:3], seconds)):
            self._srun(name, kind, nodes, secs, addr[nodes[0]])
        for i, node in enumerate(n):
            self._srun(f"short{i}", "short", [node], 0, "-")

    def _srun(self, name, kind, nodes, seconds, peer):
        tag = f"thbench-{name}-{time.monotonic_ns()}"
        self.procs[tag] = subprocess.Popen(
            ["srun", f"--nodelist={','.join(nodes)}", f"--nodes={len(nodes)}",
             f"--ntasks={len(nodes)}", "--ntasks-per-node=1", f"--job-name={tag}",
             sys.executable, "-I", "-c", TASK, kind, str(seconds), self.out, peer],
            env=self.cluster.env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        self.tasks[tag] = len(nodes)

    def job_ids(self) -> dict[str, str]:
        """name -> job id, of the wave's jobs Slurm knows of (running or ended)."""
        out = subprocess.run(["squeue", "-h", "-t", "all", "-o", "%j %i"], env=self.cluster.env(),
                             capture_output=True, text=True).stdout
        return {ln.split()[0]: ln.split()[1] for ln in out.splitlines()
                if ln.split() and ln.split()[0] in self.procs}

    def working(self, ids: dict[str, str]) -> bool:
        have = os.listdir(self.out)
        return all(sum(f.startswith(f"{ids[tag]}-") and not f.endswith("-port") for f in have)
                   >= count for tag, count in self.tasks.items() if tag in ids)

    def wait(self) -> list[str]:
        failed = []
        for tag, proc in self.procs.items():
            if proc.wait(timeout=600) != 0:
                failed.append(f"{tag}: srun exited {proc.returncode}: "
                              + proc.stderr.read().decode(errors="replace")[-300:])
        return failed


def until(cond, what: str, timeout: float = 120):
    deadline = time.monotonic() + timeout
    while not (got := cond()):
        if time.monotonic() > deadline:
            raise RuntimeError(f"no {what} after {timeout:.0f} s")
        time.sleep(0.2)
    return got


def fleet_explain(url: str, job: str):
    return explain(url, job, None, "node")


def ask(url: str, job: str, cli: bool) -> dict:
    answer = fleet_explain(url, job)
    row = {"job": job, "nodes": len(answer.nodes), "seconds": answer.seconds,
           "queries": answer.queries, "findings": [f.says for f in answer.findings],
           "finding_rules": [f"{f.rule}@{f.node}" for f in answer.findings],
           "span_source": answer.span_source, "blind": answer.blind}
    if cli:
        t0 = time.monotonic()
        done = subprocess.run([*tracehound_cmd(), "explain", job, "--prometheus", url, "--json"],
                              capture_output=True, text=True, timeout=60)
        row["cli_seconds"] = round(time.monotonic() - t0, 3)
        row["cli_rc"] = done.returncode
    return row


def floor(url: str, n: int = 5) -> float:
    times = []
    for _ in range(n):
        t0 = time.monotonic()
        prometheus.query(url, "up")
        times.append(time.monotonic() - t0)
    return statistics.median(times)


def soak(cluster: Cluster, url: str, seconds: float, wave_s: float, scrape: float) -> dict:
    rows, floors, failed, waves = [], [], [], 0
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        out = tempfile.mkdtemp(prefix="thbench-wave-")
        os.chmod(out, 0o777)
        wave = Wave(cluster, out, wave_s)
        ids = until(lambda: (lambda i: i if len(i) == len(wave.procs) else None)(wave.job_ids()),
                    "job ids of the wave")
        until(lambda: wave.working(ids), "tasks of the wave at work")
        until(lambda: all(len(fleet_explain(url, ids[t]).nodes) == wave.tasks[t]
                          for t in ids if not t.startswith("thbench-short")),
              "Prometheus seeing the wave's jobs on their nodes")
        live = [ask(url, ids[t], cli=t.startswith("thbench-io-"))
                for t in ids if not t.startswith("thbench-short")]
        failed += wave.wait()
        time.sleep(2 * scrape)      # let Prometheus scrape the ends
        ended = [ask(url, job, cli=False) for job in ids.values()]
        for r in live:
            r["when"] = "running"
        for r in ended:
            r["when"] = "ended"
        rows += live + ended
        floors.append(floor(url))
        waves += 1
        shutil.rmtree(out, ignore_errors=True)
        print(f"wave {waves}: {len(ids)} jobs, "
              f"{sum(len(r['findings']) for r in live + ended)} finding(s), "
              f"{time.monotonic() - end + seconds:.0f}/{seconds:.0f} s", flush=True)
    return {"rows": rows, "floors": floors, "failed": failed, "waves": waves}


def summary(result: dict) -> dict:
    four = [r for r in result["rows"] if r["nodes"] == NODES]
    secs = sorted(r["seconds"] for r in four)
    cli = sorted(r["cli_seconds"] for r in four if "cli_seconds" in r)
    fl = statistics.median(result["floors"])
    q = statistics.median(r["queries"] for r in four)
    return {"answers": len(result["rows"]), "four_node_answers": len(four),
            "findings": sum(len(r["findings"]) for r in result["rows"]),
            "answer_s_median": statistics.median(secs), "answer_s_max": secs[-1],
            "cli_s_median": statistics.median(cli) if cli else None,
            "cli_s_max": cli[-1] if cli else None,
            "queries_median": q, "one_query_s": round(fl, 4),
            "answer_over_queries_floor": round(statistics.median(secs) / (q * fl), 2)}


def markdown(meta: dict, s: dict, result: dict) -> str:
    found = [f"- job {r['job']} ({r['when']}): {', '.join(r['finding_rules'])}"
             for r in result["rows"] if r["findings"]]
    return "\n".join([
        "# `tracehound explain`: accuracy and speed on a real fleet", "",
        f"Commit {meta['commit']}, {meta['machine']}; {meta['when']}.",
        f"A real Slurm 22.05 cluster of {meta['nodes']} nodes on this host, one agent each, "
        f"scraped by Prometheus every {meta['scrape_s']:g} s. "
        "Regenerate: `sudo .venv/bin/python -m bench.explain`.", "",
        "## Healthy jobs", "",
        f"{result['waves']} waves of mixed jobs (io on {NODES} nodes, tcp on 2, cpu on 1, "
        f"{NODES} short) over {meta['seconds']:.0f} s; each job explained over its life while "
        "it ran and after it ended.", "",
        "| | figure |", "|---|---|",
        f"| answers | {s['answers']} ({s['four_node_answers']} of them for a job on "
        f"{NODES} nodes) |",
        f"| **findings on healthy jobs** (bar: 0) | **{s['findings']}** |",
        f"| answer, job on {NODES} nodes, median / max | {s['answer_s_median']:.3f} s / "
        f"{s['answer_s_max']:.3f} s (bar: 2 s) |",
        f"| the same through the CLI (interpreter start included), median / max | "
        f"{s['cli_s_median']:.3f} s / {s['cli_s_max']:.3f} s |",
        f"| queries per answer (median) | {s['queries_median']:g} |",
        f"| one instant query, same Prometheus, same run (the floor) | {s['one_query_s']:.4f} s |",
        f"| answer / (queries x one query) | {s['answer_over_queries_floor']:g} |",
        f"| jobs that failed | {len(result['failed'])} |", "",
        *(["Findings:", "", *found, ""] if found else []),
        *(["Failed jobs:", "", *(f"- {f}" for f in result["failed"]), ""]
          if result["failed"] else []),
        "![answer time per question](explain.png)", ""])


def plot(result: dict, path: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    rows = result["rows"]
    fig, ax = plt.subplots(figsize=(8, 3.5))
    for nodes, mark in ((1, "."), (2, "x"), (NODES, "o")):
        pts = [(i, r["seconds"]) for i, r in enumerate(rows) if r["nodes"] == nodes]
        if pts:
            ax.plot(*zip(*pts), mark, label=f"job on {nodes} node(s)")
    cli = [(i, r["cli_seconds"]) for i, r in enumerate(rows) if "cli_seconds" in r]
    if cli:
        ax.plot(*zip(*cli), "s", mfc="none", label=f"CLI, job on {NODES} nodes")
    ax.axhline(2.0, color="red", lw=0.8, label="bar: 2 s")
    ax.set_xlabel("question, in order")
    ax.set_ylabel("seconds to answer")
    ax.set_yscale("log")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.explain",
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=600)
    ap.add_argument("--wave", type=float, default=40, help="seconds each wave's jobs run")
    ap.add_argument("--scrape", type=float, default=5)
    ap.add_argument("--clean-after", type=int, default=5,
                    help="clean jobs once the fatal XID's unfitness cleared (default 5)")
    ap.add_argument("--out", default=str(REPORT))
    ap.add_argument("--no-faults", action="store_true",
                    help="the healthy soak only (the faults, bench/explain/faults.py, after it "
                         "by default)")
    args = ap.parse_args()
    # the tree that runs: stamped before the run, not after it
    code = commit()
    # stopped early (Ctrl-C, or TERM from a supervisor): the cluster still goes down
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda n, _f: sys.exit(128 + n))
    run_dir = tempfile.mkdtemp(prefix="thbench-slurm-")
    cluster = Cluster(run_dir, NODES, prefix="b")
    agents = Agents.with_unseen_gpus(cluster)
    prom_dir = tempfile.mkdtemp(prefix="thbench-prom-")
    work = tempfile.mkdtemp(prefix="thbench-explain-")
    result = {"faults": [], "clean": [], "late": []}
    try:
        cluster.up(before_slurmd=agents.start_all, timeout=120)
        # explain runs in this process: Slurm's clients find the cluster as an
        # operator's host finds its own
        os.environ["SLURM_CONF"] = cluster.conf
        mount_scratch(cluster, work)
        addr = cluster.state["addr_of"]
        config = {"global": {"scrape_interval": f"{args.scrape:g}s"},
                  "scrape_configs": [{"job_name": "tracehound", "static_configs": [
                      {"targets": [f"{addr[n]}:9560"], "labels": {"node": n}}
                      for n in cluster.nodes]}]}
        with prometheus_server.serving(prom_dir, config) as url:
            until(lambda: len(prometheus.query(url, "up == 1")) == NODES, "the agents scraped")
            result.update(soak(cluster, url, args.seconds, args.wave, args.scrape))
            if not args.no_faults:
                result["faults"] = run_faults(cluster, agents.bus_ids, url, fleet_explain,
                                              until, work)
                result["clean"] = accuracy.clean_jobs(cluster, url, fleet_explain, until, work,
                                                      args.clean_after)
            result["late"] = accuracy.ask_again(url, fleet_explain, result)
    finally:
        subprocess.run(["scancel", "--full", "--quiet", f"--partition={PARTITION}"],
                       env=cluster.env(), capture_output=True, timeout=30)
        for node in list(agents.procs):
            agents.stop(node)
        unmount_scratch(cluster, work)
        cluster.down()
        agents.forget()
        for path in (run_dir, prom_dir, work):
            shutil.rmtree(path, ignore_errors=True)
    meta = {"commit": code, "machine": machine(), "nodes": NODES, "scrape_s": args.scrape,
            "seconds": args.seconds, "when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
    s = summary(result)
    s["accuracy"] = accuracy.scores(result)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "explain.json"), "w") as f:
        json.dump({"meta": meta, "summary": s, **result}, f, indent=1)
    with open(os.path.join(args.out, "explain.md"), "w") as f:
        f.write(markdown(meta, s, result) + "\n".join(
            accuracy.markdown(result, s["accuracy"], args.scrape) if result["faults"] else []))
    plot(result, os.path.join(args.out, "explain.png"))
    print(json.dumps(s, indent=1))
    a = s["accuracy"]
    return 0 if s["findings"] == 0 and not result["failed"] and a["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
