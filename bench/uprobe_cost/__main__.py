"""What the application view's uprobes cost on this machine's real CPU.

The RDMA benchmark (bench/rdma_verbs) can only run under QEMU without KVM, where
a trap into the kernel costs far more than on hardware. Here the probe's own
entry and return programs (up_ibv_alloc_pd, ur_ibv_alloc_pd from rdma.bpf.o)
are attached to a stand-in `ibv_alloc_pd` in a small shared library, which
returns NULL at once, and a loop calls it: the time added per call is the
uprobe + uretprobe round trip and the programs' own work (a failed create:
one counter update), with nothing of a real verb around it. Rounds alternate
without and with the probes. Run as root:

    .venv/bin/python -m bench.uprobe_cost [--calls N] [--rounds R]
    # writes bench/report/uprobe-cost.{json,md}
"""
import argparse
import json
import platform
import shutil
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

from bench.common import REPORT, commit, cpu_model, stamp

LIB = "__attribute__((noinline)) void *ibv_alloc_pd(void *ctx)\n" \
      "{ __asm__ volatile(\"\" ::: \"memory\"); return 0; }\n"
LOOP = r"""#include <stdio.h>
#include <stdlib.h>
#include <time.h>
void *ibv_alloc_pd(void *ctx);
int main(int argc, char **argv)
{
	long n = atol(argv[1]);
	struct timespec a, b;

	clock_gettime(CLOCK_MONOTONIC, &a);
	for (long i = 0; i < n; i++)
		ibv_alloc_pd(0);
	clock_gettime(CLOCK_MONOTONIC, &b);
	printf("%.1f\n", ((b.tv_sec - a.tv_sec) * 1e9 + (b.tv_nsec - a.tv_nsec)) / n);
	return 0;
}
"""


def build(tmp: Path) -> tuple[Path, Path]:
    (tmp / "lib.c").write_text(LIB)
    (tmp / "loop.c").write_text(LOOP)
    lib = tmp / "libstandin.so"
    # versioned as libibverbs' are: the probe reads a verb's default version
    (tmp / "lib.map").write_text("IBVERBS_1.1 { global: ibv_alloc_pd; local: *; };\n")
    subprocess.run(["gcc", "-O2", "-shared", "-fPIC", f"-Wl,--version-script={tmp / 'lib.map'}",
                    "-o", str(lib), str(tmp / "lib.c")], check=True)
    loop = tmp / "loop"
    subprocess.run(["gcc", "-O2", "-o", str(loop), str(tmp / "loop.c"), f"-L{tmp}", "-lstandin",
                    f"-Wl,-rpath,{tmp}"], check=True)
    return lib, loop


def per_call(loop: Path, calls: int) -> float:
    return float(subprocess.run([str(loop), str(calls)], check=True, capture_output=True,
                                text=True).stdout)


def with_empty_programs(lib: Path, loop: Path, calls: int) -> float | None:
    """The same loop under bpftrace's empty uprobe and uretprobe: the trap
    round trip alone, without the probe's work."""
    if shutil.which("bpftrace") is None:
        return None
    hook = f"{lib}:ibv_alloc_pd"
    bt = subprocess.Popen(["bpftrace", "-e", f"uprobe:{hook} {{}} uretprobe:{hook} {{}}"],
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 60
        while "Attaching" not in (bt.stdout.readline() or "") and time.monotonic() < deadline:
            if bt.poll() is not None:
                return None
        time.sleep(1.0)
        return per_call(loop, calls)
    finally:
        bt.terminate()
        bt.wait(timeout=30)


def main() -> None:
    from tracehound.bpf.loader import BpfObject
    from tracehound.probes import object_path
    from tracehound.probes.rdma_app import file_offsets

    p = argparse.ArgumentParser(prog="python -m bench.uprobe_cost",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("--calls", type=int, default=200_000)
    p.add_argument("--rounds", type=int, default=7)
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        lib, loop = build(Path(tmp))
        offset = file_offsets(lib.read_bytes(), str(lib), ["ibv_alloc_pd"])["ibv_alloc_pd"]
        per_call(loop, args.calls)                      # warm
        obj = BpfObject(object_path("rdma"))
        for name, prog in obj.programs.items():
            prog.autoload = name in ("up_ibv_alloc_pd", "ur_ibv_alloc_pd")
        obj.load()
        empty = with_empty_programs(lib, loop, args.calls)
        bare, probed = [], []
        try:
            for _ in range(args.rounds):
                bare.append(per_call(loop, args.calls))
                links = [obj.programs["up_ibv_alloc_pd"].attach_uprobe(str(lib), offset),
                         obj.programs["ur_ibv_alloc_pd"].attach_uprobe(str(lib), offset, True)]
                probed.append(per_call(loop, args.calls))
                for link in links:
                    link.destroy()
        finally:
            obj.close()
    b, w = statistics.median(bare), statistics.median(probed)
    data = {"calls": args.calls, "rounds": args.rounds, "cpu": cpu_model() or
            platform.machine(), "commit": commit(), "date": stamp()["date"], "kernel": platform.release(), "bare_ns": bare, "probed_ns": probed,
            "median_bare_ns": b, "median_probed_ns": w, "added_ns": w - b,
            "empty_programs_ns": empty}
    REPORT.mkdir(parents=True, exist_ok=True)
    (REPORT / "uprobe-cost.json").write_text(json.dumps(data, indent=2))
    cpu = cpu_model() or "?"
    (REPORT / "uprobe-cost.md").write_text(
        "# The application view's uprobes, natively (no emulation)\n\n"
        f"{cpu} (this host; a KVM guest), kernel {platform.release()}, commit {data['commit']}. A loop calls a stand-in `ibv_alloc_pd` that returns "
        f"NULL, {args.calls} times per round, {args.rounds} rounds alternating without and with "
        "the probe's own `up_ibv_alloc_pd` and `ur_ibv_alloc_pd` attached (a failed create: the "
        "entry program records the call, the return program counts the error by op, errno, "
        "cgroup and device).\n\n"
        "| | ns per call (median) |\n|---|---:|\n"
        f"| without the probes | {b:.1f} |\n| with them | {w:.1f} |\n"
        f"| added per verb call | {w - b:.0f} |\n"
        + (f"| empty uprobe + uretprobe (bpftrace), once | {empty:.1f} |\n" if empty else "")
        + "\nThe empty programs' line is the trap round trip alone (uprobe, the single step of "
        "the probed instruction, uretprobe); what the probe's programs add is the difference "
        "to it. In a virtual machine with speculative-execution mitigations the traps cost "
        "several times what they cost on bare metal.\n\n"
        "A real verb is a system call into uverbs and the driver (tens of microseconds and more "
        "for memory registration, which pins pages): the added time is what each create, "
        "destroy or modify call pays, once; data-path verbs (post_send, poll_cq) are not probed.\n")
    print(f"uprobe-cost: {b:.1f} ns bare, {w:.1f} ns probed: +{w - b:.0f} ns per call")


if __name__ == "__main__":
    main()
