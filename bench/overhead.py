#!/usr/bin/env python3
"""Overhead of the tracehound agent on the cheapest I/O there is: 4 KiB random
reads from the page cache (tmpfs), next to no tracing and to an equivalent
bpftrace script. Run as root:  python bench/overhead.py [--quick]

Two phases:
  throughput  fio IOPS per condition, conditions interleaved over rounds so
              drift and neighbours' noise hit every condition alike; BPF run
              statistics are off (they cost time themselves)
  cost        one run per tool with kernel.bpf_stats_enabled=1: run_time_ns
              and run_cnt of the tool's own programs, delta over a fio run
"""
from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import queue
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

from overhead_report import CONDITIONS, write_reports

from tracehound.progress import steps

from tracehound.host.mounts import MountTable

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
AGENT = [str(REPO / ".venv/bin/tracehound"), "run", "--listen", "127.0.0.1:0"]
BT_SCRIPT = HERE / "baseline.bt"
STATS_SYSCTL = Path("/proc/sys/kernel/bpf_stats_enabled")
# Two empty tp_btf programs on every syscall: the dispatch floor of the
# tracepoint mode, and what bpf_stats reports for doing nothing.
EMPTY = [str(REPO / ".venv/bin/python"), str(HERE / "empty_hooks.py")]


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def sh(cmd: list[str]) -> str:
    return subprocess.run(cmd, check=True, capture_output=True, text=True).stdout


# ---- programs a process owns -------------------------------------------------

def owned_prog_ids(pid: int) -> set[int]:
    """BPF programs held by a process, through its prog and link fds. Diffing
    the global program list would also catch whatever else loads BPF on the
    machine meanwhile (tests, other agents)."""
    ids = set()
    fd_dir = Path(f"/proc/{pid}/fd")
    for fd in os.listdir(fd_dir):
        try:
            target = os.readlink(fd_dir / fd)
            if "bpf-prog" not in target and "bpf_link" not in target:
                continue
            m = re.search(r"^prog_id:\s*(\d+)", Path(f"/proc/{pid}/fdinfo/{fd}").read_text(), re.M)
        except OSError:
            continue
        if m:
            ids.add(int(m.group(1)))
    return ids


def prog_stats(ids: set[int]) -> dict[int, dict]:
    progs = json.loads(sh(["bpftool", "prog", "show", "-j"]))
    return {p["id"]: {"name": p.get("name", "?"), "type": p.get("type", "?"),
                      "run_time_ns": p.get("run_time_ns", 0), "run_cnt": p.get("run_cnt", 0)}
            for p in progs if p["id"] in ids}


# ---- tools under test --------------------------------------------------------

class Tool:
    """A tracer running in the background; output is drained by a thread so
    a full pipe never stalls it."""

    def __init__(self, name: str, cmd: list[str], ready: str, stop_sig: int):
        self.name, self.cmd, self.ready, self.stop_sig = name, cmd, ready, stop_sig
        self.lines: list[str] = []
        self.q: queue.Queue = queue.Queue()
        self.proc: subprocess.Popen | None = None
        self.prog_ids: set[int] = set()

    def _drain(self) -> None:
        for line in self.proc.stdout:
            self.lines.append(line.rstrip("\n"))
            self.q.put(line)
        self.q.put(None)

    def start(self, timeout: float = 60) -> None:
        self.lines = []
        self.q = queue.Queue()
        self.proc = subprocess.Popen(self.cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     text=True, start_new_session=True)
        self.drainer = threading.Thread(target=self._drain, daemon=True)
        self.drainer.start()
        deadline = time.monotonic() + timeout
        while True:
            try:
                line = self.q.get(timeout=max(0.1, deadline - time.monotonic()))
            except queue.Empty:
                line = None
            if line is None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"{self.name} did not get ready:\n" + "\n".join(self.lines[-20:]))
            if re.search(self.ready, line):
                break
        # "ready" is printed before or while attaching: wait until the set of
        # programs it holds stops changing
        last, stable_since = set(), time.monotonic()
        while time.monotonic() < deadline:
            ids = owned_prog_ids(self.proc.pid)
            if ids != last:
                last, stable_since = ids, time.monotonic()
            elif ids and time.monotonic() - stable_since > 0.7:
                break
            time.sleep(0.1)
        if not last:
            self.stop()
            raise RuntimeError(f"{self.name} holds no BPF programs")
        self.prog_ids = last

    def check_alive(self) -> None:
        """A tracer that died mid-run would make its round a baseline round."""
        if self.proc.poll() is not None:
            self.drainer.join(timeout=5)
            raise RuntimeError(f"{self.name} exited ({self.proc.returncode}) during the run:\n"
                               + "\n".join(self.lines[-20:]))

    def stop(self) -> None:
        if not self.proc or self.proc.poll() is not None:
            return
        try:
            self.proc.send_signal(self.stop_sig)
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        self.drainer.join(timeout=5)  # bpftrace prints its maps on the way out

    def url(self) -> str | None:
        for line in self.lines:
            m = re.search(r"serving metrics on (\S+)", line)
            if m:
                return m.group(1)
        return None


