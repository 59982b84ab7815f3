"""What every benchmark shares: its log line, running a command, the stamp a
report carries (commit, machine, date), so that no report can be read
without knowing where and at what code it was measured, and the verdict
line of a target.

Every benchmark runs as `python -m bench.NAME` from the repository root and
imports this as bench.common.
"""
from __future__ import annotations

import ctypes
import datetime as dt
import importlib.util
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
REPORT = REPO / "bench" / "report"      # every benchmark's reports, by default


def log(msg: str, stream=None) -> None:
    """One timestamped progress line (stdout unless told)."""
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=stream or sys.stdout, flush=True)


def verdict(ok: bool | None) -> str:
    """How a target's line starts: met, missed, or not measured (None)."""
    return "n/a " if ok is None else "MET " if ok else "MISS"


def sh(cmd: list, **kw) -> str:
    """A command's stdout; it must succeed."""
    return subprocess.run([str(c) for c in cmd], check=True, capture_output=True, text=True,
                          **kw).stdout


def cpu_model() -> str:
    """The CPU's model name ("" where /proc/cpuinfo names none)."""
    try:
        with open("/proc/cpuinfo") as f:
            return next((ln.split(":", 1)[1].strip() for ln in f
                         if ln.startswith("model name")), "")
    except OSError:
        return ""


def loadavg() -> list[str]:
    """The 1, 5 and 15 minute load averages, as the kernel writes them."""
    return Path("/proc/loadavg").read_text().split()[:3]


# what a report's commit leaves out: the reports, and prose that quotes them
NOT_CODE = (":(exclude)bench/report", ":(exclude)docs", ":(exclude,glob)**/*.md")


def commit(tree: Path | str = REPO, paths: tuple[str, ...] = ()) -> str:
    """The commit of TREE's code, marked when it has uncommitted changes (in
    PATHS only, when given); "unknown (...)" for a tree that is no git
    checkout. The reports themselves do not count, committed or not, nor
    does prose (docs/, Markdown): a run of several benchmarks rewrites the
    reports as it goes, and a commit of only reports or of the text that
    quotes them leaves the code where it was, so every report measured at
    that code names the same commit."""
    try:
        sha = sh(["git", "-C", tree, "log", "-1", "--format=%h", "--abbrev=12", "--", ".",
                  *NOT_CODE]).strip()
        # no optional locks: reading the tree's state must not rewrite its index
        dirty = sh(["git", "--no-optional-locks", "-C", tree, "status", "--porcelain",
                    "--untracked-files=no", "--", *(paths or (".",)), *NOT_CODE]).strip()
    except (OSError, subprocess.CalledProcessError):
        return f"unknown ({tree} is no git checkout)"
    return sha + (" (with uncommitted changes)" if dirty else "")


def machine() -> str:
    """One line: CPUs, their model and the kernel."""
    model = cpu_model()
    return f"{os.cpu_count()} CPUs" + (f", {model}" if model else "") \
        + f", kernel {os.uname().release}"


def stamp() -> dict:
    """The header every report carries."""
    return {"date": dt.datetime.now().astimezone().isoformat(timespec="seconds"),
            "commit": commit(), "machine": machine(), "cpu": cpu_model() or "?",
            "nproc": os.cpu_count(), "kernel": os.uname().release,
            "loadavg_start": loadavg()}


def paired_ratio(d: dict) -> tuple[float, float, float]:
    """Median rates without and with (d["bare"], d["probed"], one number a
    round), and the median of the rounds' paired ratios: each probed round
    against the bare round just before it, so a load that drifts cancels."""
    b, w = statistics.median(d["bare"]), statistics.median(d["probed"])
    return b, w, statistics.median(p / q for q, p in zip(d["bare"], d["probed"]))


def paired_spread(d: dict) -> tuple[float, float]:
    """The paired ratios' lower and upper quartiles: the rounds' own noise."""
    q = statistics.quantiles([p / q for q, p in zip(d["bare"], d["probed"])], n=4)
    return q[0], q[2]


def tracehound() -> list[str]:
    """The CLI beside this interpreter; else this interpreter's own package
    (`python -m tracehound`, e.g. run from the source tree on PYTHONPATH);
    else whatever `tracehound` is on PATH."""
    exe = os.path.join(os.path.dirname(sys.executable), "tracehound")
    if os.path.exists(exe):
        return [exe]
    if importlib.util.find_spec("tracehound") is not None:
        return [sys.executable, "-m", "tracehound"]
    return [shutil.which("tracehound") or "tracehound"]


def prog_id(lib, fd: int) -> int:
    """The id of the BPF program behind FD, through libbpf (LIB, a ctypes.CDLL)."""
    lib.bpf_obj_get_info_by_fd.argtypes = [ctypes.c_int, ctypes.c_void_p,
                                           ctypes.POINTER(ctypes.c_uint32)]
    info = ctypes.create_string_buffer(256)         # struct bpf_prog_info: id at offset 4
    size = ctypes.c_uint32(256)
    if lib.bpf_obj_get_info_by_fd(fd, info, ctypes.byref(size)) != 0:
        raise OSError("bpf_obj_get_info_by_fd failed")
    return int.from_bytes(info.raw[4:8], sys.byteorder)
