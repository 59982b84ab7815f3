"""What the RDMA probe adds to control-path verbs, measured on soft-RoCE in
Debian's 6.1 kernel (the only place with RDMA and fentry/kprobes here).

A pyverbs worker registers an MR, creates an RC QP, destroys the QP and
deregisters the MR, N times, timing each verb. It runs with no agent, with
the agent in fentry mode without and with the application view (uprobes on
libibverbs), in kprobe mode, and with no agent again (the noise of the run). The
conditions take turns round by round, each round starting one condition
later, and each agent's exit is followed by a pause before the next
condition, so neither a slow drift of the emulated machine nor the teardown
of the previous agent lands on one condition. With the agent, kernel.bpf_stats_enabled=1
gives each RDMA program's own run time. Emulated CPU (QEMU TCG): compare
conditions with each other, never with real hardware. Run as root after
scripts/vm-setup:

    .venv/bin/python -m bench.rdma_verbs [--iterations N] [--rounds R]
    # writes bench/report/rdma-verbs.{json,md}
"""
import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

from bench.common import REPO, REPORT, stamp

VERBS = ("reg_mr", "create_qp", "destroy_qp", "dereg_mr")
# name -> the agent's flags (None: no agent)
CONDITIONS = (("baseline", None), ("fentry", ("--hook-mode", "fentry", "--rdma-app-view", "off")),
              ("fentry+app", ("--hook-mode", "fentry")),
              ("kprobe", ("--hook-mode", "kprobe", "--rdma-app-view", "off")),
              ("baseline-again", None))
RDMA_PREFIXES = ("fe_", "fx_", "kp_", "kr_", "up_", "ur_")
SETTLE_S = 10          # after an agent stops: detaching keeps the emulated CPUs busy


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
    out = subprocess.run([sys.executable, "-m", "bench.rdma_verbs", "--worker", str(iterations)],
                         check=True, capture_output=True, text=True, cwd=REPO)
    return json.loads(out.stdout)


