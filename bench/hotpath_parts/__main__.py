#!/usr/bin/env python3
"""What each building block of the I/O probe's per-event path costs on this
machine: one program per block (bench/hotpath_parts/hotpath_parts.bpf.c), each attached
alone to the raw sys_exit tracepoint while fio does 4 KiB preads from tmpfs,
with kernel.bpf_stats_enabled=1. A block's cost is its program's ns per run
minus the `filter` program's in the same round. Run as root:

    .venv/bin/python -m bench.hotpath_parts      # about 2 minutes

Writes bench/report/hotpath-parts.{md,json}. These figures are the floors
the probe's own numbers in overhead.md are judged against: timing a call
needs two clock reads whatever the rest of the program does.
"""
from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from bench.common import REPO, REPORT, commit, cpu_model
from tracehound.bpf.loader import BpfObject
from tracehound.errors import TracehoundError

SOURCE = Path(__file__).resolve().parent / "hotpath_parts.bpf.c"
PROBES = REPO / "src/tracehound/probes"
STATS = Path("/proc/sys/kernel/bpf_stats_enabled")
MEANING = {
    "filter": "dispatch + pread64 test (subtracted from the others)",
    "clock_read": "one bpf_ktime_get_ns",
    "task_storage": "one bpf_task_storage_get (the in-flight start of a timed call)",
    "current_task": "bpf_get_current_task_btf + one load",
    "cgroup_id_helper": "bpf_get_current_cgroup_id",
    "cgroup_id_loads": "the same id by plain loads (what the probe does)",
    "hash_lookup": "one lookup in a (cgroup, mount)-keyed hash of io_stats",
    "hash_lookup_3_atomic_adds": "the lookup and three atomic adds (one event's accounting)",
    "percpu_array_lookup": "one per-CPU array lookup (a slot hint)",
    "array_lookup_3_atomic_adds": "the accounting through an array slot instead of the hash",
    "fd_mount_probe_reads": "fd -> file -> mount id through probe reads (pre-6.2 build)",
    "fd_mount_typed_loads": "the same through bpf_rdonly_cast views (what the probe does)",
}


def build(out: Path) -> Path:
    obj = out / "hotpath_parts.bpf.o"
    multiarch = subprocess.run(["gcc", "-print-multiarch"], capture_output=True,
                               text=True).stdout.strip()
    subprocess.run(["clang", "-g", "-O2", "-target", "bpf", "-D__TARGET_ARCH_x86", "-Wall",
                    "-Wno-unused-function", f"-I/usr/include/{multiarch}", f"-I{PROBES}",
                    "-c", str(SOURCE), "-o", str(obj)], check=True)
    return obj


def run_stats(fd: int) -> tuple[int, int]:
    info = Path(f"/proc/self/fdinfo/{fd}").read_text()
    get = lambda key: int(re.search(rf"^{key}:\s*(\d+)", info, re.M).group(1))  # noqa: E731
    return get("run_cnt"), get("run_time_ns")


def fio(path: str, runtime: int, cpu: int | None) -> int:
    cmd = ["fio", "--name=parts", f"--filename={path}", "--size=64M", "--rw=randread",
           "--bs=4k", "--ioengine=psync", "--time_based", f"--runtime={runtime}",
           "--norandommap", "--invalidate=0", "--output-format=json"]
    if cpu is not None:
        cmd.append(f"--cpus_allowed={cpu}")
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    return json.loads(out)["jobs"][0]["read"]["total_ios"]


def measure(obj_path: Path, part: str, data: str, runtime: int, cpu: int | None) -> float | None:
    """ns per run, or None where this kernel refuses the part (a kfunc it
    does not have)."""
    with BpfObject(str(obj_path)) as obj:
        for name, prog in obj.programs.items():
            prog.autoload = name == part
        try:
            obj.load()
        except TracehoundError as e:
            print(f"{part}: not on this kernel: {str(e).splitlines()[0]}", flush=True)
            return None
        obj.attach_all()
        fd = obj.programs[part].fd
        n0, t0 = run_stats(fd)
        fio(data, runtime, cpu)
        n1, t1 = run_stats(fd)
    return (t1 - t0) / max(1, n1 - n0)


