"""`tracehound doctor`: what this host offers, what each probe would use, and why."""
from __future__ import annotations

import os

from . import preflight
from .bpf import features
from .collectors.gpu import gpu_inventory
from .errors import TracehoundError
from .host.mounts import MountTable
from .probes import object_path


def _line(ok: bool, what: str, detail: str) -> str:
    return f"  [{'ok' if ok else '!!'}] {what:<14} {detail}"


def _gpu_section(out, nvml=None) -> None:
    """GPU health is optional: its absence is reported, never counted as a problem."""
    found, reason = gpu_inventory(nvml)
    out("gpu:")
    if not found:
        out(f"  [--] {'nvml':<14} {reason} (GPU health metrics off)")
    for g in found:
        detail = "not answering (GPU lost)" if g["lost"] else f"{g['model']}  {g['uuid']}"
        out(_line(not g["lost"], f"gpu {g['index']}", f"{detail}  driver {g['driver_version']}"))


def doctor(hook_mode: str = "auto", out=print) -> int:
    problems = 0
    out("host:")
    for what, check in (("root", preflight.check_root), ("libbpf", preflight.check_libbpf),
                        ("btf", preflight.check_btf)):
        try:
            check()
            out(_line(True, what, "present"))
        except TracehoundError as exc:
            out(_line(False, what, str(exc)))
            problems += 1
    if problems:
        out("fix the problems above first; probes cannot be checked without them")
        _gpu_section(out)
        return 1
    tracefs = features.ensure_tracefs()
    out(_line(tracefs, "tracefs", features.TRACEFS if tracefs else "not mounted and mount failed"))
    cg = MountTable().cgroup2_root()
    out(_line(cg is not None, "cgroup v2", cg or "not mounted: per-cgroup attribution impossible"))
    obj = object_path("io")
    out(_line(os.path.exists(obj), "io probe", obj))
    problems += (not tracefs) + (cg is None) + (not os.path.exists(obj))

    out(f"probes (hook mode: {hook_mode}):")
    for gp in features.plan(features.IO_GROUPS, hook_mode):
        chosen = gp.mode or "NONE"
        problems += gp.mode is None
        out(f"  io.{gp.group.name:<8} -> {chosen}")
        for mode, check in gp.checks.items():
            mark = "ok" if check.ok else "no"
            out(f"      {mode:<10} {mark:<3} {check.reason}")
    from .probes.rdma import doctor_line  # RDMA is optional: never counted as a problem
    out("  " + doctor_line(hook_mode))
    _gpu_section(out)
    return 1 if problems else 0