def start_agent(flags, log: Path) -> subprocess.Popen:
    """The agent, its output in `log` (a pipe nobody reads would fill and stop it)."""
    with open(log, "w") as out:
        agent = subprocess.Popen([sys.executable, "-m", "tracehound", "run", *flags,
                                  "--listen", "127.0.0.1:0"], stdout=out, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        text = log.read_text()
        if agent.poll() is not None:
            raise SystemExit("rdma-verbs: agent exited:\n" + text)
        if "tracehound: rdma:" in text:
            raise SystemExit("rdma-verbs: " + text)
        if "tracehound: probe rdma.verbs" in text:   # the last RDMA group reported
            return agent
        time.sleep(0.2)
    agent.kill()
    raise SystemExit("rdma-verbs: the agent did not start in 300 s:\n" + log.read_text())


def guest(out: Path, iterations: int, rounds: int) -> None:
    for cmd in ("modprobe rdma_rxe", "modprobe ib_uverbs",
                "ip link add bench0 type veth peer name bench1",
                "ip link set bench0 up", "ip link set bench1 up",
                "rdma link add rxe0 type rxe netdev bench0"):
        subprocess.run(cmd.split(), check=True)
    time.sleep(2)
    run_worker(20)   # warm caches: imports, the provider library
    samples = {name: {v: [] for v in VERBS} for name, _ in CONDITIONS}
    stats = {name: {} for name, _ in CONDITIONS}
    for r in range(rounds):
        # each round starts one condition later, so no condition always follows
        # the same one (an agent's teardown keeps the emulated CPUs busy a while)
        for name, flags in CONDITIONS[r % len(CONDITIONS):] + CONDITIONS[:r % len(CONDITIONS)]:
            print(f"rdma-verbs: round {r + 1}/{rounds}: {name}", flush=True)
            log = out / f"agent-{name}.log"
            agent = start_agent(flags, log) if flags else None
            Path("/proc/sys/kernel/bpf_stats_enabled").write_text("1" if agent else "0")
            before = programs()
            for verb, ns in run_worker(iterations).items():
                samples[name][verb] += ns
            after = programs()
            Path("/proc/sys/kernel/bpf_stats_enabled").write_text("0")
            if agent:
                agent.terminate()
                agent.wait(timeout=60)
                time.sleep(SETTLE_S)
                lines = log.read_text().splitlines()
                print(f"rdma-verbs: {name}: agent wrote {len(lines)} lines; last: "
                      f"{lines[-1] if lines else ''}", flush=True)
                log.unlink()
            for pid, (pname, cnt, ns) in after.items():
                c0, n0 = before.get(pid, (pname, 0, 0))[1:]
                runs, total = stats[name].get(pname, (0, 0))
                stats[name][pname] = (runs + cnt - c0, total + ns - n0)
    results = {}
    for name, _ in CONDITIONS:
        per_prog = {p: {"runs": runs, "ns_per_run": round(total / runs, 1)}
                    for p, (runs, total) in stats[name].items() if runs}
        results[name] = {
            "median_ns": {v: statistics.median(s) for v, s in samples[name].items()},
            "p90_ns": {v: sorted(s)[int(len(s) * 0.9)] for v, s in samples[name].items()},
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
             f"{data['rounds']} rounds; the conditions take turns within each round, each round starting "
             f"one condition later, with {SETTLE_S} s of quiet after each agent stops. Emulation "
             "inflates every number (a trap into the kernel costs far more than on hardware): "
             "compare conditions with each other only. `fentry` and `kprobe` are the kernel's "
             "view alone (`--rdma-app-view off`), `fentry+app` adds the application view. "
             "`baseline-again` is a second baseline: the difference between the two is the noise "
             "of the run; differences smaller than it are noise.")
    st = data.get("stamp", {})
    lines = ["# RDMA probe cost on control-path verbs (soft-RoCE, Debian 6.1, emulated)", "",
             f"Commit {st.get('commit', '?')}; host {st.get('machine', '?')}; {st.get('date', '?')}.", "",
             intro, "",
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
            "own cost, without the trampoline, kprobe or uprobe entry around it.")
    lines += ["", note, ""]
    kern, app = res["fentry"]["median_ns"], res["fentry+app"]["median_ns"]
    drift = res["baseline-again"]["median_ns"]
    lines += ["## The application view's cost per verb (uprobe + uretprobe)", "",
              "The same run with the application view (`fentry+app`) and without it (`fentry`): "
              "the difference is what the two uprobes of each verb add (the trap into the kernel "
              "and back, twice, and the programs), as a share of the verb's own time without any "
              "agent. The noise column is the second baseline against the first: a difference "
              "smaller than it is within noise.", "",
              "| verb | verb alone (µs) | added by the uprobes (µs) | share of the verb | noise (µs) |",
              "|---|---:|---:|---:|---:|"]
    for v in VERBS:
        added = (app[v] - kern[v]) / 1000
        lines.append(f"| {v} | {base[v] / 1000:.1f} | {added:+.1f} | {added * 1000 / base[v]:+.1%} "
                     f"| {(drift[v] - base[v]) / 1000:+.1f} |")
    lines.append("")
    for name in ("fentry", "fentry+app", "kprobe"):
        lines += [f"## Programs in {name} mode", "", "| program | runs | ns per run |", "|---|---:|---:|"]
        for pname, p in sorted(res[name]["programs"].items()):
            lines.append(f"| {pname} | {p['runs']} | {p['ns_per_run']} |")
        lines.append("")
    return "\n".join(lines)


def host(iterations: int, rounds: int) -> None:
    from testbed import vm as harness
    REPORT.mkdir(parents=True, exist_ok=True)
    # the guest starts in the repository root (cwd), where -m finds the package
    r = harness.run_in_vm(f"{sys.executable} -m bench.rdma_verbs --guest {REPORT} --iterations {iterations} "
                          f"--rounds {rounds}", timeout=1500, cwd=REPO, writable=[REPORT],
                          stream=sys.stdout)
    if r.returncode != 0:
        raise SystemExit(f"rdma-verbs: guest failed ({r.returncode})\n{r.output[-2000:]}")
    data = json.loads((REPORT / "rdma-verbs.json").read_text())
    # the guest has no git: the host stamps what it measured
    data["stamp"] = stamp()
    (REPORT / "rdma-verbs.json").write_text(json.dumps(data, indent=2))
    (REPORT / "rdma-verbs.md").write_text(report(data, r.kernel_release))
    print(f"rdma-verbs: wrote {REPORT / 'rdma-verbs.md'} (VM total {r.total_seconds:.0f} s)")


def main() -> None:
    p = argparse.ArgumentParser(prog="python -m bench.rdma_verbs",
                                description=__doc__.split("\n\n")[0])
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