def mount_offset() -> int:
    """Offset of struct vfsmount inside struct mount, from the kernel's BTF."""
    raw = sh(["bpftool", "btf", "dump", "file", "/sys/kernel/btf/vmlinux", "format", "raw"])
    m = re.search(r"STRUCT 'mount' size=\d+ vlen=\d+\n(?:\t.*\n)*?\t'mnt' type_id=\d+ bits_offset=(\d+)", raw)
    if not m:
        raise RuntimeError("struct mount not found in vmlinux BTF")
    return int(m.group(1)) // 8


def mount_id_of(path: str) -> int:
    for m in MountTable().mounts:
        if m.mountpoint == path:
            return m.mnt_id
    raise RuntimeError(f"{path} is not a mount point")


# ---- fio ---------------------------------------------------------------------

def fio_cmd(args, path: str) -> list[str]:
    cmd = ["fio", "--name=randread", f"--filename={path}", f"--size={args.size_mib}M",
           "--rw=randread", "--bs=4k", "--ioengine=psync", "--numjobs=1", "--time_based",
           f"--runtime={args.runtime}", "--norandommap", "--invalidate=0",
           "--output-format=json"]
    if args.cpu is not None:
        cmd.append(f"--cpus_allowed={args.cpu}")
    return cmd


def run_fio(cmd: list[str]) -> dict:
    job = json.loads(sh(cmd))["jobs"][0]
    return {"iops": job["read"]["iops"], "total_ios": job["read"]["total_ios"],
            "runtime_ms": job["read"]["runtime"], "usr_cpu": job["usr_cpu"], "sys_cpu": job["sys_cpu"]}


# ---- phases ------------------------------------------------------------------

def throughput(args, tools: dict[str, Tool | None], fio: list[str]) -> dict:
    iops = {c: [] for c in CONDITIONS}
    with steps(args.rounds * len(CONDITIONS), "throughput") as bar:
        for r in range(args.rounds):
            # rotate the order each round so no condition always runs first
            k = r % len(CONDITIONS)
            for cond in CONDITIONS[k:] + CONDITIONS[:k]:
                tool = tools[cond]
                if tool:
                    tool.start()
                try:
                    res = run_fio(fio)
                    if tool:
                        tool.check_alive()
                finally:
                    if tool:
                        tool.stop()
                iops[cond].append(res["iops"])
                bar.advance(f"round {r + 1}/{args.rounds} {cond:<10} {res['iops']:>10.0f} IOPS")
    base = statistics.median(iops["baseline"])
    out = {}
    for cond, v in iops.items():
        med = statistics.median(v)
        # paired per-round ratios: each round's tool run next to that round's baseline
        paired = [t / b for t, b in zip(v, iops["baseline"])]
        out[cond] = {"iops": v, "median": med, "min": min(v), "max": max(v),
                     "loss_pct": (1 - med / base) * 100,
                     "loss_pct_paired": (1 - statistics.median(paired)) * 100,
                     "added_ns_per_io": 1e9 / med - 1e9 / base}
    return out


