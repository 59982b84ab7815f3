"""Accuracy of tracehound's I/O byte counters over time, against fio.

Runs rate-limited fio phases (psync, io_uring, libaio with O_DIRECT, mmap),
each in a fresh cgroup v2 directory, under the real agent from this checkout
and a real Prometheus scraping it every second. Per phase it compares the
total bytes fio moved with the counter's increase, and the counter's rate over
each second (read by this script every 1.0 s, and by Prometheus) with fio's
own per-second bandwidth log.

    sudo .venv/bin/python -m bench.accuracy [--phase-seconds 10] [--hook-mode auto]
        [--out bench/report] [--quick] [--no-prometheus] [--only psync-write,mmap-read]

Needs root, fio, /usr/bin/prometheus (unless --no-prometheus). Writes
accuracy.md, accuracy.json and accuracy.png to the output folder.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import re
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass, field

from bench.accuracy import report as accuracy_report
from bench.accuracy.readers import (FILL, READ, SAMPLE_S, WRITE, Sampler, prometheus_phase,
                                    prometheus_series, start_prometheus)
from bench.common import REPO, REPORT, commit, cpu_model, loadavg, machine, tracehound
from bench.tracer import Tool
from testbed.cgroups import exec_in_cgroup, remove_cgroup
from tracehound.clients.prometheus import wait_ready
from tracehound.host.mounts import MountTable

SRC = os.path.join(REPO, "src")
SETTLE_S = 2.5          # after fio exits: at least two more samples from both readers
MiB = 1 << 20


@dataclass
class Phase:
    name: str
    engine: str
    rw: str                 # fio --rw: "write" or "read"
    mib_s: int              # fio --rate, MiB/s
    bs: str
    file: str               # in the scratch directory; read phases read what a write phase left
    extra: list = field(default_factory=list)
    fresh: bool = False     # read a newly written, fsynced file (whose cache fio then drops)
    # the scratch device's read-ahead during the phase (None: leave it): the
    # page-cache fill moves one read-ahead window at a time
    read_ahead_kb: int | None = None

    @property
    def metric(self) -> str:
        if self.engine == "mmap":
            return FILL
        return WRITE if self.rw == "write" else READ


PHASES = [
    Phase("psync-write", "psync", "write", 40, "256k", "seq.dat"),
    Phase("psync-read", "psync", "read", 80, "256k", "seq.dat"),
    Phase("uring-write", "io_uring", "write", 20, "256k", "uring.dat", ["--iodepth=8"]),
    Phase("uring-read", "io_uring", "read", 30, "256k", "uring.dat", ["--iodepth=8"]),
    Phase("aio-write", "libaio", "write", 30, "256k", "aio.dat", ["--direct=1", "--iodepth=8"]),
    Phase("aio-read", "libaio", "read", 50, "256k", "aio.dat", ["--direct=1", "--iodepth=8"]),
    # 128 KiB, the kernel's default: with a VM disk's 8 MiB the fill moves in
    # 16 MiB windows, 40 % of a second's bytes at this rate, and a 1-s rate
    # says more about where the readings fell than about the counter
    Phase("mmap-read", "mmap", "read", 40, "1M", "mmap.dat", fresh=True, read_ahead_kb=128),
]


def on_signal(signum, _frame):
    raise SystemExit(128 + signum)


def hold_signals() -> None:
    """While cleaning up: a second Ctrl-C must not leave half of it undone."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.SIG_IGN)


