#!/usr/bin/env python3
"""Overhead of the tracehound agent on page-cache I/O (tmpfs): 4 KiB random
reads, the cheapest I/O syscall there is, and sequential 1 MiB reads and
writes, the checkpoint / data-loader pattern. Next to no tracing, to empty
hooks (the floor of any syscall-level probe) and to an equivalent bpftrace
script. Run as root:  python -m bench.overhead [--quick]

Two phases:
  throughput  fio per workload and condition, conditions interleaved over
              rounds so drift and neighbours' noise hit every condition
              alike; BPF run statistics are off (they cost time themselves)
  cost        with BPF run-time statistics on, over --cost-rounds rounds
              (one fresh start of each tool per round, in an order rotated
              every round): run_time_ns and run_cnt of the tool's own
              programs, delta over each fio run; a net is taken against the
              empty hooks of the same round
"""
from __future__ import annotations

import argparse
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import urllib.request
from pathlib import Path

from bench.common import REPO, REPORT, log, verdict
from bench.overhead.report import CONDITIONS, WORKLOADS, write_reports
from bench.overhead.tools import (agent_has_option, enable_stats, facts, fio_cmd, mount_id_of,
                                  mount_offset, pool_rounds, prog_stats, run_fio, stats_delta,
                                  summarize, tree_env)
from bench.tracer import Tool

from tracehound.terminal_progress import steps

AGENT = [str(REPO / ".venv/bin/tracehound"), "run", "--listen", "127.0.0.1:0"]
BT_SCRIPT = REPO / "bench" / "baseline.bt"
STATS_SYSCTL = Path("/proc/sys/kernel/bpf_stats_enabled")
# Empty tp_btf programs on every syscall: the dispatch floor of the
# tracepoint mode, and what bpf_stats reports for doing nothing.
EMPTY = [str(REPO / ".venv/bin/python"), "-m", "bench.overhead.empty_hooks"]
LATENCY_OFF = ["--latency", "off"]
LATENCY_EVERY = ["--latency", "every"]
GAP_1S = ["--latency-sample-gap", "1000000"]
# seconds a round spends outside fio, measured on the reference VM: fio's own
# start per run, and starting plus stopping each tracer
FIO_START_S = 0.3
TOOL_START_S = {"tracehound": 1.8, "tracehound-every": 1.8, "tracehound-latoff": 1.8,
                "tracehound-gap1s": 1.8, "empty": 0.8, "empty-exit": 0.8, "bpftrace": 3.5}


def stats_sysctl_on() -> bool:
    return STATS_SYSCTL.read_text().strip() != "0"


# ---- phases ------------------------------------------------------------------

def throughput(args, conds: list[str], tools: dict[str, Tool | None],
               fio: dict[str, list[str]]) -> tuple[dict, int]:
    """Per workload, the summary of every condition's rounds; and in how many
    fio runs kernel.bpf_stats_enabled was on, which slows the BPF conditions.
    Left as it is, only noted: other tools on the machine may rely on it."""
    wls = list(fio)
    iops = {w: {c: [] for c in conds} for w in wls}
    stats_on = 0
    with steps(args.rounds * len(conds), "throughput") as bar:
        for r in range(args.rounds):
            # rotate the order each round so no condition always runs first,
            # and no workload always runs right after a tracer started
            k = r % len(conds)
            order = wls[r % len(wls):] + wls[:r % len(wls)]
            for cond in conds[k:] + conds[:k]:
                tool = tools[cond]
                if tool:
                    tool.start()
                try:
                    for w in order:
                        on = stats_sysctl_on()
                        res = run_fio(fio[w], WORKLOADS[w]["dir"])
                        if tool:
                            tool.check_alive()
                        iops[w][cond].append(res["iops"])
                        stats_on += on or stats_sysctl_on()
                finally:
                    if tool:
                        tool.stop()
                bar.advance(f"round {r + 1}/{args.rounds} {cond:<17} " +
                            " ".join(f"{w} {iops[w][cond][-1]:,.0f}" for w in wls))
    return {w: summarize(iops[w]) for w in wls}, stats_on


