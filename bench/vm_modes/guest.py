"""The part of bench/vm_modes that runs inside the VM (`python -m bench.vm_modes
--guest DIR`): the conditions, fio on the tmpfs, the cost windows with
kernel.bpf_stats_enabled=1, the throughput rounds, and what each tool
counted next to what fio did. Results go to DIR/results.json after every
session, so a VM that dies part-way still leaves a report."""
from __future__ import annotations

import json
import os
import platform
import re
import shutil
import signal
import struct
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from bench.common import log, sh
from bench.vm_modes.common import CGROUP, MNT, MODES, REPO, STATS, WORKLOADS
from bench.vm_modes.tool import Tool, prog_names, prog_runs


def mount_offset() -> int:
    """Offset of struct vfsmount in struct mount (baseline.bt's argument), from
    the kernel's BTF through libbpf: a bpftool dump of all of it takes minutes
    under emulation."""
    import ctypes
    lb = ctypes.CDLL("libbpf.so.1")
    vp, u32 = ctypes.c_void_p, ctypes.c_uint32
    for fn, res, argt in (("btf__load_vmlinux_btf", vp, []), ("btf__free", None, [vp]),
                          ("btf__find_by_name_kind", ctypes.c_int, [vp, ctypes.c_char_p, u32]),
                          ("btf__type_by_id", vp, [vp, u32]),
                          ("btf__name_by_offset", ctypes.c_char_p, [vp, u32])):
        getattr(lb, fn).restype, getattr(lb, fn).argtypes = res, argt
    btf = lb.btf__load_vmlinux_btf()
    try:
        t = lb.btf__type_by_id(btf, lb.btf__find_by_name_kind(btf, b"mount", 4))  # BTF_KIND_STRUCT
        info = struct.unpack("<III", ctypes.string_at(t, 12))[1]
        for i in range(info & 0xFFFF):  # struct btf_member follows struct btf_type
            name, _type, off = struct.unpack("<III", ctypes.string_at(t + 12 * (i + 1), 12))
            if lb.btf__name_by_offset(btf, name) == b"mnt":
                return (off & 0xFFFFFF if info >> 31 else off) // 8
    finally:
        lb.btf__free(btf)
    raise RuntimeError("struct mount has no member mnt in the kernel's BTF")


def mount_id(path: str) -> int:
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        f = line.split()
        if f[4] == path:
            return int(f[0])
    raise RuntimeError(f"{path} is not mounted")


# ---- guest: what each tool counted ---------------------------------------------

def tracehound_counts(tool: Tool) -> dict:
    url = next(m.group(1) for l in tool.lines if (m := re.search(r"serving metrics on (\S+)", l)))
    got = {"read": 0, "write": 0}
    for line in urllib.request.urlopen(url, timeout=60).read().decode().splitlines():
        m = re.match(r"tracehound_io_(read|write)_requests_total\{(.*)\} (\S+)$", line)
        if m and f'mountpoint="{MNT}"' in m.group(2):
            got[m.group(1)] += int(float(m.group(3)))
    return got


def ceems_counts(tool: Tool, cgroup_id: int) -> dict:
    """Ask the holder to read CEEMS's maps (SIGUSR1), keep fio's cgroup and mount."""
    tool.proc.send_signal(signal.SIGUSR1)
    maps = json.loads(tool.next_line(r"^counts ").split(" ", 1)[1])
    got = {"read": 0, "write": 0}
    for op in got:
        for cid, mnt, _bytes, calls, _errors in maps[op]:
            if cid == cgroup_id & 0xFFFFFFFF and mnt == MNT:
                got[op] += calls
    got["keys_of_fio_cgroup"] = sorted({m for op in ("read", "write") for c, m, *_ in maps[op]
                                        if c == cgroup_id & 0xFFFFFFFF})
    return got


def bpftrace_counts(tool: Tool, mnt: int) -> dict:
    got = {"read": 0, "write": 0}
    for cg, m, op, n in re.findall(r"^@calls\[(\d+), (\d+), (\d)\]: (\d+)", "\n".join(tool.lines), re.M):
        if int(m) == mnt:
            got[("read", "write")[int(op)]] += int(n)
    return got