class Scratch:
    """A directory on the root ext4 under /var/tmp, bind-mounted onto itself so
    the phases' I/O has a mountpoint of its own (fio's dynamic loader reads
    library headers on "/" after it joined the cgroup), a tmpfs-backed folder
    for fio's logs, and the parent cgroup of the phases."""

    def __init__(self):
        tag = uuid.uuid4().hex[:8]
        self.cg_root = MountTable().cgroup2_root()
        if self.cg_root is None:
            raise SystemExit("no cgroup v2 hierarchy mounted")
        self.cg_parent = f"/thbench-accuracy-{tag}"
        self.dir = f"/var/tmp/thbench-accuracy-{tag}"
        self.logs = tempfile.mkdtemp(prefix=f"thbench-accuracy-{tag}-", dir="/dev/shm")
        self.mounted = False
        self.cgroups: list[str] = []

    def __enter__(self):
        try:
            os.makedirs(self.dir)
            subprocess.run(["mount", "--bind", self.dir, self.dir], check=True)
            self.mounted = True
            os.makedirs(self.cg_root + self.cg_parent)
            self.cgroups.append(self.cg_parent)
        except BaseException:
            self.__exit__()
            raise
        return self

    def cgroup(self, name: str) -> str:
        rel = f"{self.cg_parent}/{name}"
        os.makedirs(self.cg_root + rel)
        self.cgroups.append(rel)
        return rel

    def path(self, name: str) -> str:
        return os.path.join(self.dir, name)

    def __exit__(self, *exc):
        for rel in reversed(self.cgroups):
            kill = self.cg_root + rel + "/cgroup.kill"     # what is left of an interrupted fio
            try:
                with open(kill, "w") as f:
                    f.write("1")
            except OSError:
                pass
            remove_cgroup(self.cg_root + rel)
        if self.mounted:
            if subprocess.run(["umount", self.dir]).returncode != 0:
                subprocess.run(["umount", "-l", self.dir])
        subprocess.run(["rm", "-rf", self.dir, self.logs])


def fio_cmd(ph: Phase, path: str, size: int, runtime: float, log_prefix: str) -> list[str]:
    return ["fio", f"--name={ph.name}", f"--filename={path}", f"--ioengine={ph.engine}",
            f"--rw={ph.rw}", f"--bs={ph.bs}", f"--size={size}", f"--rate={ph.mib_s}M",
            "--time_based", f"--runtime={runtime:g}", f"--write_bw_log={log_prefix}",
            "--log_avg_msec=1000", "--log_unix_epoch=1", "--output-format=json", *ph.extra]


def read_ahead_path(directory: str) -> str | None:
    """The sysfs file of the read-ahead of the device backing `directory`."""
    st = os.stat(directory)
    path = f"/sys/class/bdi/{os.major(st.st_dev)}:{os.minor(st.st_dev)}/read_ahead_kb"
    return path if os.path.exists(path) else None


@contextlib.contextmanager
def read_ahead(directory: str, kb: int | None):
    """Set the read-ahead of `directory`'s device for the block's duration and
    put the old value back on any exit; yields the value in force."""
    path = read_ahead_path(directory) if kb is not None else None
    if path is None:
        yield None
        return
    with open(path) as f:
        old = int(f.read())
    with open(path, "w") as f:
        f.write(str(kb))
    try:
        yield kb
    finally:
        with open(path, "w") as f:
            f.write(str(old))


def prepare_file(path: str, size: int) -> None:
    """Write and fsync a file outside the phases' cgroups (its pages are clean,
    so fio's invalidate=1 can drop them)."""
    subprocess.run(["fio", "--name=prep", f"--filename={path}", "--rw=write", "--bs=1M",
                    f"--size={size}", "--ioengine=psync", "--end_fsync=1",
                    "--output-format=terse"], check=True, stdout=subprocess.DEVNULL)


def resident_bytes(path: str) -> int | None:
    out = subprocess.run(["fincore", "-b", "-n", "-o", "RES", path], capture_output=True,
                         text=True)
    try:
        return int(out.stdout.split()[0])
    except (IndexError, ValueError):
        return None


def parse_fio_json(text: str) -> dict:
    return json.loads(text[text.index("{"):])


def read_bw_log(path: str) -> list[list[int]]:
    """fio 3.33 bandwidth log: time (ms; Unix epoch with --log_unix_epoch), value
    (KiB/s), data direction (0 read, 1 write), block size, offset/priority."""
    rows = []
    with open(path) as f:
        for line in f:
            parts = [p.strip() for p in line.split(",")]
            if len(parts) >= 3 and parts[0]:
                rows.append([int(parts[0]), int(parts[1]), int(parts[2])])
    return rows