def cost(tool: Tool, fio: dict[str, list[str]], tmp: str, mnt_id: int) -> dict:
    """One fresh start of the tool, every workload under it, run statistics
    around each fio run only."""
    per, done = {}, {"read": 0, "write": 0}
    tool.start()
    try:
        for w, cmd in fio.items():
            d = WORKLOADS[w]["dir"]
            before = prog_stats(tool.prog_ids)
            res = run_fio(cmd, d)
            after = prog_stats(tool.prog_ids)
            tool.check_alive()
            progs = stats_delta(before, after)
            total = sum(p["run_time_ns"] for p in progs)
            per[w] = {"fio": res, "programs": progs, "total_run_time_ns": total,
                      "program_runs": sum(p["run_cnt"] for p in progs),
                      "ns_per_io": total / res["total_ios"]}
            if per[w]["program_runs"] < res["total_ios"]:
                raise RuntimeError(f"{tool.name}: {per[w]['program_runs']} program runs for "
                                   f"{res['total_ios']} I/Os in {w}: BPF stats were not counting")
            done[d] += res["total_ios"]
        counted = agent_counts(tool, tmp)
    finally:
        tool.stop()
    if tool.name == "bpftrace":
        counted = {d: sum(int(n) for m, n in re.findall(rf"^@calls\[\d+, (\d+), {op}\]: (\d+)",
                                                         "\n".join(tool.lines), re.M) if int(m) == mnt_id)
                   for op, d in enumerate(("read", "write"))}
    return {"programs": len(tool.prog_ids), "workloads": per, "fio_ios": done, "counted": counted}


def agent_counts(tool: Tool, mountpoint: str) -> dict | None:
    """Reads and writes the agent attributed to the benchmark mount: proof
    that the measured configuration really accounted fio's I/O."""
    if not tool.name.startswith("tracehound") or not tool.url():
        return None
    text = urllib.request.urlopen(tool.url(), timeout=10).read().decode()
    out = {"read": 0, "write": 0}
    for line in text.splitlines():
        m = re.match(r"tracehound_io_(read|write)_(?:requests|calls)_total\{", line)
        if m and f'mountpoint="{mountpoint}"' in line:
            out[m.group(1)] += int(float(line.rsplit(" ", 1)[1]))
    return out


def lay_out(path: str, size_mib: int, random: bool) -> None:
    # the write workload's file exists at full size before the first round,
    # so every round overwrites pages in place instead of allocating them
    with open(path, "wb") as fh:
        for _ in range(size_mib):
            fh.write(os.urandom(1 << 20) if random else bytes(1 << 20))


def estimate_s(args, conds: list[str], wls: list[str]) -> float:
    fio_s = sum(args.runtime if w == "randread-4k" else args.seq_runtime for w in wls) \
        + FIO_START_S * len(wls)
    starts = sum(TOOL_START_S.get(c, 0) for c in conds)
    return (args.rounds * (len(conds) * fio_s + starts)
            + args.cost_rounds * ((len(conds) - 1) * fio_s + starts) + starts + 5)


# ---- main --------------------------------------------------------------------