# ---- guest: fio and the run ----------------------------------------------------

def fio_cmd(cfg: dict, workloads: list[str], runtime: float) -> list[str]:
    """The workloads one after another (stonewall). fio's own clock reads are
    syscalls under emulation (hpet, no vDSO), which would charge the
    tracepoint hooks for work a real machine does not do: its TSC clock
    avoids them. --thread keeps the jobs in fio's process for /proc/PID/io."""
    cmd = ["fio", "--ioengine=psync", "--thread", "--clocksource=cpu", "--disk_util=0", "--numjobs=1",
           "--time_based", f"--runtime={runtime}", f"--size={cfg['size_mib']}M", "--invalidate=0",
           "--norandommap", "--output-format=json", f"--cpus_allowed={(os.cpu_count() or 1) - 1}"]
    for i, w in enumerate(workloads):
        f, rw, bs = WORKLOADS[w]
        cmd += [f"--name={w}", f"--filename={MNT}/{f}", f"--rw={rw}", f"--bs={bs}"]
        cmd += ["--stonewall"] * (i > 0)
    return cmd


def fio_start(cmd: list[str], cgroup: Path) -> subprocess.Popen:
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: (cgroup / "cgroup.procs").write_text(str(os.getpid())))


def fio_result(proc: subprocess.Popen) -> dict[str, dict]:
    """Its JSON report, which fio also prints when stopped with SIGINT."""
    out, err = proc.communicate(timeout=600)
    try:
        jobs = json.loads(out[out.index("{"):])["jobs"]
    except ValueError:
        raise RuntimeError(f"fio failed ({proc.returncode}): {err[-500:]}") from None
    res = {}
    for j in jobs:
        r, w = j["read"], j["write"]
        res[j["jobname"]] = {"ios": r["total_ios"] + w["total_ios"], "reads": r["total_ios"],
                             "writes": w["total_ios"], "iops": r["iops"] + w["iops"]}
    return res


def proc_io(pid: int) -> tuple[int, int]:
    """(read + write syscalls, bytes) of a process so far."""
    io = dict(l.split(": ") for l in Path(f"/proc/{pid}/io").read_text().splitlines())
    return int(io["syscr"]) + int(io["syscw"]), int(io["rchar"]) + int(io["wchar"])


def cost_run(cfg: dict, tool: Tool, w: str, cgroup: Path) -> dict:
    """BPF run time of the tool's programs over a window of fio's steady state,
    per read/write syscall fio made in it: fio's start-up and exit (hundreds of
    reads, writes and opens of its own) stay outside."""
    fio = fio_start(fio_cmd(cfg, [w], cfg["window"] + 60), cgroup)
    try:
        last = proc_io(fio.pid)[1]
        for _ in range(300):  # until it moves data: start-up reads only kilobytes
            time.sleep(0.1)
            now = proc_io(fio.pid)[1]
            if now - last >= 1 << 20:
                break
            last = now
        a, a_io = prog_runs(tool.proc.pid), proc_io(fio.pid)[0]
        time.sleep(cfg["window"])
        b, b_io = prog_runs(tool.proc.pid), proc_io(fio.pid)[0]
    finally:
        fio.send_signal(signal.SIGINT)  # rather than wait out a margin of runtime
        total = fio_result(fio)[w]
    progs = {}
    for pid, (cnt, ns) in b.items():
        c0, n0 = a.get(pid, (cnt, ns))
        if cnt > c0:
            p = progs.setdefault(tool.names.get(pid, str(pid)), {"runs": 0, "ns": 0})
            p["runs"] += cnt - c0
            p["ns"] += ns - n0
    ios, ns = b_io - a_io, sum(p["ns"] for p in progs.values())
    if ios <= 0:
        raise RuntimeError(f"fio made no I/O during the {cfg['window']} s window of {w}")
    return {"fio": total, "window_ios": ios, "programs": progs, "total_ns": ns, "ns_per_io": ns / ios,
            "runs_per_io": sum(p["runs"] for p in progs.values()) / ios}


