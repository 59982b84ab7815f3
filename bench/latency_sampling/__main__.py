#!/usr/bin/env python3
"""How close sampled timing (the agent's default, `--latency on`) comes to
timing every call, measured two ways, each workload in a cgroup of its own:

  same calls, same clock: one agent with `--latency audit` keeps both the
            sampled histogram and the full one of the same calls
            (testbed/io_audit.py); the targets are judged here
  side by side: the agent as deployed (`--latency on`) beside one with
            `--latency every`, attached at once (below)

The workloads:

  bimodal   4 KiB page-cache reads (tmpfs) beside O_DIRECT 4 KiB reads of a
            file on the root disk, in one cgroup: two latency modes
  low-rate  4 KiB page-cache reads at 200 a second: every call is timed
  burst     the low rate, a storm of page-cache reads, the low rate again

For each, p50, p90 and p99 of the cgroup's read histogram on the workload's
own mounts as each agent exports it (interpolated within the log2 buckets,
as PromQL's histogram_quantile does; fio's start-up reads of its libraries,
on other mounts, are left out), the histograms' counts against the
requests, and the calls the sampled agent timed. Each agent's clock window holds part of
the other's programs (the first attached times the second's entry, the
second the first's exit), so every workload runs with each attach order and
a quantile's ratio is the geometric mean of the two. How far the every-call
agent's own quantiles move between the two orders is the floor under any
comparison of this kind, and the report gives it. That does not cancel
all of it: the every-call agent's programs, with their clock reads, are the
dearer, and the sampled agent's windows hold them in either order, while
the every-call agent's hold the sampled one's lighter ones. The bias adds a
few hundred ns to the sampled agent's calls: large beside a 1 us page-cache
read, nothing beside a 50 us disk read. (Taking turns instead, one agent at
a time, gave round-to-round spreads of 20 to 400 % on this host's quantiles.)

Run as root:  python -m bench.latency_sampling [--runtime S] [--out DIR]
Writes latency-sampling.{json,md,png} into bench/report/.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import signal
import subprocess
import sys
import tempfile
import urllib.request
import uuid
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from bench.common import REPO, REPORT, log, verdict
from bench.overhead.tools import facts, tree_env
from bench.tracer import Tool
from testbed.io_audit import buckets, full_histograms, mount_ids, summed

CGROUP2 = "/sys/fs/cgroup/unified" if os.path.isdir("/sys/fs/cgroup/unified") else "/sys/fs/cgroup"
HIST = "tracehound_io_read_latency_seconds"
TIMED = "tracehound_io_latency_timed_calls"
QUANTILES = (0.5, 0.9, 0.99)
WORKLOADS = ("bimodal", "low-rate", "burst")
LATENCY = {"every": "every", "sampled": "on", "audit": "audit"}
ORDERS = (("every", "sampled"), ("sampled", "every"))
TOLERANCE_PCT = 5.0
LOW_RATE_IOPS = 200


def agent(name: str, latency: str, gap_us: int | None = None) -> Tool:
    cmd = [str(REPO / ".venv/bin/tracehound"), "run", "--listen", "127.0.0.1:0",
           "--instance", f"bench-{name}-{uuid.uuid4().hex[:6]}", "--cgroup-key", "v2",
           "--latency-histograms", "cgroup-mount", "--latency", latency]
    cmd += ["--latency-sample-gap", str(gap_us)] if gap_us and latency != "every" else []
    return Tool(name, cmd, r"serving metrics on", signal.SIGTERM, tree_env())


def mountpoint(path: str) -> str:
    return subprocess.run(["findmnt", "-n", "-o", "TARGET", "--target", path], check=True,
                          capture_output=True, text=True).stdout.strip()


def scrape(tool: Tool, cgroup: str, mounts: tuple[str, ...] = ()) -> dict:
    """The cgroup's read histogram on MOUNTS (le -> cumulative count, summed
    over them), its requests there and the node's timed reads, from one
    scrape of the agent."""
    with urllib.request.urlopen(tool.url(), timeout=30) as r:
        text = r.read().decode()
    out = {"buckets": {}, "requests": 0.0, "timed": None}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            mine = s.labels.get("cgroup") == cgroup and s.labels.get("mountpoint") in mounts
            if fam.name == HIST and s.name == HIST + "_bucket" and mine:
                le = float(s.labels["le"])
                out["buckets"][le] = out["buckets"].get(le, 0.0) + s.value
            elif s.name == "tracehound_io_read_requests_total" and mine:
                out["requests"] += s.value
            elif fam.name == TIMED and s.name == TIMED + "_total" and s.labels.get("op") == "read":
                out["timed"] = s.value
    return out


def quantile(buckets: dict[float, float], q: float) -> float:
    """histogram_quantile's interpolation within the bucket that holds rank q"""
    pts = sorted(buckets.items())
    total = pts[-1][1] if pts else 0
    if not total:
        return math.nan
    rank, lo, below = q * total, 0.0, 0.0
    for le, cum in pts:
        if cum >= rank:
            if math.isinf(le):
                return lo
            return lo + (le - lo) * (rank - below) / (cum - below) if cum > below else le
        lo, below = le, cum
    return lo