def run_phase(ph: Phase, scratch: Scratch, runtime: float, agent_url: str,
              later: list[Phase]) -> dict:
    path = scratch.path(ph.file)
    rec = {"name": ph.name, "engine": ph.engine, "rw": ph.rw, "rate_mib_s": ph.mib_s,
           "bs": ph.bs, "extra": ph.extra, "metric": ph.metric, "runtime_s": runtime,
           "file": path}
    if ph.rw == "write":
        size = int(ph.mib_s * runtime) * MiB
    else:
        if ph.fresh or not os.path.exists(path):
            if os.path.exists(path):
                os.unlink(path)
            # no wrap-around: the whole read must come from the disk; room for read-ahead
            prepare_file(path, int(ph.mib_s * runtime + 64) * MiB)
            rec["prepared_fresh"] = True
        size = os.path.getsize(path)
        rec["resident_before"] = resident_bytes(path)
    rec["size"] = size
    cg = scratch.cgroup(ph.name)
    rec["cgroup"] = cg
    prefix = os.path.join(scratch.logs, ph.name)
    cmd = fio_cmd(ph, path, size, runtime, prefix)
    rec["fio_cmd"] = " ".join(cmd)
    print(f"accuracy: {ph.name}: {ph.engine} {ph.rw} {ph.mib_s} MiB/s for {runtime:g} s",
          flush=True)
    # start at a random point of the readers' second, so that where fio's
    # seconds fall against the readings is a draw, not an artefact of the loop
    time.sleep(random.uniform(0, SAMPLE_S))
    with read_ahead(scratch.dir, ph.read_ahead_kb) as kb:
        rec["read_ahead_kb"] = kb
        rec["wall_start"] = time.time()
        out = exec_in_cgroup(scratch.cg_root, cg, cmd)
        rec["wall_end"] = time.time()
    if out.returncode != 0:
        raise RuntimeError(f"{ph.name}: fio failed ({out.returncode}):\n{out.stderr[-2000:]}")
    job = parse_fio_json(out.stdout)["jobs"][0]
    rec["fio_io_bytes"] = job[ph.rw]["io_bytes"]
    rec["fio_runtime_ms"] = job["job_runtime"]
    rec["fio_error"] = job["error"]
    rec["fio_log"] = read_bw_log(prefix + "_bw.1.log")
    if ph.rw == "read":
        rec["resident_after"] = resident_bytes(path)
    time.sleep(SETTLE_S)
    final = Sampler(agent_url, cg).scrape()
    rec["final"] = {f"{m}|{mnt}": v for (m, _, mnt), v in final["values"].items()}
    if not any(p.file == ph.file for p in later):
        os.unlink(path)
    return rec


def host_facts() -> dict:
    facts = {"machine": machine(), "kernel": os.uname().release, "cpus": os.cpu_count(),
             "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "commit": commit(),
             "loadavg_start": " ".join(loadavg()), "cpu_model": cpu_model()}
    for cmd, key in ((["fio", "--version"], "fio"), (["/usr/bin/prometheus", "--version"],
                                                     "prometheus")):
        try:
            out = subprocess.run(cmd, capture_output=True, text=True)
            facts[key] = (out.stdout or out.stderr).splitlines()[0].strip()
        except (OSError, IndexError):
            facts[key] = "absent"
    ra = read_ahead_path("/var/tmp")
    if ra is not None:
        with open(ra) as f:
            facts["read_ahead_kb"] = int(f.read())
    facts["scratch_fs"] = subprocess.run(
        ["findmnt", "-n", "-o", "SOURCE,FSTYPE", "--target", "/var/tmp"],
        capture_output=True, text=True).stdout.strip()
    return facts