def measure_cost(cfg: dict, tool: Tool, counter, cgroup: Path) -> dict:
    """Per workload, with kernel.bpf_stats_enabled=1; what the tool counted
    is read in between, with it off."""
    out = {}
    prev = counter() if counter else None
    for w in cfg["workloads"]:
        STATS.write_text("1")
        try:
            out[w] = cost_run(cfg, tool, w, cgroup)
        finally:
            STATS.write_text("0")
        if counter:
            now = counter()
            out[w]["counted"] = {k: now[k] - prev[k] if k in ("read", "write") else v for k, v in now.items()}
            prev = now
    return out


def conditions(cfg: dict, res: dict) -> dict[str, Tool | None]:
    py, me = sys.executable, "bench.vm_modes"  # --hold is parsed there
    agent = [py, "-m", "tracehound", "run", "--listen", "127.0.0.1:0"]
    latency_off = cfg["latency_flag"]
    if not latency_off:
        res["notes"].append("`tracehound run` has no `--latency` option in this tree: the latency-off "
                            "conditions are left out.")
    conds: dict[str, Tool | None] = {"baseline": None}
    for m in MODES:
        conds[f"th-{m}"] = Tool(f"th-{m}", agent + ["--hook-mode", m], r"serving metrics on")
        if latency_off:
            conds[f"th-{m}-nolat"] = Tool(f"th-{m}-nolat", agent + ["--hook-mode", m, "--latency", "off"],
                                          r"serving metrics on")
    if cfg.get("gap_flag"):
        # sampled timing with hardly a call timed: what no sampling gap removes
        conds["th-fentry-gap1s"] = Tool("th-fentry-gap1s", agent + [
            "--hook-mode", "fentry", "--latency-sample-gap", "1000000"], r"serving metrics on")
    for kind in ("empty-tp", "empty-fentry"):
        conds[kind] = Tool(kind, [py, "-m", me, "--hold", kind], r"^attached \d+", cwd=REPO)
    if shutil.which("bpftrace"):
        conds["bpftrace"] = Tool("bpftrace", ["bpftrace", "-B", "none", str(REPO / "bench" / "baseline.bt"),
                                              str(mount_offset())], r"Attaching \d+ probes", signal.SIGINT)
    else:
        res["skipped"]["bpftrace"] = "bpftrace is not installed"
    ceems = cfg["ceems"]
    if "objs" in ceems:
        # the CEEMS exporter's rule: bpf_vfs.o after 6.2, bpf_vfs_v62.o after 5.11, else _v511
        rel = tuple(int(x) for x in re.findall(r"\d+", platform.release())[:2])
        obj = "bpf_vfs.o" if rel > (6, 2) else "bpf_vfs_v62.o" if rel > (5, 11) else "bpf_vfs_v511.o"
        ceems["object"] = obj
        conds["ceems"] = Tool("ceems", [py, "-m", me, "--hold", "ceems", "--obj", f"{ceems['objs']}/{obj}"],
                              r"^attached \d+", cwd=REPO)
    else:
        res["skipped"]["ceems"] = ceems["note"]
    if cfg["conditions"]:
        conds = {k: v for k, v in conds.items() if k == "baseline" or k in cfg["conditions"]}
    return conds


