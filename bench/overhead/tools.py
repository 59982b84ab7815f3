"""Helpers of bench/overhead (the tracers themselves run as bench.tracer.Tool):
the BPF programs' run statistics, fio, and the numbers drawn from
interleaved rounds."""
from __future__ import annotations

import ctypes
import datetime as dt
import errno
import json
import os
import platform
import re
import statistics
import subprocess

from bench.common import REPO, commit, cpu_model, loadavg, sh
from tracehound.host.mounts import MountTable


def tree_env() -> dict:
    """Environment that runs this checkout's agent: the venv holds an installed
    copy of the package, which may lag behind src/."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO / "src"), env.get("PYTHONPATH")) if p)
    return env


def agent_has_option(agent: list[str], option: str) -> bool:
    """Whether `tracehound run --help` lists an option: its own line in the
    options, so neither a longer name that starts the same nor a mention in
    another option's help counts."""
    out = subprocess.run(agent[:2] + ["--help"], capture_output=True, text=True, env=tree_env())
    if out.returncode:
        raise RuntimeError(f"{' '.join(agent[:2])} --help failed:\n{out.stderr[-2000:]}")
    return re.search(r"^\s*" + re.escape(option) + r"(?![\w-])", out.stdout, re.M) is not None


# ---- programs a process owns -------------------------------------------------

def prog_stats(ids: set[int]) -> dict[int, dict]:
    progs = json.loads(sh(["bpftool", "prog", "show", "-j"]))
    return {p["id"]: {"name": p.get("name", "?"), "type": p.get("type", "?"),
                      "run_time_ns": p.get("run_time_ns", 0), "run_cnt": p.get("run_cnt", 0)}
            for p in progs if p["id"] in ids}


def stats_delta(before: dict[int, dict], after: dict[int, dict]) -> list[dict]:
    progs = []
    for pid, a in sorted(after.items()):
        b = before.get(pid, a)
        t, n = a["run_time_ns"] - b["run_time_ns"], a["run_cnt"] - b["run_cnt"]
        progs.append({"id": pid, "name": a["name"], "type": a["type"], "run_time_ns": t,
                      "run_cnt": n, "ns_per_run": t / n if n else None})
    return progs


# bpf(2): uapi linux/bpf.h
NR_BPF = {"x86_64": 321, "aarch64": 280}
BPF_ENABLE_STATS, BPF_STATS_RUN_TIME = 32, 0
_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long


class _EnableStats(ctypes.Structure):
    _fields_ = [("type", ctypes.c_uint32)]


def enable_stats() -> int:
    """BPF run-time statistics on for as long as the returned fd is open.
    The kernel counts each holder apart from kernel.bpf_stats_enabled, so
    another tool writing 0 to that sysctl meanwhile (benches restoring it do)
    cannot switch them off under the cost runs."""
    nr = NR_BPF.get(platform.machine())
    if nr is None:
        raise OSError(errno.ENOSYS, f"bpf(2) number unknown on {platform.machine()}")
    attr = _EnableStats(type=BPF_STATS_RUN_TIME)
    fd = _libc.syscall(ctypes.c_long(nr), ctypes.c_long(BPF_ENABLE_STATS),
                       ctypes.c_void_p(ctypes.addressof(attr)), ctypes.c_long(ctypes.sizeof(attr)))
    if fd < 0:
        err = ctypes.get_errno()
        raise OSError(err, f"BPF_ENABLE_STATS: {os.strerror(err)}")
    return fd


# ---- the kernel and the mounts the tools see ----------------------------------

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

def fio_cmd(name: str, wl: dict, path: str, size_mib: int, runtime: int, cpu: int | None) -> list[str]:
    cmd = ["fio", f"--name={name}", f"--filename={path}", f"--size={size_mib}M",
           f"--rw={wl['rw']}", f"--bs={wl['bs']}", "--ioengine=psync", "--numjobs=1",
           "--time_based", f"--runtime={runtime}", "--norandommap", "--invalidate=0",
           "--output-format=json"]
    if cpu is not None:
        cmd.append(f"--cpus_allowed={cpu}")
    return cmd


def run_fio(cmd: list[str], direction: str) -> dict:
    job = json.loads(sh(cmd))["jobs"][0]
    d = job[direction]
    return {"iops": d["iops"], "bw_mib_s": d["bw_bytes"] / (1 << 20), "total_ios": d["total_ios"],
            "runtime_ms": d["runtime"], "usr_cpu": job["usr_cpu"], "sys_cpu": job["sys_cpu"]}