def main() -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.accuracy",
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=str(REPORT))
    ap.add_argument("--phase-seconds", type=float, default=10.0)
    ap.add_argument("--hook-mode", default="auto",
                    choices=("auto", "fentry", "kprobe", "tracepoint"))
    ap.add_argument("--quick", action="store_true", help="6-s phases: a smoke test only")
    ap.add_argument("--no-prometheus", action="store_true")
    ap.add_argument("--only", default="", help="comma-separated phase names")
    args = ap.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("needs root: loads BPF programs and makes cgroups")
    runtime = 6.0 if args.quick else args.phase_seconds
    phases = [p for p in PHASES if not args.only or p.name in args.only.split(",")]
    if not phases:
        raise SystemExit(f"no such phase; phases: {', '.join(p.name for p in PHASES)}")
    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)

    res = {"host": host_facts(), "settings": {
        "phase_seconds": runtime, "hook_mode": args.hook_mode, "quick": args.quick,
        "sample_s": SAMPLE_S, "settle_s": SETTLE_S, "prometheus": not args.no_prometheus,
        "skip_s": accuracy_report.SKIP_S, "tolerance": accuracy_report.TOLERANCE}}
    agent = prom = sampler = None
    prom_dir = None
    with Scratch() as scratch:
        try:
            env = {**os.environ, "PYTHONPATH": SRC}
            # the phases' cgroups are v2 ones: on a hybrid host the agent's own
            # choice is the v1 freezer hierarchy (Slurm's), which would see none
            agent = Tool("tracehound", tracehound() + ["run", "--listen", "127.0.0.1:0",
                                                       "--hook-mode", args.hook_mode,
                                                       "--cgroup-key", "v2"],
                         ready="serving metrics on", env=env)
            agent.start()
            url = agent.url()
            time.sleep(0.5)     # the probe mode lines follow the ready line
            res["agent_lines"] = list(agent.lines)
            res["hook_modes"] = {m.group(1): m.group(2) for m in
                                 (re.search(r"probe (\S+)\s+mode (\S+)", ln)
                                  for ln in agent.lines) if m}
            res["scratch"] = {"dir": scratch.dir, "cgroup_parent": scratch.cg_parent,
                              "cgroup2_root": scratch.cg_root}
            if not args.no_prometheus:
                prom_dir = tempfile.mkdtemp(prefix="thbench-accuracy-prom-", dir="/var/tmp")
                prom, prom_url = start_prometheus(url, prom_dir)
                wait_ready(prom_url, timeout=60)
                res["prometheus_start"] = time.time()
            # half a period away from Prometheus: a scrape that arrives while
            # another's collection runs joins it and gets its (older) values
            phase = None
            if prom is not None:
                prom_phase = prometheus_phase(prom_url)
                res["prometheus_phase"] = prom_phase
                if prom_phase is not None:
                    phase = (prom_phase + SAMPLE_S / 2) % 1.0
            sampler = Sampler(url, scratch.cg_parent, phase)
            sampler.start()
            time.sleep(2 * SAMPLE_S)    # a baseline before the first phase
            res["phases"] = []
            for i, ph in enumerate(phases):
                res["phases"].append(run_phase(ph, scratch, runtime, url, phases[i + 1:]))
                agent.check_alive()
            sampler.stop()
            res["scrape_errors"] = sampler.errors
            res["scrape_seconds"] = [round(s["t1"] - s["t0"], 4) for s in sampler.samples]
            res["agent_samples"] = [{"t": s["t"], "t1": s["t1"], "values": {
                f"{m}|{cg}|{mnt}": v for (m, cg, mnt), v in s["values"].items()}}
                for s in sampler.samples]
            if prom is not None:
                end = time.time()
                span = int(end - res["prometheus_start"]) + 10
                res["prometheus_samples"] = prometheus_series(prom_url, scratch.cg_parent,
                                                              end, span)
        finally:
            hold_signals()
            if sampler is not None:
                sampler.stop()
            if prom is not None:
                prom.terminate()
                try:
                    prom.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    prom.kill()
                    prom.wait()
            if prom_dir:
                subprocess.run(["rm", "-rf", prom_dir])
            if agent is not None:
                agent.stop()
    res["host"]["loadavg_end"] = " ".join(loadavg())
    summary = accuracy_report.write_reports(args.out, res)
    for line in summary:
        print(line)
    # a run whose counters missed their totals measured nothing else right:
    # bench/run all must see it fail
    return 1 if any(line.startswith("MISS read/write counter totals") for line in summary) else 0


if __name__ == "__main__":
    sys.exit(main())
