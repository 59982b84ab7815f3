"""What counting data past read and write costs, in one run.

1. io_uring 4 KiB random reads from the page cache (tmpfs), queue depth 1:
   every request runs the submit and the completion programs, and the
   io_uring_enter syscalls run the raw syscall hook where the probe is in
   tracepoint mode. The cheapest request there is, so a fixed cost per
   request shows up as large as it can.
2. Cold sequential reads of a 128 MiB file on ext4 (a loop device whose
   image lives in memory, so storage speed does not hide the cost): the
   file's pages are dropped before every pass, so each 4 KiB page (or large
   folio) added to the page cache runs the page-cache program once.
Rounds alternate without and with the I/O probe (the agent's whole I/O
probe, latency on, in the mode `--hook-mode` picks); the ratio is each
probed round's rate against the bare round just before it. One more probed
round of each runs with the kernel's BPF run-time statistics on, for ns per
program run. Run as root:

    .venv/bin/python -m bench.async_cost [--rounds R] [--seconds S] [--hook-mode M]
    # writes bench/report/async_cost.{json,md,png}
"""
import argparse
import ctypes
import json
import os
import platform
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.common import REPORT, commit, cpu_model, paired_ratio, paired_spread, prog_id, stamp

FILE_MIB = 128
CPU = os.cpu_count() - 1            # the workload's CPU; the agent's threads sleep meanwhile


def uring_rate(path: str, seconds: float) -> float:
    """IOPS of fio's io_uring engine, 4 KiB random reads at depth 1."""
    out = subprocess.run(
        ["fio", "--name=u", f"--filename={path}", "--ioengine=io_uring", "--rw=randread",
         "--bs=4k", "--iodepth=1", "--norandommap", "--invalidate=0", "--time_based",
         f"--runtime={seconds}", f"--size={FILE_MIB}M", f"--cpus_allowed={CPU}",
         "--output-format=json"], check=True, capture_output=True, text=True).stdout
    return json.loads(out[out.index("{"):])["jobs"][0]["read"]["iops"]


def cold_rate(path: str, seconds: float) -> float:
    """MiB/s of whole-file reads, each from a cold page cache."""
    os.sched_setaffinity(0, {CPU})
    buf = bytearray(1 << 20)
    done, start = 0, time.monotonic()
    fd = os.open(path, os.O_RDONLY)
    try:
        while time.monotonic() - start < seconds:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            os.lseek(fd, 0, os.SEEK_SET)
            while n := os.readv(fd, [buf]):
                done += n
        return done / (1 << 20) / (time.monotonic() - start)
    finally:
        os.close(fd)
        os.sched_setaffinity(0, set(range(os.cpu_count())))


def start_probe(mode: str):
    from tracehound.host.mounts import MountTable
    from tracehound.probes.io import IoProbe, IoProbeConfig
    return IoProbe(IoProbeConfig(hook_mode=mode), MountTable()).start()


def alternate(fn, rounds: int, seconds: float, mode: str) -> dict:
    fn(min(seconds, 1.0))                           # warm
    bare, probed = [], []
    for _ in range(rounds):
        bare.append(fn(seconds))
        probe = start_probe(mode)
        try:
            probed.append(fn(seconds))
        finally:
            probe.close()
    return {"bare": bare, "probed": probed}


def with_stats(fn, seconds: float, mode: str) -> dict:
    """One probed round with BPF run-time statistics: runs and ns per run of
    every program that ran."""
    from tracehound.bpf import libbpf
    lib = libbpf.lib()
    lib.bpf_enable_stats.argtypes = [ctypes.c_int]
    lib.bpf_enable_stats.restype = ctypes.c_int
    stats_fd = lib.bpf_enable_stats(0)              # BPF_STATS_RUN_TIME while the fd is open
    if stats_fd < 0:
        return {}
    probe = start_probe(mode)
    try:
        ids = {name: prog_id(lib, prog.fd) for name, prog in probe.obj.programs.items()
               if prog.autoload}
        rate = fn(seconds)
        out = {"rate": rate, "modes": probe.modes(), "programs": {}}
        for name, pid in ids.items():
            info = json.loads(subprocess.run(["bpftool", "-j", "prog", "show", "id", str(pid)],
                                             check=True, capture_output=True, text=True).stdout)
            runs, ns = info.get("run_cnt", 0), info.get("run_time_ns", 0)
            if runs:
                out["programs"][name] = {"runs": runs, "ns_per_run": ns / runs}
        return out
    finally:
        probe.close()
        os.close(stats_fd)


def scratch(tmp: str) -> tuple[str, str]:
    """(tmpfs file, ext4 file): the ext4 on a loop device over an image in
    memory (a tmpfs of its own)."""
    mem = os.path.join(tmp, "mem")
    os.mkdir(mem)
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={FILE_MIB * 3}m", "thbench", mem],
                   check=True)
    image, ext4 = os.path.join(mem, "image"), os.path.join(tmp, "ext4")
    os.mkdir(ext4)
    with open(image, "wb") as f:
        f.truncate((FILE_MIB + 64) << 20)
    subprocess.run(["mkfs.ext4", "-q", "-F", image], check=True)
    subprocess.run(["mount", "-o", "loop", image, ext4], check=True)
    files = (os.path.join(mem, "uring"), os.path.join(ext4, "cold"))
    for path in files:
        with open(path, "wb") as f:
            for _ in range(FILE_MIB):
                f.write(os.urandom(1 << 20))
    return files