def cost(tool: Tool, fio: list[str], tmp: str, mnt_id: int) -> dict:
    tool.start()
    try:
        before = prog_stats(tool.prog_ids)
        res = run_fio(fio)
        after = prog_stats(tool.prog_ids)
        tool.check_alive()
        seen = counted_reads(tool, tmp)
    finally:
        tool.stop()
    if tool.name == "bpftrace":
        seen = sum(int(n) for _cg, m, n in re.findall(r"^@calls\[(\d+), (\d+), 0\]: (\d+)",
                   "\n".join(tool.lines), re.M) if int(m) == mnt_id)
    progs = []
    for pid, a in sorted(after.items()):
        b = before.get(pid, a)
        t, n = a["run_time_ns"] - b["run_time_ns"], a["run_cnt"] - b["run_cnt"]
        progs.append({"id": pid, "name": a["name"], "type": a["type"], "run_time_ns": t,
                      "run_cnt": n, "ns_per_run": t / n if n else None})
    total = sum(p["run_time_ns"] for p in progs)
    return {"fio": res, "programs": progs, "total_run_time_ns": total,
            "program_runs": sum(p["run_cnt"] for p in progs),
            "ns_per_io": total / res["total_ios"], "reads_counted": seen,
            "coverage_pct": 100 * seen / res["total_ios"] if seen is not None else None}


def counted_reads(tool: Tool, mountpoint: str) -> int | None:
    """Reads the agent attributed to the benchmark mount: proof that the
    measured configuration really accounted fio's I/O."""
    if tool.name != "tracehound" or not tool.url():
        return None
    text = urllib.request.urlopen(tool.url(), timeout=10).read().decode()
    total = None
    for line in text.splitlines():
        if re.match(r"tracehound_io_read_(requests|calls)_total\{", line) and \
                f'mountpoint="{mountpoint}"' in line:
            total = (total or 0) + int(float(line.rsplit(" ", 1)[1]))
    return total