def session(cfg: dict, res: dict, name: str, tool: Tool | None, r: int, cgroup: Path, mnt: int) -> dict:
    """One start of a condition: in the first --cost-rounds rounds its cost runs,
    then in every round a throughput run of all workloads."""
    if tool is None:
        return fio_result(fio_start(fio_cmd(cfg, cfg["workloads"], cfg["runtime"]), cgroup))
    tool.start()
    try:
        if r < cfg["cost_rounds"]:
            tool.names = prog_names(tool.prog_ids)
            if r == 0:
                res["tools"][name] = {"cmd": tool.cmd, "programs": len(tool.prog_ids),
                                      "status": [re.sub(r"\s+", " ", l) for l in tool.lines
                                                 if "probe io" in l or "tracehound: latency" in l
                                                 or l.startswith("attached")]}
            count = (lambda: tracehound_counts(tool)) if name.startswith("th-") else \
                (lambda: ceems_counts(tool, cgroup.stat().st_ino)) if name == "ceems" else None
            runs = res["cost_runs"].setdefault(name, {})
            for w, c in measure_cost(cfg, tool, count if r == 0 else None, cgroup).items():
                runs.setdefault(w, []).append(c)
                log(f"  {w}: {c['ns_per_io']:.0f} ns/syscall (emulated)")
                if "counted" in c:
                    res["counts"].setdefault(name, {})[w] = {"counted": c.pop("counted"), "fio": c["fio"]}
                    log(f"    counted {res['counts'][name][w]['counted']} of fio's {c['fio']['ios']}")
            # the run with the median cost stands for the condition, programs and all; of
            # an even count the lower middle, since emulation noise only adds time
            res["cost"][name] = {w: sorted(v, key=lambda c: c["ns_per_io"])[(len(v) - 1) // 2]
                                 for w, v in runs.items()}
        tp = fio_result(fio_start(fio_cmd(cfg, cfg["workloads"], cfg["runtime"]), cgroup))
        tool.check_alive()
    finally:
        tool.stop()
    if name == "bpftrace" and r == 0:  # its maps are printed on exit: the whole session
        ran = [v[0]["fio"] for v in res["cost_runs"].get(name, {}).values()] + list(tp.values())
        fio_n = {op: sum(f[op + "s"] for f in ran) for op in ("read", "write")}
        res["counts"][name] = {"session": {"counted": bpftrace_counts(tool, mnt), "fio": fio_n}}
    return tp


def guest(xdir: Path) -> int:
    cfg = json.loads((xdir / "settings.json").read_text())
    res = {"settings": cfg, "notes": [], "skipped": {}, "errors": [], "cost": {}, "cost_runs": {},
           "counts": {}, "throughput": {w: {} for w in cfg["workloads"]}, "order": [], "tools": {},
           "guest": {"kernel": platform.release(), "nproc": os.cpu_count(),
                     "fio": sh(["fio", "--version"]).strip(), "started": time.strftime("%FT%T%z")}}
    save = lambda: (xdir / "results.json").write_text(json.dumps(res, indent=1))
    cgroup = Path(os.environ.get("TRACEHOUND_VM_CGROUP2", "/sys/fs/cgroup")) / CGROUP
    tools: dict[str, Tool | None] = {}
    os.makedirs(MNT, exist_ok=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={2 * cfg['size_mib'] + 64}m", "vm-modes", MNT],
                   check=True)
    try:
        cgroup.mkdir(exist_ok=True)
        chunk = os.urandom(1 << 20)
        for f in ("r", "w"):
            with open(f"{MNT}/{f}", "wb") as fh:
                for _ in range(cfg["size_mib"]):
                    fh.write(chunk)
        STATS.write_text("0")
        tools = conditions(cfg, res)
        names, mnt, t0 = list(tools), mount_id(MNT), time.monotonic()
        for r in range(cfg["rounds"]):
            k = r * len(names) // cfg["rounds"]  # each round starts at another condition
            res["order"].append([n for n in names[k:] + names[:k] if n not in res["skipped"]])
            for name in res["order"][-1]:
                log(f"round {r + 1}/{cfg['rounds']}: {name}")
                try:
                    tp = session(cfg, res, name, tools[name], r, cgroup, mnt)
                except Exception as e:  # reported; the other conditions still run
                    if r == 0:
                        res["skipped"][name] = str(e)[-1500:]
                    res["errors"].append({"round": r + 1, "condition": name, "error": str(e)[-600:]})
                    log(f"  {name} failed: {str(e)[-300:]}")
                    tp = None
                for w in cfg["workloads"]:
                    res["throughput"][w].setdefault(name, []).append(tp[w]["iops"] if tp else None)
                save()
        res["guest"]["run_s"] = round(time.monotonic() - t0, 1)
        if "bpftrace" in tools:
            res["guest"]["bpftrace"] = sh(["bpftrace", "--version"]).strip()
        save()
        return 0
    finally:
        for t in tools.values():
            if t:
                t.stop()
        STATS.write_text("0")
        subprocess.run(["umount", MNT], check=False)
        try:
            cgroup.rmdir()
        except OSError:
            pass