def main() -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.overhead",
                                 description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="2 rounds of 2 s and 1 s (smoke test)")
    ap.add_argument("--hook-mode", default="auto", choices=["auto", "fentry", "kprobe", "tracepoint"])
    ap.add_argument("--out", type=Path, default=REPORT)
    ap.add_argument("--rounds", type=int, help="interleaved rounds (default 5, quick 2)")
    ap.add_argument("--cost-rounds", type=int,
                    help="rounds of the cost phase, each a fresh start of every tool (default 3, quick 1)")
    ap.add_argument("--runtime", type=int, help="seconds per 4 KiB fio run (default 4, quick 2)")
    ap.add_argument("--seq-runtime", type=int, help="seconds per 1 MiB fio run (default 3, quick 1)")
    ap.add_argument("--workloads", default=",".join(WORKLOADS),
                    help=f"comma-separated subset of {','.join(WORKLOADS)} (default: all)")
    ap.add_argument("--size-mib", type=int, default=256, help="size of each file on the tmpfs")
    ap.add_argument("--cpu", type=int, help="CPU to pin fio to (default: the last one)")
    args = ap.parse_args()
    args.rounds = args.rounds or (2 if args.quick else 5)
    args.cost_rounds = args.cost_rounds or (1 if args.quick else 3)
    if args.rounds < 1 or args.cost_rounds < 1:
        sys.exit("--rounds and --cost-rounds: 1 or more")
    args.runtime = args.runtime or (2 if args.quick else 4)
    args.seq_runtime = args.seq_runtime or (1 if args.quick else 3)
    wls = [w for w in WORKLOADS if w in args.workloads.split(",")]
    if not wls or set(args.workloads.split(",")) - set(WORKLOADS):
        sys.exit(f"--workloads: pick from {','.join(WORKLOADS)}")
    if args.cpu is None and (os.cpu_count() or 1) > 1:
        args.cpu = os.cpu_count() - 1  # CPU 0 takes most interrupts and housekeeping
    if os.geteuid() != 0:
        sys.exit("run as root: loading BPF and mounting tmpfs need it")
    for exe in ("fio", "bpftrace", "bpftool"):
        if not shutil.which(exe):
            sys.exit(f"{exe} not found")

    # SIGTERM/SIGHUP unwind through the finally blocks like Ctrl-C does
    def bail(signum, _frame):
        raise KeyboardInterrupt(f"signal {signum}")
    signal.signal(signal.SIGTERM, bail)
    signal.signal(signal.SIGHUP, bail)

    latency_off = agent_has_option(AGENT, "--latency")
    every = latency_off       # this tree has both
    gap = agent_has_option(AGENT, "--latency-sample-gap")
    conds = [c for c in CONDITIONS if (c != "tracehound-latoff" or latency_off)
             and (c != "tracehound-every" or every) and (c != "tracehound-gap1s" or gap)]
    if not latency_off:
        log("`tracehound run --help` lists no --latency: the latency-off condition is left out")
    stats_fd = None
    tmp = tempfile.mkdtemp(prefix="tracehound-bench-")
    tools: dict[str, Tool | None] = {"baseline": None}
    mounted = False
    try:
        subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={2 * args.size_mib + 64}m,mode=0700",
                        "tracehound-bench", tmp], check=True)
        mounted = True
        files = {"read": f"{tmp}/data", "write": f"{tmp}/wdata"}
        log(f"laying out {args.size_mib} MiB per file on tmpfs {tmp}")
        for d in sorted({WORKLOADS[w]["dir"] for w in wls}):
            lay_out(files[d], args.size_mib, random=d == "read")
        offset = mount_offset()
        bt_cmd = ["bpftrace", "-B", "none", str(BT_SCRIPT), str(offset)]
        agent_cmd = AGENT + ["--hook-mode", args.hook_mode]
        env = tree_env()
        tools["tracehound"] = Tool("tracehound", agent_cmd, r"serving metrics on", signal.SIGTERM, env)
        if every:
            tools["tracehound-every"] = Tool("tracehound-every", agent_cmd + LATENCY_EVERY,
                                             r"serving metrics on", signal.SIGTERM, env)
        if latency_off:
            tools["tracehound-latoff"] = Tool("tracehound-latoff", agent_cmd + LATENCY_OFF,
                                              r"serving metrics on", signal.SIGTERM, env)
        if gap:
            tools["tracehound-gap1s"] = Tool("tracehound-gap1s", agent_cmd + GAP_1S,
                                             r"serving metrics on", signal.SIGTERM, env)
        tools["empty"] = Tool("empty", EMPTY, r"attached \d+ empty programs", signal.SIGINT, env,
                              cwd=REPO)
        tools["empty-exit"] = Tool("empty-exit", EMPTY + ["--exit-only"], r"attached \d+ empty programs",
                                   signal.SIGINT, env, cwd=REPO)
        tools["bpftrace"] = Tool("bpftrace", bt_cmd, r"Attaching \d+ probes", signal.SIGINT)
        fio = {w: fio_cmd(w, WORKLOADS[w], files[WORKLOADS[w]["dir"]], args.size_mib,
                          args.runtime if w == "randread-4k" else args.seq_runtime, args.cpu)
               for w in wls}
        machine = facts()

        for name in conds[1:]:  # fail early, and show what attached
            t = tools[name]
            t.start()
            t.stop()
            log(f"{name}: {len(t.prog_ids)} BPF programs; " +
                "; ".join(l.strip() for l in t.lines if re.search(r"probe io\.|Attaching|attached", l)))
        agent_modes = {n: [re.sub(r"\s+", " ", l.split("tracehound: ")[-1])
                           for l in tools[n].lines if "probe io." in l]
                       for n in conds if n.startswith("tracehound")}
        log(f"throughput: {args.rounds} rounds x {len(conds)} conditions x {len(wls)} workloads "
            f"({args.runtime} s at 4 KiB, {args.seq_runtime} s at 1 MiB); whole run about "
            f"{estimate_s(args, conds, wls) / 60:.0f} min")
        tp, stats_on = throughput(args, conds, tools, fio)
        if stats_on:
            log(f"kernel.bpf_stats_enabled was on during {stats_on} throughput runs")
        for w in wls:
            log(f"{w}: " + ", ".join(f"{c} {tp[w][c]['loss_pct']:+.2f} %" for c in conds[1:]) +
                f" (baseline rounds -{tp[w]['baseline']['noise_down_pct']:.2f}"
                f"/+{tp[w]['baseline']['noise_up_pct']:.2f} %)")

        log(f"per-event cost with BPF run-time statistics on, {args.cost_rounds} round(s)")
        stats_fd = enable_stats()
        mnt_id = mount_id_of(tmp)
        runs: dict[str, list[dict]] = {name: [] for name in conds[1:]}
        for r in range(args.cost_rounds):
            order = conds[1:][r % len(runs):] + conds[1:][:r % len(runs)]
            for name in order:
                runs[name].append(c := cost(tools[name], fio, tmp, mnt_id))
                log(f"cost round {r + 1}/{args.cost_rounds}, {name}: " + ", ".join(
                    f"{w} {c['workloads'][w]['ns_per_io']:.1f}" for w in wls) +
                    " ns per I/O syscall" + ("" if c["counted"] is None else
                    "; counted " + ", ".join(f"{c['counted'][d]} of fio's {n} {d}s"
                                             for d, n in c["fio_ios"].items() if n)))
        cs = {name: pool_rounds(rs) for name, rs in runs.items()}
        os.close(stats_fd)
        stats_fd = None
        machine["loadavg_end"] = Path("/proc/loadavg").read_text().split()[:3]

        res = {"settings": {"quick": args.quick, "rounds": args.rounds, "runtime_s": args.runtime,
                            "seq_runtime_s": args.seq_runtime, "size_mib": args.size_mib,
                            "cost_rounds": args.cost_rounds,
                            "cpu": args.cpu, "hook_mode": args.hook_mode, "workloads": wls,
                            "conditions": conds, "latency_off": latency_off,
                            "stats_on_during_throughput": stats_on},
               "machine": machine, "agent_modes": agent_modes,
               "commands": {**{f"fio {w}": c for w, c in fio.items()},
                            **{n: tools[n].cmd for n in conds[1:]}},
               "throughput": tp, "cost": cs}
        for t, m, ok in write_reports(args.out, res):
            log(f"{verdict(ok)} {t}: {m}")
        log(f"report in {args.out}/overhead.md")
        return 0
    finally:
        for t in tools.values():
            if t:
                t.stop()
        if stats_fd is not None:
            os.close(stats_fd)
        if mounted:
            subprocess.run(["umount", tmp], check=False)
        try:
            os.rmdir(tmp)
        except OSError as e:
            log(f"left {tmp} behind: {e}")


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt as e:
        log(f"interrupted ({e or 'SIGINT'}); tracers stopped, tmpfs unmounted")
        sys.exit(130)
    except (RuntimeError, subprocess.CalledProcessError) as e:
        log(f"failed: {e}")
        sys.exit(1)
