#!/usr/bin/env python3
"""Per-event cost of the I/O probe's hook modes next to its peers, inside
Debian's 6.1 kernel under virtme-ng (emulated, no KVM). Run as root after
scripts/vm-setup:

    python -m bench.vm_modes            # 12-14 min, writes bench/report/vm-modes.{md,json,png}
    python -m bench.vm_modes --quick    # one round of 1 s runs, 5-8 min: smoke test only

One VM run compares, on the same fio workloads on a tmpfs: tracehound in each
hook mode (latency histograms on, and off where `tracehound run` has
`--latency`), empty programs on the same hooks (the floor), bpftrace with
bench/baseline.bt, and CEEMS's own VFS programs, built from their source with
their own Makefile. The first round(s) of each condition (--cost-rounds)
measure BPF run time with kernel.bpf_stats_enabled=1; every round measures
throughput with it off, conditions interleaved and the order rotated.
Emulation inflates every absolute number, so the report gives ratios only.

The host builds the probes and CEEMS's objects, boots the VM and writes the
report; the guest part runs this module with --guest, and the empty and CEEMS
programs are held by this module run with --hold.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.common import REPORT, commit, log, verdict
from bench.vm_modes.ceems import build_ceems, hold
from bench.vm_modes.common import MODES, REPO, WORKLOADS
from bench.vm_modes.guest import guest

# rough seconds to start and stop each kind under TCG on a 2-CPU host, for the estimate only
START_S = {"th": 14, "bpftrace": 40, "hold": 7}


def estimate_s(s: dict) -> float:
    n_th = (6 + s["gap_flag"] if s["latency_flag"] else 3) if s["conditions"] is None else \
        sum(c.startswith("th-") for c in s["conditions"])
    starts = n_th * START_S["th"] + START_S["bpftrace"] + 3 * START_S["hold"]
    tput = (n_th + 5) * (len(s["workloads"]) * s["runtime"] + 2)
    cost = s["cost_rounds"] * (n_th + 4) * len(s["workloads"]) * (s["window"] + 2.5) + n_th * 4
    return 60 + s["rounds"] * (starts + tput) + cost


def host(args) -> int:
    from bench.vm_modes.report import write_reports
    from testbed import vm as harness
    if os.geteuid() != 0:
        sys.exit("run as root: the VM is booted with the host's root file system")
    if (why := harness.is_available()):
        sys.exit(why)
    src = args.tree.resolve() / "src"
    log(f"building the probes (make -C {src}/tracehound/probes)")
    subprocess.run(["make", "-s", "-C", str(src / "tracehound/probes")], check=True)
    load_start = Path("/proc/loadavg").read_text().split()[:3]
    xdir = Path(tempfile.mkdtemp(prefix="vm-modes-"))
    try:
        ceems = build_ceems(args.ceems_src, xdir / "ceems")
        log("CEEMS: " + (ceems.get("make", "") + ", " + ceems.get("clang", "") if "objs" in ceems
                         else ceems["note"]))
        # asked here, where Python starts in a second rather than a minute
        helptext = subprocess.run([sys.executable, "-m", "tracehound", "run", "--help"], capture_output=True,
                                  text=True, env=dict(os.environ, PYTHONPATH=str(src))).stdout
        settings = {"tree": str(args.tree.resolve()), "quick": args.quick, "rounds": args.rounds,
                    "cost_rounds": args.cost_rounds, "runtime": args.runtime, "window": args.window,
                    "latency_flag": re.search(r"--latency(?![\w-])", helptext) is not None,
                    "gap_flag": "--latency-sample-gap" in helptext,
                    "size_mib": args.size_mib, "workloads": args.workloads,
                    "conditions": args.conditions, "ceems": ceems}
        (xdir / "settings.json").write_text(json.dumps(settings))
        log(f"booting the VM; expect about {estimate_s(settings) / 60:.0f} min")
        t0 = time.monotonic()
        try:
            # the guest starts in the repository root (cwd), where -m finds the package
            r = harness.run_in_vm(f"{shlex.quote(sys.executable)} -m bench.vm_modes --guest {xdir}",
                                  timeout=args.vm_timeout, cwd=REPO, writable=[xdir],
                                  env={"PYTHONPATH": str(src)}, stream=sys.stdout)
            vm = {"kernel": r.kernel_release, "exit": r.returncode, "boot_s": round(r.boot_seconds, 1)}
        except harness.VmBootError as e:  # what the guest saved so far still makes a report
            log(f"the VM failed: {str(e)[:2000]}")
            vm = {"exit": None, "failed": str(e).splitlines()[0]}
        vm["total_s"] = round(time.monotonic() - t0, 1)
        if not (xdir / "results.json").exists():
            sys.exit("vm-modes: the guest wrote no results")
        res = json.loads((xdir / "results.json").read_text())
        res["vm"] = vm
        res["host"] = {"kernel": platform.release(), "nproc": os.cpu_count(), "loadavg_start": load_start,
                       "loadavg_end": Path("/proc/loadavg").read_text().split()[:3],
                       "commit": commit(args.tree)}
        for what, msg, ok in write_reports(args.out, res):
            log(f"{verdict(ok)} {what}: {msg}")
        log(f"report in {args.out}/vm-modes.md; VM {vm['total_s'] / 60:.1f} min")
        return 0 if vm["exit"] == 0 else 1
    finally:
        shutil.rmtree(xdir, ignore_errors=True)


def main() -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.vm_modes",
                                 description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="1 round, 1 s windows, 32 MiB files (smoke test)")
    ap.add_argument("--rounds", type=int, help="interleaved throughput rounds (default 3, quick 1)")
    ap.add_argument("--runtime", type=int, help="seconds per workload in a throughput run (default 1)")
    ap.add_argument("--window", type=float, help="seconds of steady-state fio per workload over which "
                    "bpf_stats are taken (default 1.5, quick 1)")
    ap.add_argument("--cost-rounds", type=int, default=3,
                    help="rounds that also measure BPF cost; the median run is reported (default 3: "
                         "one run of the emulated guest strays by 10 %% and more; quick 1)")
    ap.add_argument("--size-mib", type=int, help="size of each file on the tmpfs (default 64, quick 32)")
    ap.add_argument("--workloads", default=",".join(WORKLOADS),
                    help=f"comma-separated, from {', '.join(WORKLOADS)} (default: all)")
    ap.add_argument("--conditions", help="comma-separated subset (default: all): th-fentry, th-kprobe, "
                    "th-tracepoint, th-MODE-nolat, th-fentry-gap1s, empty-tp, empty-fentry, bpftrace, ceems")
    ap.add_argument("--ceems-src", type=Path, default=REPO.parent / "shared/peers/ceems-bpf",
                    help="CEEMS's bpf folder (default ../shared/peers/ceems-bpf)")
    ap.add_argument("--tree", type=Path, default=REPO,
                    help="source tree whose agent and probes are measured (default: this checkout)")
    ap.add_argument("--out", type=Path, default=REPORT, help="report folder (default bench/report)")
    ap.add_argument("--vm-timeout", type=int, default=2400, help="seconds for boot and run")
    ap.add_argument("--guest", type=Path, help=argparse.SUPPRESS)
    ap.add_argument("--hold", choices=("empty-tp", "empty-fentry", "ceems"), help=argparse.SUPPRESS)
    ap.add_argument("--obj", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.hold:
        return hold(args.hold, args.obj)
    if args.guest:
        return guest(args.guest)
    args.rounds = args.rounds or (1 if args.quick else 3)
    args.runtime = args.runtime or 1
    args.window = args.window or (1 if args.quick else 1.5)
    args.cost_rounds = min(args.cost_rounds, args.rounds)
    args.size_mib = args.size_mib or (32 if args.quick else 64)
    args.workloads = [w for w in args.workloads.split(",") if w]
    if set(args.workloads) - set(WORKLOADS):
        ap.error(f"unknown workload: {set(args.workloads) - set(WORKLOADS)}")
    args.conditions = args.conditions.split(",") if args.conditions else None
    known = {f"th-{m}{x}" for m in MODES for x in ("", "-nolat")} | {"th-fentry-gap1s"}
    known |= {"empty-tp", "empty-fentry", "bpftrace", "ceems"}
    if set(args.conditions or ()) - known:
        ap.error(f"unknown condition: {set(args.conditions) - known}")
    return host(args)


if __name__ == "__main__":
    sys.exit(main())
