"""Every benchmark of bench/, by name, and the state of its report.

  bench/run list                 each benchmark: what it measures, what it needs, its report
  bench/run status               each report's commit and date as stamped in it, against HEAD
  bench/run NAME [ARGS...]       one benchmark, ARGS passed on (its own --help says which)
  bench/run all [--skip A,B] [--only A,B]
                                 every benchmark this machine can run (or those named), one
                                 after the other, at one commit (refused with uncommitted
                                 changes); writes bench/report/run.md and run.json: what ran,
                                 for how long, what did not and why; a part run at the same
                                 commit as the last adds to their list

bench/run is `python -m bench` from the repository root, with the tree's .venv/bin/python
where there is one; run it as root. A benchmark runs there as `python -m bench.FOLDER` (its
folder in bench/, the name with underscores), with src/ first on PYTHONPATH: it imports this
checkout's tracehound, not the venv's installed copy, which may lag behind.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from bench.common import REPO, REPORT, commit, log, stamp


@dataclass(frozen=True)
class Benchmark:
    name: str
    script: str            # its folder in bench/: python -m bench.SCRIPT
    reports: tuple[str, ...]   # in bench/report/, without .md/.json/.png
    needs: tuple[str, ...]
    measures: str
    args: tuple[str, ...] = ()     # what `all` passes
    # further runs `all` makes, each with these arguments after ARGS (a second
    # case written to a report of its own)
    also: tuple[tuple[str, ...], ...] = ()


BENCHMARKS = (
    Benchmark("overhead", "overhead", ("overhead",), ("root", "fio", "bpftrace"),
              "fio on page-cache I/O: baseline, the agent (sampled, every call, latency off), "
              "the two-empty-hook floor and bpftrace, interleaved rounds"),
    Benchmark("hotpath-parts", "hotpath_parts", ("hotpath-parts", "hotpath-parts-vm"), ("root",),
              "what each building block of the I/O probe's per-event path costs, on this host "
              "and in the VM tier's guest", ("--with-vm",)),
    Benchmark("latency-sampling", "latency_sampling", ("latency-sampling",), ("root", "fio", "bpftool"),
              "sampled latency histograms against timing every call, same calls, p50/p90/p99"),
    Benchmark("accuracy", "accuracy", ("accuracy",), ("root", "fio"),
              "the I/O byte counters over time against fio's own, per phase"),
    Benchmark("scrape", "scrape", ("scrape", "busy-node/scrape"), ("root",),
              "one Prometheus scrape's cost as cgroups and mounts grow, against a baseline "
              "revision; then a busy node (3,000 cgroups doing real I/O on two mounts) with the "
              "defaults and with the histograms kept per label set or per mount",
              also=(("--sizes", "3000x2", "--no-fill", "--no-baseline", "--histograms",
                     "cgroup-mount,mount", "--out", "bench/report/busy-node"),)),
    Benchmark("parse-exposition", "parse_exposition", (), (),
              "reading a 5 MB exposition: prometheus_client's parser against the agent's own "
              "(prints its figures)"),
    Benchmark("protobuf-encoding", "protobuf_encoding", ("protobuf-encoding",), (),
              "one scrape in the protobuf format: the hand-written encoder against "
              "google.protobuf's (upb) message classes"),
    Benchmark("jsonpath", "jsonpath", ("jsonpath",), ("py:jsonpath_ng",),
              "chaos tolerances' JSON paths: chaos/jsonpath.py against jsonpath-ng, answers "
              "and time"),
    Benchmark("slow-clients", "slow_clients", ("slow-clients",), ("root",),
              "the exporter under clients that read slowly or not at all"),
    Benchmark("http-server", "http_server", ("http-server",), ("root",),
              "the agent's HTTP server against prometheus_client's own server, same registry, "
              "same run: scrape time alone and beside slow clients"),
    Benchmark("net-cost", "net_cost", ("net_cost",), ("root",),
              "what the net subsystem adds to connects and to a lossy bulk transfer"),
    Benchmark("async-cost", "async_cost", ("async_cost",), ("root", "fio"),
              "what counting io_uring, AIO and copies costs"),
    Benchmark("uprobe-cost", "uprobe_cost", ("uprobe-cost",), ("root",),
              "the application view's uprobes on a verb, natively"),
    Benchmark("detection", "detection", ("detection",), ("root", "stress-ng", "prometheus"),
              "how fast tracehound sees each fault of the chaos catalog (MTTD)"),
    Benchmark("soak", "soak", ("soak",), ("root",),
              "false alarms on a busy, healthy node"),
    Benchmark("vm-modes", "vm_modes", ("vm-modes",), ("root", "vm"),
              "per-event cost of fentry, kprobe and tracepoint modes beside CEEMS, in the VM"),
    Benchmark("rdma-verbs", "rdma_verbs", ("rdma-verbs",), ("root", "vm"),
              "what the RDMA probe adds to control-path verbs on soft-RoCE"),
    Benchmark("explain", "explain", ("explain",), ("root", "slurm"),
              "explain's accuracy: each fault's true cause first, 0 findings on clean jobs, "
              "precision and recall; answer time for a job on 4 nodes"),
    Benchmark("explain-vm", "explain_vm", ("explain-vm",), ("root", "vm"),
              "explain's rank of the true cause for the faults only the VM makes (EIO from a "
              "device-mapper disk, RDMA memlock on soft-RoCE), node mode, and its answer time"),
    Benchmark("health-drain", "health_drain", ("health-drain",), ("root", "slurm"),
              "fault to drain (kernel-log line to slurmctld's DRAIN) at 20 and 100 nodes against "
              "HealthCheckInterval, and the breaker's worst instant when every node fails"),
    Benchmark("fleet-cost", "fleet_cost", ("fleet-cost",), ("root", "prometheus"),
              "one GPU node's samples from a real agent (a job of 8 tasks on 5 mounts), then a "
              "real Prometheus holding 100, 1,000 and 2,000 such nodes: head series, memory, "
              "new series per job, explain's time for a job on 16 and 256 nodes"),
    Benchmark("gpu", "gpu", ("gpu",), ("root", "gpu"),
              "the GPU tier, the GPU faults and the exported values against nvidia-smi"),
)
BY_NAME = {b.name: b for b in BENCHMARKS}


def missing(need: str) -> str | None:
    """Why this machine lacks NEED, or None."""
    if need == "root":
        return None if os.geteuid() == 0 else "not root"
    if need == "vm":
        return None if shutil.which("vng") and Path("/var/cache/tracehound/vm").is_dir() \
            else "no virtme-ng guest (scripts/vm-setup)"
    if need == "slurm":
        return None if shutil.which("slurmctld") or Path("/usr/sbin/slurmctld").exists() \
            else "no slurmctld"
    if need == "gpu":
        try:
            ok = subprocess.run(["nvidia-smi", "-L"], capture_output=True,
                                timeout=30).returncode == 0
        except (OSError, subprocess.TimeoutExpired):
            ok = False
        return None if ok else "no NVIDIA GPU"
    if need.startswith("py:"):
        module = need[3:]
        found = subprocess.run([python(), "-c", f"import {module}"], capture_output=True)
        return None if found.returncode == 0 else f"no Python module {module} in the tree's venv"
    return None if shutil.which(need) else f"no {need}"


def python() -> str:
    venv = REPO / ".venv" / "bin" / "python"
    return str(venv) if venv.exists() else sys.executable


# a target's line as bench.common.log(verdict(ok) + ...) prints it
VERDICT_LINE = re.compile(r"^\[\d\d:\d\d:\d\d\] (MET |MISS|n/a ) (.*)$")


def run_one(bench: Benchmark, extra: list[str], verdicts: list[str] | None = None) -> int:
    """Run one benchmark; with VERDICTS, its stdout passes through here and
    every target line it prints is kept there too."""
    # the benchmark measures this checkout: src/ before the venv's installed copy
    path = os.pathsep.join(p for p in (str(REPO / "src"), os.environ.get("PYTHONPATH")) if p)
    cmd = [python(), "-m", f"bench.{bench.script}", *bench.args, *extra]
    env = dict(os.environ, PYTHONPATH=path)
    if verdicts is None:
        return subprocess.run(cmd, cwd=REPO, env=env).returncode
    with subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, text=True,
                          errors="replace", bufsize=1) as proc:
        for line in proc.stdout:
            sys.stdout.write(line)
            sys.stdout.flush()
            if m := VERDICT_LINE.match(line.rstrip("\n")):
                verdicts.append(f"{m.group(1).strip()} {m.group(2)}")
    return proc.returncode


def stamped(data, keys: tuple[str, ...]) -> str | None:
    """The first of KEYS a report's JSON holds as a string, wherever its
    writer put it (top level first)."""
    if isinstance(data, dict):
        for key in keys:
            if isinstance(data.get(key), str):
                return data[key]
        for value in data.values():
            found = stamped(value, keys)
            if found:
                return found
    return None


def status() -> int:
    head = commit()
    print(f"HEAD: {head}")
    for bench in BENCHMARKS:
        for report in bench.reports:
            # a benchmark of several tiers writes report-TIER.json
            candidates = [REPORT / f"{report}.json", *sorted(REPORT.glob(f"{report}-*.json"))]
            path = next((p for p in candidates if p.exists()), None)
            if path is None:
                print(f"  {report:18} no JSON report")
                continue
            try:
                data = json.loads(path.read_text())
            except ValueError:
                print(f"  {report:18} unreadable JSON")
                continue
            at = stamped(data, ("commit", "tracehound_commit", "agent_revision")) or "no commit"
            when = stamped(data, ("date", "started", "measured", "when")) or "no date"
            # stamps abbreviate the hash to different lengths: same commit if one starts the other
            a, h = at.split()[0] if at.split() else "", head.split()[0]
            mark = "" if a and (a.startswith(h) or h.startswith(a)) and "uncommitted" not in at \
                else "  (another commit)"
            print(f"  {report:18} {at:40} {when[:19]}{mark}")
    return 0


def run_all(skip: set[str], only: set[str] | None = None) -> int:
    """Every benchmark this machine can run (those of ONLY, when given), one
    after the other. run.json and run.md list them; a run at the same commit
    as the last one adds to its list, so that a full set can be measured in
    parts, each at that one commit."""
    head = commit()
    if "uncommitted" in head or head.startswith("unknown"):
        print(f"bench/run all: the tree is at {head}; commit first, so that every report "
              "is of one commit", file=sys.stderr)
        return 2
    results, failed = [], 0
    for bench in BENCHMARKS:
        if only is not None and bench.name not in only:
            continue
        why = "skipped (--skip)" if bench.name in skip else \
            next((w for w in map(missing, bench.needs) if w), None)
        if why:
            log(f"{bench.name}: not run: {why}")
            results.append({"name": bench.name, "ran": False, "why": why})
            continue
        log(f"{bench.name}: running python -m bench.{bench.script}")
        started, date, verdicts = time.monotonic(), stamp()["date"], []
        rc = run_one(bench, [], verdicts)
        for extra in bench.also:
            log(f"{bench.name}: again, with {' '.join(extra)}")
            rc = max(rc, run_one(bench, list(extra), verdicts))
        seconds = round(time.monotonic() - started, 1)
        failed += rc != 0
        log(f"{bench.name}: exit {rc} after {seconds} s")
        results.append({"name": bench.name, "ran": True, "rc": rc, "seconds": seconds,
                        "started": date, "reports": list(bench.reports), "targets": verdicts})
    run = {"stamp": stamp(), "benchmarks": results}
    REPORT.mkdir(parents=True, exist_ok=True)
    try:
        last = json.loads((REPORT / "run.json").read_text())
    except (OSError, ValueError):
        last = {}
    if last.get("stamp", {}).get("commit") == run["stamp"]["commit"]:
        now = {r["name"] for r in results}
        run["benchmarks"] = [r for r in last["benchmarks"] if r["name"] not in now] + results
        order = {b.name: i for i, b in enumerate(BENCHMARKS)}
        run["benchmarks"].sort(key=lambda r: order.get(r["name"], len(order)))
    (REPORT / "run.json").write_text(json.dumps(run, indent=2) + "\n")
    ran = [r for r in run["benchmarks"] if r["ran"]]
    lines = [f"# bench/run all at {run['stamp']['commit']}", "",
             f"{run['stamp']['machine']}; list written {run['stamp']['date']}; "
             f"{sum(r['seconds'] for r in ran) / 60:.0f} min of benchmarks in all.", "",
             "| benchmark | result | seconds | started |", "|---|---|---:|---|"]
    for r in run["benchmarks"]:
        lines.append(f"| {r['name']} | " + (f"exit {r['rc']} | {r['seconds']} | {r.get('started', '')}"
                                            if r["ran"] else f"not run: {r['why']} | | ") + " |")
    lines += ["", "## Targets, as each benchmark printed them", "",
              "MET, MISS, or n/a (not measured in this run); the figures behind each are in its report."]
    for r in run["benchmarks"]:
        if r["ran"]:
            lines += ["", f"**{r['name']}** ({', '.join(f'[{n}]({n}.md)' for n in r['reports'])})", ""]
            lines += [f"- {t}" for t in r.get("targets", [])] or ["- (no target lines printed)"]
    (REPORT / "run.md").write_text("\n".join(lines) + "\n")
    return 1 if failed else 0


def main(argv: list[str]) -> int:
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__)
        return 0 if argv else 2
    what, rest = argv[0], argv[1:]
    if what == "list":
        for b in BENCHMARKS:
            print(f"{b.name:18} {b.script:22} needs {', '.join(b.needs)}\n{'':18} {b.measures}")
        return 0
    if what == "status":
        return status()
    if what == "all":
        opts: dict[str, set[str]] = {}
        while rest[:1] in (["--skip"], ["--only"]) and len(rest) >= 2:
            opts[rest[0]] = set(rest[1].split(","))
            rest = rest[2:]
        if rest:
            print("bench/run all takes only --skip NAME,NAME and --only NAME,NAME",
                  file=sys.stderr)
            return 2
        unknown = set().union(*opts.values()) - set(BY_NAME)
        if unknown:
            print(f"bench/run: no benchmark named {', '.join(sorted(unknown))}", file=sys.stderr)
            return 2
        return run_all(opts.get("--skip", set()), opts.get("--only"))
    bench = BY_NAME.get(what)
    if bench is None:
        print(f"bench/run: no benchmark named {what!r}; bench/run list names them",
              file=sys.stderr)
        return 2
    return run_one(bench, rest)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