def fio_jobs(name: str, tmpfs: str, disk: str, runtime: int) -> list[str]:
    common = ["--bs=4k", "--ioengine=psync", "--norandommap", "--invalidate=0", "--time_based"]
    cache = [f"--filename={tmpfs}/cache", "--size=64M", "--rw=randread", *common]
    if name == "bimodal":
        return ["--name=cache", *cache, f"--runtime={runtime}",
                "--name=disk", f"--filename={disk}/direct", "--size=64M", "--rw=randread",
                "--direct=1", *common, f"--runtime={runtime}"]
    if name == "low-rate":
        return ["--name=low", *cache, f"--runtime={runtime}", f"--rate_iops={LOW_RATE_IOPS}"]
    third = max(1, runtime // 3)
    return ["--name=low", *cache, f"--runtime={3 * third}", f"--rate_iops={LOW_RATE_IOPS}",
            "--name=storm", *cache, f"--startdelay={third}", f"--runtime={third}"]


def histogram_of(got: dict, buckets_: dict[float, float], timed: float | None) -> dict:
    return {"requests": got["requests"], "count": buckets_.get(math.inf, 0.0), "timed": timed,
            "quantiles_s": {str(q): quantile(buckets_, q) for q in QUANTILES},
            "buckets": {str(le): c for le, c in sorted(buckets_.items())}}


def run_workload(name: str, agents: dict[str, Tool], tmpfs: str, disk: str, runtime: int) -> dict:
    """The workload in a cgroup of its own under every agent in AGENTS; an
    agent named audit (--latency audit) also gives the full histogram of the
    same calls, as "audit-full"."""
    cgroup = f"/bench-sampling-{name}-{uuid.uuid4().hex[:6]}"
    os.mkdir(CGROUP2 + cgroup)
    cgroup_id = os.stat(CGROUP2 + cgroup).st_ino
    try:
        before = {k: scrape(t, cgroup)["timed"] for k, t in agents.items()}
        cmd = ["fio", "--output-format=json", *fio_jobs(name, tmpfs, disk, runtime)]
        out = subprocess.run(["sh", "-c", 'echo $$ > "$0" && exec "$@"',
                              CGROUP2 + cgroup + "/cgroup.procs", *cmd],
                             capture_output=True, text=True, check=True)
        fio_reads = sum(j["read"]["total_ios"] for j in json.loads(out.stdout)["jobs"])
        res = {"fio_reads": fio_reads, "agents": {}}
        mounts = (mountpoint(tmpfs),) + ((mountpoint(disk),) if name == "bimodal" else ())
        for k, t in agents.items():
            got = scrape(t, cgroup, mounts)
            res["agents"][k] = histogram_of(
                got, got["buckets"], None if got["timed"] is None else got["timed"] - (before[k] or 0))
            if k == "audit":
                ids = mount_ids(mounts)
                full = summed(full_histograms(t.proc.pid), cgroup_id, ids)
                res["agents"]["audit-full"] = histogram_of(got, buckets(full), None)
        return res
    finally:
        os.rmdir(CGROUP2 + cgroup)


def ratio(w: dict, q: str) -> float:
    a = w["agents"]
    return a["sampled"]["quantiles_s"][q] / a["every"]["quantiles_s"][q]


def diffs(runs: dict[str, dict], name: str) -> dict[str, float]:
    """quantile -> sampled against every call timed, in %: the geometric mean
    of the two attach orders' ratios"""
    return {str(q): 100 * (math.prod(ratio(r[name], str(q)) for r in runs.values())
                           ** (1 / len(runs)) - 1) for q in QUANTILES}


def added_ns(runs: dict[str, dict], name: str) -> dict[str, float]:
    """quantile -> what the sampled agent's quantile adds, in ns, on average
    over the attach orders"""
    return {str(q): 1e9 * sum(r[name]["agents"]["sampled"]["quantiles_s"][str(q)]
                              - r[name]["agents"]["every"]["quantiles_s"][str(q)]
                              for r in runs.values()) / len(runs) for q in QUANTILES}


def reference_spread(runs: dict[str, dict], name: str) -> dict[str, float]:
    """quantile -> how far the every-call agent's own quantile moves from one
    attach order to the other, in % of the smaller: what this comparison can
    resolve at best"""
    out = {}
    for q in map(str, QUANTILES):
        a, b = (r[name]["agents"]["every"]["quantiles_s"][q] for r in runs.values())
        out[q] = 100 * (max(a, b) / min(a, b) - 1)
    return out


def same_clock_diffs(same: dict[str, dict], name: str) -> dict[str, float]:
    """quantile -> the sampled histogram's against the full one of the same
    calls, in %"""
    a = same[name]["agents"]
    return {str(q): 100 * (a["audit"]["quantiles_s"][str(q)] / a["audit-full"]["quantiles_s"][str(q)] - 1)
            for q in QUANTILES}


def verdicts(runs: dict[str, dict], same: dict[str, dict]) -> list[tuple[str, str, bool | None]]:
    out = []
    for name in WORKLOADS:
        d, a = same_clock_diffs(same, name), same[name]["agents"]
        out.append((f"{name}, the same calls by the same clock: p50, p90, p99 of the sampled "
                    f"histogram within {TOLERANCE_PCT:g} % of the full one",
                    ", ".join(f"p{float(q) * 100:g} {v:+.2f} %" for q, v in d.items())
                    + f" (count {a['audit']['count']:,.0f} of {a['audit-full']['count']:,.0f} calls)",
                    all(abs(v) <= TOLERANCE_PCT for v in d.values())))
    low = same["low-rate"]["agents"]
    out.append(("low-rate, the same calls by the same clock: every call timed, the sampled histogram "
                "equal to the full one bucket for bucket",
                f"{low['audit']['count']:,.0f} and {low['audit-full']['count']:,.0f} calls, "
                + ("every bucket equal" if low["audit"]["buckets"] == low["audit-full"]["buckets"]
                   else "buckets differ"),
                low["audit"]["buckets"] == low["audit-full"]["buckets"] and low["audit"]["count"] > 0))
    for name in WORKLOADS:
        d, a = diffs(runs, name), added_ns(runs, name)
        out.append((f"{name}, two agents side by side (--latency on beside every; no target: "
                    "each one's window holds the other's programs)",
                    ", ".join(f"p{float(q) * 100:g} {v:+.2f} % ({a[q]:+.0f} ns)" for q, v in d.items()),
                    None))
    out.append(("the floor under those: the every-call agent's own quantiles, one attach order "
                "against the other (no target: what that comparison resolves at best)",
                "; ".join(f"{name} " + ", ".join(f"p{float(q) * 100:g} {v:.1f} %"
                                                 for q, v in reference_spread(runs, name).items())
                          for name in WORKLOADS), None))
    low = [(first, r["low-rate"]["agents"]["sampled"]) for first, r in runs.items()]
    out.append(("low-rate: the agent as deployed (--latency on) timed every call of the workload on "
                "its file's mount (histogram count equal to the requests there)",
                "; ".join(f"{first} attached first: {a['count']:.0f} of {a['requests']:.0f}"
                          for first, a in low),
                all(a["count"] == a["requests"] for _f, a in low)))
    return out


def write_reports(out: Path, res: dict) -> list[tuple[str, str, bool]]:
    out.mkdir(parents=True, exist_ok=True)
    (out / "latency-sampling.json").write_text(json.dumps(res, indent=1) + "\n")
    m, vs = res["machine"], verdicts(res["runs"], res["same_clock"])
    L = ["# Sampled timing against timing every call", "",
         f"{m['date']} at commit {m['tracehound_commit']}, Linux {m['kernel']}, {m['nproc']} × "
         f"{m['cpu']}; fio {m['fio']}; {res['settings']['runtime_s']} s per workload, each in a "
         "cgroup of its own. Regenerate: `python -m bench.latency_sampling`.", "",
         "**Same calls, same clock.** One agent run with `--latency audit` (syscall tracepoint "
         "mode) times every call; the sampler picks as it does with `--latency on`, and only its "
         "picks reach the exported histogram, with their weights, while every call is also counted "
         "once in a histogram the kernel keeps apart (io_audit). The two are of the same calls, "
         "read by the same clock: their difference is the sampling's alone.", "",
         "**Two agents side by side** (the agent as deployed, `--latency on`, beside one with "
         "`--latency every`): both agents attached at once (syscall tracepoint mode), each workload in a cgroup of its "
         "own, run once with each attach order; a quantile's difference is the geometric mean of "
         "the two orders' ratios, and in ns the mean of the two differences. Each agent's window "
         "holds part of the other's programs, and the sampled agent's always hold the dearer "
         "every-call ones: that bias adds a few hundred ns to its quantiles, whatever the "
         "sampling does.", "",
         "## Targets", "", "| target | measured | met |", "|---|---|---|"]
    L += [f"| {t} | {v} | {'–' if ok is None else 'yes' if ok else '**no**'} |" for t, v, ok in vs]
    L += ["", "## Same calls, same clock", "",
          "| workload | fio reads | requests | calls (full count) | sampled count | "
          + " | ".join(f"p{q * 100:g} full / sampled" for q in QUANTILES) + " |",
          "|---|---:|---:|---:|---:|" + "---:|" * len(QUANTILES)]
    for name in WORKLOADS:
        w = res["same_clock"][name]
        full, smp = w["agents"]["audit-full"], w["agents"]["audit"]
        L.append(f"| {name} | {w['fio_reads']:,} | {smp['requests']:,.0f} | {full['count']:,.0f} | "
                 f"{smp['count']:,.0f} | " + " | ".join(
                     f"{full['quantiles_s'][str(q)] * 1e6:.2f} / {smp['quantiles_s'][str(q)] * 1e6:.2f} µs"
                     for q in QUANTILES) + " |")
    L += ["", "## Two agents side by side, per workload", "",
          "| workload | attached first | fio reads | agent | requests | histogram count | reads timed (node) | p50 | p90 | p99 |",
          "|---|---|---:|---|---:|---:|---:|---:|---:|---:|"]
    for name in WORKLOADS:
        for first, run in res["runs"].items():
            w = run[name]
            for k, a in w["agents"].items():
                q = a["quantiles_s"]
                L.append(f"| {name} | {first} | {w['fio_reads']:,} | {k} | {a['requests']:,.0f} | "
                         f"{a['count']:,.0f} | " + ("–" if a["timed"] is None else f"{a['timed']:,.0f}")
                         + " | " + " | ".join(f"{q[str(x)] * 1e6:.2f} µs" for x in QUANTILES) + " |")
    L += ["", "Requests and histograms are the workload cgroup's on its files' mounts (the "
          "tmpfs, and for bimodal the disk's too). The histogram count of the sampled agent is "
          "the sum of its timed calls' weights (each stands for the calls since its CPU's last "
          "timed one); `every` counts each call once. Reads timed are every cgroup's on the node, "
          "background included.", "",
          "![quantiles](latency-sampling.png)", ""]
    (out / "latency-sampling.md").write_text("\n".join(L))
    plot(out / "latency-sampling.png", res)
    return vs


def plot(path: Path, res: dict) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(WORKLOADS), figsize=(4.5 * len(WORKLOADS), 4), squeeze=False)
    # the same calls by one clock first, then the two agents side by side
    bars = [("same clock: full", res["same_clock"], "audit-full", "#147", ""),
            ("same clock: sampled", res["same_clock"], "audit", "#4ad", "")]
    bars += [(f"{k} ({first} first)", res["runs"][first], k, {"every": "#175", "sampled": "#2a7"}[k],
              "" if first == "every" else "//") for first in res["runs"] for k in ("every", "sampled")]
    width = 0.8 / len(bars)
    for ax, name in zip(axes[0], WORKLOADS):
        xs = range(len(QUANTILES))
        for i, (label, runs, k, color, hatch) in enumerate(bars):
            a = runs[name]["agents"][k]
            ax.bar([x + width * i for x in xs], [a["quantiles_s"][str(q)] * 1e6 for q in QUANTILES],
                   width, label=label, color=color, hatch=hatch, edgecolor="k", lw=0.4)
        ax.set_xticks([x + 0.4 - width / 2 for x in xs], [f"p{q * 100:g}" for q in QUANTILES])
        ax.set_yscale("log")
        ax.set_title(name)
        ax.set_ylabel("read latency, µs")
        ax.legend(fontsize=6)
    m = res["machine"]
    fig.suptitle(f"sampled timing vs every call timed — {m['tracehound_commit']}, {m['date'][:10]}, "
                 f"{m['nproc']} × {m['cpu'][:40]}", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.latency_sampling",
                                 description=__doc__.splitlines()[0])
    ap.add_argument("--runtime", type=int, default=6, help="seconds per workload (default 6)")
    ap.add_argument("--out", type=Path, default=REPORT)
    ap.add_argument("--gap", type=int, metavar="MICROSECONDS",
                    help="--latency-sample-gap of the sampled agents (default: the agent's own)")
    args = ap.parse_args()
    if os.geteuid() != 0:
        log("needs root: loads BPF programs")
        return 2
    tmpfs = tempfile.mkdtemp(prefix="tracehound-sampling-")
    disk = tempfile.mkdtemp(prefix="tracehound-sampling-", dir="/var/tmp")
    agents: dict[str, Tool] = {}
    mounted = False
    try:
        subprocess.run(["mount", "-t", "tmpfs", "-o", "size=128m", "bench-sampling", tmpfs], check=True)
        mounted = True
        machine = facts()
        runs, same, cmds = {}, {}, {}
        # the same calls by the same clock: one agent, --latency audit
        agents = {"audit": agent("audit", LATENCY["audit"], args.gap)}
        agents["audit"].start()
        cmds["audit"] = agents["audit"].cmd
        for name in WORKLOADS:
            log(f"{name}, one agent with --latency audit: {args.runtime} s")
            same[name] = run_workload(name, agents, tmpfs, disk, args.runtime)
        agents["audit"].stop()
        for order in ORDERS:
            agents = {k: agent(k, LATENCY[k], args.gap) for k in order}
            for t in agents.values():      # attached in this order
                t.start()
                cmds[t.name] = t.cmd
            runs[order[0]] = {}
            for name in WORKLOADS:
                log(f"{name}, {order[0]} attached first: {args.runtime} s")
                runs[order[0]][name] = run_workload(name, agents, tmpfs, disk, args.runtime)
            for t in agents.values():
                t.stop()
        res = {"settings": {"runtime_s": args.runtime, "tolerance_pct": TOLERANCE_PCT, "gap_us": args.gap,
                            "low_rate_iops": LOW_RATE_IOPS,
                            "agents": cmds},
               "machine": machine, "same_clock": same, "runs": runs}
        for t, v, ok in write_reports(args.out, res):
            log(f"{verdict(ok)} {t}: {v}")
        log(f"report in {args.out}/latency-sampling.md")
        return 0
    finally:
        for t in agents.values():
            t.stop()
        if mounted:
            subprocess.run(["umount", tmpfs], check=False)
        os.rmdir(tmpfs)
        subprocess.run(["rm", "-rf", disk], check=False)


if __name__ == "__main__":
    sys.exit(main())