def unmount(tmp: str) -> None:
    for sub in ("ext4", "mem"):
        subprocess.run(["umount", "-l", os.path.join(tmp, sub)], check=False,
                       capture_output=True)


def main() -> None:
    p = argparse.ArgumentParser(prog="python -m bench.async_cost",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=8)
    p.add_argument("--seconds", type=float, default=2.0)
    p.add_argument("--hook-mode", default="auto")
    p.add_argument("--out", type=Path, default=REPORT)
    args = p.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))
    started = time.monotonic()
    data = {"cpu": cpu_model() or "?", "commit": commit(), "date": stamp()["date"],
            "vcpus": os.cpu_count(), "kernel": platform.release(), "rounds": args.rounds,
            "seconds": args.seconds, "file_mib": FILE_MIB}
    tmp = tempfile.mkdtemp(prefix="thbench-async-")
    try:
        uring_file, cold_file = scratch(tmp)
        workloads = {"uring": lambda s: uring_rate(uring_file, s),
                     "cold": lambda s: cold_rate(cold_file, s)}
        for name, fn in workloads.items():
            print(f"{name}: {args.rounds} rounds of {args.seconds} s, bare and probed", flush=True)
            data[name] = alternate(fn, args.rounds, args.seconds, args.hook_mode)
            data[name]["stats"] = with_stats(fn, args.seconds, args.hook_mode)
    finally:
        unmount(tmp)
        shutil.rmtree(tmp, ignore_errors=True)
    data["wall_s"] = time.monotonic() - started
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "async_cost.json").write_text(json.dumps(data, indent=2))
    (args.out / "async_cost.md").write_text(report(data))
    plot(data, args.out / "async_cost.png")
    print(report(data))


def _per_event(d: dict, program: str) -> str:
    prog = d.get("stats", {}).get("programs", {}).get(program)
    return f"{prog['ns_per_run']:.0f} ns × {prog['runs']:,} runs" if prog else "did not run"


def report(d: dict) -> str:
    rows = []
    for name, what, unit in (("uring", "io_uring 4 KiB random reads, depth 1, tmpfs", "IOPS"),
                             ("cold", "cold 1 MiB reads, ext4 on a loop device in memory",
                              "MiB/s")):
        bare, probed, ratio = paired_ratio(d[name])
        lo, hi = paired_spread(d[name])
        rows.append(f"| {what} | {bare:,.0f} {unit} | {probed:,.0f} {unit} | **{ratio:.3f}** "
                    f"({lo:.3f}–{hi:.3f}) |")
    stats = {name: d[name].get("stats", {}) for name in ("uring", "cold")}
    modes = stats["uring"].get("modes", {})
    programs = sorted({p for s in stats.values() for p in s.get("programs", {})})
    prog_rows = [f"| `{p}` | {_per_event(d['uring'], p)} | {_per_event(d['cold'], p)} |"
                 for p in programs]
    pages = (d["cold"].get("stats", {}).get("programs", {}).get("tb_filemap_add") or {}).get("runs")
    return "\n".join([
        "# Cost of counting data past read and write",
        "",
        f"Host: {d['cpu']}, {d['vcpus']} vCPUs, kernel {d['kernel']}, commit "
        f"{d.get('commit', 'not recorded')}; the workload pinned to "
        f"CPU {d['vcpus'] - 1}. {d['rounds']} rounds of {d['seconds']} s per condition, "
        f"alternating; {d['wall_s']:.0f} s in all. I/O probe modes: "
        + (", ".join(f"{k} {v}" for k, v in modes.items()) or "?") + ".",
        "",
        "Ratio = rate with the I/O probe / rate without, median of the rounds' paired ratios "
        "(each probed round against the bare round just before it); quartiles in brackets are "
        "the rounds' own noise.",
        "",
        "| workload | without | with | ratio |",
        "|---|---|---|---|",
        *rows,
        "",
        "## ns per program run (BPF run-time statistics, one more probed round each)",
        "",
        "| program | io_uring round | cold-read round |",
        "|---|---|---|",
        *prog_rows,
        "",
        f"The cold-read round added {pages:,} page-cache entries" if pages else "",
        "",
        "Regenerate: `sudo .venv/bin/python -m bench.async_cost` (writes async_cost.json, "
        ".md, .png here).",
        "",
    ])


def plot(d: dict, path: Path) -> None:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed: no plot (.venv/bin/pip install matplotlib)")
        return
    fig, ax = plt.subplots(figsize=(5, 3.4))
    for x, key in enumerate(("uring", "cold")):
        paired = [p / q for q, p in zip(d[key]["bare"], d[key]["probed"])]
        ax.bar(x, paired_ratio(d[key])[2], color=["#4c72b0", "#dd8452"][x], alpha=0.6)
        ax.scatter([x] * len(paired), paired, color="black", s=10, zorder=3)
    ax.set_xticks([0, 1], ["io_uring 4k randread", "cold reads (page-cache fills)"])
    ax.axhline(1.0, color="grey", lw=0.8)
    ax.set_ylabel("rate with / without probe")
    fig.suptitle(f"{d['cpu']}, {d['vcpus']} vCPUs, {d['kernel']}", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=90)


if __name__ == "__main__":
    main()