def main() -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.hotpath_parts",
                                 description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--runtime", type=int, default=2, help="seconds of fio per part and round")
    ap.add_argument("--out", type=Path, default=REPORT)
    ap.add_argument("--name", default="hotpath-parts",
                    help="report file name, without .md/.json (e.g. hotpath-parts-vm)")
    ap.add_argument("--with-vm", action="store_true",
                    help="then the same in Debian's 6.1 kernel under TCG (the VM tier's guest), "
                         "as hotpath-parts-vm: its clock is an emulated HPET")
    args = ap.parse_args()
    if os.geteuid() != 0:
        sys.exit("run as root: loading BPF and mounting tmpfs need it")
    cpu = (os.cpu_count() or 1) - 1 or None
    before = STATS.read_text().strip()
    with tempfile.TemporaryDirectory(prefix="tracehound-parts-") as tmp:
        obj = build(Path(tmp))
        mnt = Path(tmp) / "mnt"
        mnt.mkdir()
        subprocess.run(["mount", "-t", "tmpfs", "-o", "size=96m", "tracehound-parts", str(mnt)],
                       check=True)
        try:
            data = str(mnt / "data")
            with open(data, "wb") as f:
                for _ in range(64):
                    f.write(os.urandom(1 << 20))
            STATS.write_text("1")
            runs: dict[str, list[float]] = {p: [] for p in MEANING}
            for r in range(args.rounds):
                for part in list(runs):
                    ns = measure(obj, part, data, args.runtime, cpu)
                    if ns is None:
                        del runs[part]
                        continue
                    runs[part].append(ns)
                    print(f"round {r + 1}/{args.rounds} {part:<28} {ns:7.1f} ns/run", flush=True)
        finally:
            STATS.write_text(before)
            subprocess.run(["umount", str(mnt)], check=False)
    # each round's cost against that round's filter, then the median
    cost = {p: statistics.median(v - f for v, f in zip(runs[p], runs["filter"])) for p in runs}
    srso = Path("/sys/devices/system/cpu/vulnerabilities/spec_rstack_overflow")
    machine = {"date": dt.datetime.now().astimezone().isoformat(timespec="seconds"),
               "kernel": platform.release(), "cpu": cpu_model() or "?",
               "nproc": os.cpu_count(), "commit": commit(),
               "return_mitigation": srso.read_text().strip() if srso.exists() else "?"}
    res = {"machine": machine, "rounds": args.rounds, "runtime_s": args.runtime,
           "ns_per_run": runs, "cost_ns": cost}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"{args.name}.json").write_text(json.dumps(res, indent=2) + "\n")
    (args.out / f"{args.name}.md").write_text(report(res))
    print(report(res))
    return in_the_guest(args) if args.with_vm else 0


def in_the_guest(args) -> int:
    """The same blocks inside the VM tier's guest, reports beside the host's."""
    from testbed import vm as harness
    if (why := harness.is_available()):
        print(f"hotpath-parts-vm left out: {why}")
        return 0
    with tempfile.TemporaryDirectory(prefix="tracehound-parts-vm-") as xdir:
        name = "hotpath-parts-vm"
        cmd = (f"{sys.executable} -m bench.hotpath_parts --rounds {args.rounds} --runtime 1 "
               f"--name {name} --out {xdir}")
        # the guest starts in the repository root, where -m finds the package
        r = harness.run_in_vm(cmd, timeout=1800, cwd=REPO, writable=[xdir], stream=sys.stdout,
                              env={"PYTHONPATH": os.environ.get("PYTHONPATH", "")})
        for ext in (".md", ".json"):
            src = Path(xdir) / (name + ext)
            if src.exists():
                (args.out / (name + ext)).write_text(src.read_text())
        return r.returncode


def report(res: dict) -> str:
    m, c = res["machine"], res["cost_ns"]

    def ns(*parts: str, minus: str | None = None, times: int = 1) -> str:
        """a cost (or a sum, or a difference) in ns, or why it is missing"""
        if any(p not in c for p in parts + ((minus,) if minus else ())):
            return "n/a (not on this kernel)"
        return f"{times * sum(c[p] for p in parts) - (c[minus] if minus else 0):.0f} ns"

    lines = [
        "# What each step of an I/O event costs", "",
        f"{m['date']} at commit {m.get('commit', 'not recorded')} on Linux {m['kernel']}, "
        f"{m['nproc']} × {m['cpu']}; return-stack "
        f"mitigation: {m['return_mitigation']}. Each block is one program on the raw "
        f"sys_exit tracepoint, attached alone, acting on pread64 only, while fio does 4 KiB "
        f"preads from tmpfs with bpf_stats on; {res['rounds']} rounds × {res['runtime_s']} s, "
        "median of each round's difference to the `filter` program.", "",
        "| block | what it does | ns per run (median) | cost over filter |",
        "|---|---|---:|---:|"]
    for part, meaning in MEANING.items():
        if part not in c:
            lines.append(f"| `{part}` | {meaning} | not on this kernel | |")
            continue
        lines.append(f"| `{part}` | {meaning} | {statistics.median(res['ns_per_run'][part]):.1f} "
                     f"| {'–' if part == 'filter' else f'{c[part]:.1f}'} |")
    lines += [
        "", "## Floors that follow", "",
        f"- **Timing a call** needs a clock read at entry and another at exit: "
        f"{ns('clock_read', times=2)} here, before any counting, and no program can do with "
        f"less. Where the start is kept matters too: task storage would add "
        f"{ns('task_storage')} at each end; the probe keeps it in a per-CPU slot "
        f"({ns('percpu_array_lookup')}, including the task pointer) and moves it to task "
        "storage only when the task is switched out mid-call. Latency off (`--latency off`) "
        "removes both clock reads and, in syscall mode, the entry hook.",
        f"- **Counting an event** in a (cgroup, mount)-keyed hash costs "
        f"{ns('hash_lookup_3_atomic_adds')} here; through an array slot "
        f"{ns('array_lookup_3_atomic_adds')}, which is why the probe keeps its counters in an "
        "array and finds the slot from a per-CPU hint. The atomic adds themselves are "
        f"{ns('hash_lookup_3_atomic_adds', minus='hash_lookup')}, so per-CPU counters would not "
        "pay for the memory they take (value size × CPUs per entry).",
        f"- **Finding the mount** of an fd: {ns('fd_mount_typed_loads')} with typed loads against "
        f"{ns('fd_mount_probe_reads')} through probe reads; the cgroup id "
        f"{ns('cgroup_id_loads')} by loads against {ns('cgroup_id_helper')} by helper.",
    ]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
