"""What the RDMA probe adds to control-path verbs, measured on soft-RoCE in
Debian's 6.1 kernel (the only place with RDMA and fentry/kprobes here).

A pyverbs worker registers an MR, creates an RC QP, destroys the QP and
deregisters the MR, N times, timing each verb. It runs with no agent, with
the agent in fentry mode, in kprobe mode, and with no agent again (drift
check). With the agent, kernel.bpf_stats_enabled=1 gives each RDMA program's
own run time. Emulated CPU (QEMU TCG): compare conditions with each other,
never with real hardware. Run as root after scripts/vm-setup:

    .venv/bin/python bench/rdma_verbs.py [--iterations N] [--rounds R]
    # writes bench/report/rdma-verbs.{json,md}
"""
import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
REPORT = REPO / "bench" / "report"
VERBS = ("reg_mr", "create_qp", "destroy_qp", "dereg_mr")
CONDITIONS = (("baseline", None), ("fentry", "fentry"), ("kprobe", "kprobe"), ("baseline-after", None))
RDMA_PREFIXES = ("fe_", "fx_", "kp_", "kr_")


def worker(iterations: int) -> None:
    """Runs in its own process: per-verb wall time in ns, one list per verb."""
    import pyverbs.enums as e
    from pyverbs.cq import CQ
    from pyverbs.device import Context
    from pyverbs.mr import MR
    from pyverbs.pd import PD
    from pyverbs.qp import QP, QPCap, QPInitAttr

    ctx = Context(name="rxe0")
    pd = PD(ctx)
    cq = CQ(ctx, 16)
    init = QPInitAttr(qp_type=e.IBV_QPT_RC, scq=cq, rcq=cq, cap=QPCap(max_send_wr=4, max_recv_wr=4))
    times = {v: [] for v in VERBS}
    clock = time.perf_counter_ns
    for _ in range(iterations):
        t0 = clock()
        mr = MR(pd, 4096, e.IBV_ACCESS_LOCAL_WRITE)
        t1 = clock()
        qp = QP(pd, init)
        t2 = clock()
        qp.close()
        t3 = clock()
        mr.close()
        t4 = clock()
        for verb, ns in zip(VERBS, (t1 - t0, t2 - t1, t3 - t2, t4 - t3)):
            times[verb].append(ns)
    print(json.dumps(times))


def programs() -> dict:
    out = json.loads(subprocess.run(["bpftool", "prog", "show", "-j"], check=True,
                                    capture_output=True, text=True).stdout)
    return {p["id"]: (p["name"], p.get("run_cnt", 0), p.get("run_time_ns", 0)) for p in out
            if p.get("name", "").startswith(RDMA_PREFIXES) and "vfs" not in p["name"]}


def run_worker(iterations: int) -> dict:
    out = subprocess.run([sys.executable, __file__, "--worker", str(iterations)], check=True,
                         capture_output=True, text=True)
    return json.loads(out.stdout)


def start_agent(mode: str) -> subprocess.Popen:
    agent = subprocess.Popen([sys.executable, "-m", "tracehound", "run", "--hook-mode", mode,
                              "--listen", "127.0.0.1:0"], stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True)
    lines = []
    while True:
        line = agent.stdout.readline()
        if not line:
            raise SystemExit("rdma-verbs: agent exited:\n" + "".join(lines))
        lines.append(line)
        if line.startswith("tracehound: rdma:"):
            raise SystemExit("rdma-verbs: " + line)
        if line.startswith("tracehound: probe rdma.verbs"):   # the last RDMA group reported
            return agent