# ---- numbers -----------------------------------------------------------------

def pool_rounds(rounds: list[dict]) -> dict:
    """A condition's cost runs over several rounds (one fresh start each) as
    one: run times, runs and I/Os summed, programs by name (their ids change
    with every start). Each workload keeps its rounds' own figures, so that
    a net can be taken against the floor of the same round (report.add_floors)."""
    if len(rounds) == 1:
        out = dict(rounds[0])
        for x in out["workloads"].values():
            x["rounds"] = [round_figures(x)]
        return out
    workloads = {}
    for w in rounds[0]["workloads"]:
        xs = [r["workloads"][w] for r in rounds]
        progs: dict[tuple, dict] = {}
        for x in xs:
            for q in x["programs"]:
                p = progs.setdefault((q["name"], q["type"]), {"id": [], "name": q["name"], "type": q["type"],
                                                               "run_time_ns": 0, "run_cnt": 0})
                p["id"].append(q["id"])
                p["run_time_ns"] += q["run_time_ns"]
                p["run_cnt"] += q["run_cnt"]
        for p in progs.values():
            p["id"] = "/".join(map(str, p["id"]))
            p["ns_per_run"] = p["run_time_ns"] / p["run_cnt"] if p["run_cnt"] else None
        ios = sum(x["fio"]["total_ios"] for x in xs)
        total = sum(x["total_run_time_ns"] for x in xs)
        workloads[w] = {"fio": {"total_ios": ios, "iops": statistics.median(x["fio"]["iops"] for x in xs)},
                        "programs": list(progs.values()), "total_run_time_ns": total,
                        "program_runs": sum(x["program_runs"] for x in xs), "ns_per_io": total / ios,
                        "rounds": [round_figures(x) for x in xs]}
    counted = None
    if rounds[0]["counted"] is not None:
        counted = {d: sum(r["counted"][d] for r in rounds) for d in rounds[0]["counted"]}
    return {"programs": rounds[0]["programs"], "workloads": workloads, "counted": counted,
            "fio_ios": {d: sum(r["fio_ios"][d] for r in rounds) for d in rounds[0]["fio_ios"]}}


def round_figures(x: dict) -> dict:
    return {"ns_per_io": x["ns_per_io"], "total_run_time_ns": x["total_run_time_ns"],
            "program_runs": x["program_runs"], "total_ios": x["fio"]["total_ios"]}


def summarize(iops: dict[str, list[float]]) -> dict:
    """Per condition: median and spread of its rounds, loss against the
    baseline, and for the baseline how far its own rounds stray from their
    median, the run-to-run noise a loss has to stand out of."""
    base_v = iops["baseline"]
    base = statistics.median(base_v)
    out = {}
    for cond, v in iops.items():
        med = statistics.median(v)
        # paired per-round ratios: each round's run next to that round's baseline
        paired = [(1 - t / b) * 100 for t, b in zip(v, base_v)]
        out[cond] = {"iops": v, "median": med, "min": min(v), "max": max(v),
                     "stdev_pct": 100 * statistics.stdev(v) / statistics.mean(v) if len(v) > 1 else 0.0,
                     "loss_pct": (1 - med / base) * 100,
                     "loss_pct_paired": statistics.median(paired),
                     "loss_pct_paired_min": min(paired), "loss_pct_paired_max": max(paired),
                     "added_ns_per_io": 1e9 / med - 1e9 / base}
    b = out["baseline"]
    b["noise_down_pct"] = (1 - b["min"] / base) * 100
    b["noise_up_pct"] = (b["max"] / base - 1) * 100
    for cond, t in out.items():
        # within noise: the condition's median is no slower than the slowest
        # baseline round
        t["within_noise"] = t["loss_pct"] <= b["noise_down_pct"]
    return out


def facts() -> dict:
    return {"date": dt.datetime.now().astimezone().isoformat(timespec="seconds"),
            "kernel": platform.release(), "cpu": cpu_model() or "?",
            "nproc": os.cpu_count(), "fio": sh(["fio", "--version"]).strip(),
            "bpftrace": sh(["bpftrace", "--version"]).strip(),
            "bpftool": sh(["bpftool", "version"]).splitlines()[0],
            "tracehound_commit": commit(REPO, ("src",)), "loadavg_start": loadavg()}