def facts() -> dict:
    cpu = re.search(r"model name\s*:\s*(.*)", Path("/proc/cpuinfo").read_text())
    dirty = subprocess.run(["git", "-C", str(REPO), "status", "--porcelain", "src"],
                           capture_output=True, text=True).stdout.strip()
    return {"date": dt.datetime.now().astimezone().isoformat(timespec="seconds"),
            "kernel": platform.release(), "cpu": cpu.group(1) if cpu else "?",
            "nproc": os.cpu_count(), "fio": sh(["fio", "--version"]).strip(),
            "bpftrace": sh(["bpftrace", "--version"]).strip(),
            "bpftool": sh(["bpftool", "version"]).splitlines()[0],
            "tracehound_commit": sh(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"]).strip()
            + (" + uncommitted changes in src/" if dirty else ""),
            "loadavg_start": Path("/proc/loadavg").read_text().split()[:3]}


# ---- main --------------------------------------------------------------------

def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="2 rounds of 2 s (smoke test)")
    ap.add_argument("--hook-mode", default="auto", choices=["auto", "fentry", "kprobe", "tracepoint"])
    ap.add_argument("--out", type=Path, default=HERE / "report")
    ap.add_argument("--rounds", type=int, help="interleaved rounds (default 5, quick 2)")
    ap.add_argument("--runtime", type=int, help="seconds per fio run (default 5, quick 2)")
    ap.add_argument("--size-mib", type=int, default=256, help="file size on the tmpfs")
    ap.add_argument("--cpu", type=int, help="CPU to pin fio to (default: the last one)")
    args = ap.parse_args()
    args.rounds = args.rounds or (2 if args.quick else 5)
    args.runtime = args.runtime or (2 if args.quick else 5)
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

    stats_before = STATS_SYSCTL.read_text().strip()
    tmp = tempfile.mkdtemp(prefix="tracehound-bench-")
    tools: dict[str, Tool | None] = {"baseline": None}
    mounted = False
    try:
        STATS_SYSCTL.write_text("0")
        subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={args.size_mib + 64}m,mode=0700",
                        "tracehound-bench", tmp], check=True)
        mounted = True
        data = f"{tmp}/data"
        log(f"laying out {args.size_mib} MiB on tmpfs {tmp}")
        with open(data, "wb") as fh:
            for _ in range(args.size_mib):
                fh.write(os.urandom(1 << 20))
        offset = mount_offset()
        bt_cmd = ["bpftrace", "-B", "none", str(BT_SCRIPT), str(offset)]
        agent_cmd = AGENT + ["--hook-mode", args.hook_mode]
        tools["tracehound"] = Tool("tracehound", agent_cmd, r"serving metrics on", signal.SIGTERM)
        tools["bpftrace"] = Tool("bpftrace", bt_cmd, r"Attaching \d+ probes", signal.SIGINT)
        tools["empty"] = Tool("empty", EMPTY, r"attached \d+ empty programs", signal.SIGINT)
        fio = fio_cmd(args, data)
        machine = facts()

        for name in ("tracehound", "bpftrace"):  # fail early, and show what attached
            t = tools[name]
            t.start()
            t.stop()
            log(f"{name}: {len(t.prog_ids)} BPF programs; " +
                "; ".join(l.strip() for l in t.lines if re.search(r"probe io\.|Attaching", l)))
        agent_modes = [re.sub(r"\s+", " ", l.split("tracehound: ")[-1])
                       for l in tools["tracehound"].lines if "probe io." in l]
        log(f"throughput: {args.rounds} rounds x {len(CONDITIONS)} conditions x {args.runtime} s")
        tp = throughput(args, tools, fio)
        for c in CONDITIONS[1:]:
            log(f"{c}: median {tp[c]['median']:.0f} IOPS, loss {tp[c]['loss_pct']:.2f} %")

        log("per-event cost with kernel.bpf_stats_enabled=1")
        STATS_SYSCTL.write_text("1")
        mnt_id = mount_id_of(tmp)
        cs = {}
        for name in ("tracehound", "bpftrace", "empty"):
            cs[name] = c = cost(tools[name], fio, tmp, mnt_id)
            log(f"{name}: {c['ns_per_io']:.1f} ns per I/O syscall, {c['program_runs']} runs of "
                f"{len(c['programs'])} programs" + ("" if c["reads_counted"] is None else
                f"; counted {c['reads_counted']} of fio's {c['fio']['total_ios']} reads"))
        STATS_SYSCTL.write_text(stats_before)
        machine["loadavg_end"] = Path("/proc/loadavg").read_text().split()[:3]

        res = {"settings": {"quick": args.quick, "rounds": args.rounds, "runtime_s": args.runtime,
                            "size_mib": args.size_mib, "cpu": args.cpu, "hook_mode": args.hook_mode},
               "machine": machine, "agent_modes": agent_modes,
               "commands": {"fio": fio, "tracehound": agent_cmd, "bpftrace": bt_cmd,
                            "empty": tools["empty"].cmd,
                            "stats": ["sysctl", "-w", "kernel.bpf_stats_enabled=1"]},
               "throughput": tp, "cost": cs}
        for t, m, ok in write_reports(args.out, res):
            log(f"{'MET ' if ok else 'MISS'} {t}: {m}")
        log(f"report in {args.out}/overhead.md")
        return 0
    finally:
        for t in tools.values():
            if t:
                t.stop()
        STATS_SYSCTL.write_text(stats_before)
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
        log(f"interrupted ({e or 'SIGINT'}); tracers stopped, bpf_stats restored")
        sys.exit(130)
    except (RuntimeError, subprocess.CalledProcessError) as e:
        log(f"failed: {e}")
        sys.exit(1)