def guest(out: Path, iterations: int, rounds: int) -> None:
    for cmd in ("modprobe rdma_rxe", "modprobe ib_uverbs",
                "ip link add bench0 type veth peer name bench1",
                "ip link set bench0 up", "ip link set bench1 up",
                "rdma link add rxe0 type rxe netdev bench0"):
        subprocess.run(cmd.split(), check=True)
    time.sleep(2)
    run_worker(20)   # warm caches: imports, the provider library
    results = {}
    for name, mode in CONDITIONS:
        print(f"rdma-verbs: {name}", flush=True)
        agent = start_agent(mode) if mode else None
        Path("/proc/sys/kernel/bpf_stats_enabled").write_text("1" if agent else "0")
        before = programs()
        samples = {v: [] for v in VERBS}
        for _ in range(rounds):
            for verb, ns in run_worker(iterations).items():
                samples[verb] += ns
        after = programs()
        Path("/proc/sys/kernel/bpf_stats_enabled").write_text("0")
        if agent:
            agent.terminate()
            agent.wait(timeout=60)
        per_prog = {}
        for pid, (pname, cnt, ns) in after.items():
            c0, n0 = before.get(pid, (pname, 0, 0))[1:]
            if cnt > c0:
                per_prog[pname] = {"runs": cnt - c0, "ns_per_run": round((ns - n0) / (cnt - c0), 1)}
        results[name] = {
            "median_ns": {v: statistics.median(s) for v, s in samples.items()},
            "p90_ns": {v: sorted(s)[int(len(s) * 0.9)] for v, s in samples.items()},
            "programs": per_prog,
            "bpf_ns_per_cycle": round(sum(p["runs"] * p["ns_per_run"] for p in per_prog.values())
                                      / (iterations * rounds), 1),
        }
    (out / "rdma-verbs.json").write_text(json.dumps({"iterations": iterations, "rounds": rounds,
                                                     "results": results}, indent=2))


def report(data: dict, kernel: str) -> str:
    res = data["results"]
    base = res["baseline"]["median_ns"]
    intro = (f"Kernel {kernel} under QEMU without KVM, rdma_rxe on a veth. A pyverbs worker runs "
             f"reg_mr, create_qp, destroy_qp, dereg_mr {data['iterations']} times per round, "
             f"{data['rounds']} rounds per condition. Emulation inflates every number: compare "
             "conditions with each other only. `baseline-after` repeats the baseline last to show "
             "drift; differences smaller than that drift are noise.")
    lines = ["# RDMA probe cost on control-path verbs (soft-RoCE, Debian 6.1, emulated)", "", intro, "",
             "## Median wall time per verb (µs), and the change against the first baseline", "",
             "| condition | " + " | ".join(VERBS) + " | BPF ns per cycle (bpf_stats) |",
             "|---|" + "---:|" * len(VERBS) + "---:|"]
    for name, r in res.items():
        cells = []
        for v in VERBS:
            med = r["median_ns"][v]
            delta = "" if name == "baseline" else f" ({(med - base[v]) / 1000:+.1f})"
            cells.append(f"{med / 1000:.1f}{delta}")
        lines.append(f"| {name} | " + " | ".join(cells) + f" | {r['bpf_ns_per_cycle']:.0f} |")
    note = ("A cycle is one reg_mr + create_qp + destroy_qp + dereg_mr. BPF ns per cycle is "
            "the run time of every RDMA program (bpf_stats) divided by the cycles: the probe's "
            "own cost, without the trampoline or kprobe entry around it.")
    lines += ["", note, ""]
    for name in ("fentry", "kprobe"):
        lines += [f"## Programs in {name} mode", "", "| program | runs | ns per run |", "|---|---:|---:|"]
        for pname, p in sorted(res[name]["programs"].items()):
            lines.append(f"| {pname} | {p['runs']} | {p['ns_per_run']} |")
        lines.append("")
    return "\n".join(lines)


def host(iterations: int, rounds: int) -> None:
    sys.path.insert(0, str(REPO / "tests" / "vm"))
    import harness
    REPORT.mkdir(parents=True, exist_ok=True)
    r = harness.run_in_vm(f"{sys.executable} {__file__} --guest {REPORT} --iterations {iterations} "
                          f"--rounds {rounds}", timeout=1500, cwd=REPO, writable=[REPORT],
                          stream=sys.stdout)
    if r.returncode != 0:
        raise SystemExit(f"rdma-verbs: guest failed ({r.returncode})\n{r.output[-2000:]}")
    data = json.loads((REPORT / "rdma-verbs.json").read_text())
    (REPORT / "rdma-verbs.md").write_text(report(data, r.kernel_release))
    print(f"rdma-verbs: wrote {REPORT / 'rdma-verbs.md'} (VM total {r.total_seconds:.0f} s)")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--iterations", type=int, default=200)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--guest", type=Path, help=argparse.SUPPRESS)
    p.add_argument("--worker", type=int, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        worker(args.worker)
    elif args.guest:
        guest(args.guest, args.iterations, args.rounds)
    else:
        host(args.iterations, args.rounds)


if __name__ == "__main__":
    main()
