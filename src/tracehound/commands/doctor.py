"""`tracehound doctor`: what this host offers, what each subsystem would use, and why."""
from __future__ import annotations

from .. import defaults, instance, preflight
from ..attribution import cgroup_layout
from ..bpf import features
from ..errors import TracehoundError
from ..host.mounts import MountTable
from ..subsystems import SUBSYSTEMS
from ..subsystems.base import check_line


def instance_line(name: str = defaults.INSTANCE, run_dir: str = defaults.RUN_DIR) -> str:
    """Which instance, and whether a running agent holds it: read from the
    kernel's lock table, never by taking the lock (that would refuse an
    agent starting at that moment)."""
    try:
        path, pid = instance.holder(name, run_dir)
    except OSError as exc:
        return check_line(False, "instance", f"{name}: cannot tell whether an agent holds it "
                          f"({exc.filename}: {exc.strerror})", mark="??")
    where = f"pins {instance.pin_dir(name)}, lock {path}"
    if pid:
        return check_line(True, "instance", f"{name}: held by the running agent, pid {pid} ({where}); "
                          "a second agent needs --instance NAME", mark="in")
    return check_line(True, "instance", f"{name}: no agent holds it ({where})")


def cgroup_key_line(wanted: str = "auto", mounts: MountTable | None = None) -> tuple[str, bool]:
    """Which hierarchy the probes would count by, and whether there is one."""
    try:
        layout = cgroup_layout.choose(mounts or MountTable(), wanted)
    except TracehoundError as exc:
        return check_line(False, "cgroup key", str(exc)), False
    return check_line(True, "cgroup key", layout.describe()), True


def doctor(hook_mode: str = "auto", out=print, subsystems=SUBSYSTEMS,
           instance_name: str = defaults.INSTANCE, cgroup_key: str = "auto") -> int:
    problems = 0
    out("host:")
    for what, check in (("root", preflight.check_root), ("libbpf", preflight.check_libbpf),
                        ("btf", preflight.check_btf)):
        try:
            check()
            out(check_line(True, what, "present"))
        except TracehoundError as exc:
            out(check_line(False, what, str(exc)))
            problems += 1
    out(instance_line(instance_name))
    # subsystems without BPF probes (GPU) can be checked all the same
    sections = [s for s in subsystems if not problems or not s.needs_bpf]
    if problems:
        out("fix the problems above first; probes cannot be checked without them")
    else:
        tracefs = features.ensure_tracefs()
        out(check_line(tracefs, "tracefs", features.TRACEFS if tracefs else "not mounted and mount failed"))
        line, ok = cgroup_key_line(cgroup_key)
        out(line)
        problems += (not tracefs) + (not ok)
        out(f"probes (hook mode: {hook_mode}):")
    for s in sections:
        report = s.doctor(hook_mode)
        for line in report.lines:
            out(line)
        problems += report.problems
    return 1 if problems else 0


def add_parser(sub, hook) -> None:
    p = sub.add_parser("doctor", parents=[hook], help="show which hooks this kernel offers and why",
                       description="Check the host (root, BTF, libbpf, tracefs, the cgroup hierarchy "
                               "counted by) and show, "
                                   "per probe, which hook mode would be used and why the others "
                                   "are not.")
    p.add_argument("--instance", type=instance.instance_name, default=defaults.INSTANCE,
                   metavar="NAME", help="the agent instance to report on "
                                        f"(default {defaults.INSTANCE})")
    p.add_argument("--cgroup-key", choices=cgroup_layout.CHOICES, default="auto",
                   help="the cgroup key `run` would be given (default auto)")
    p.set_defaults(handler=lambda args: doctor(args.hook_mode, instance_name=args.instance,
                                               cgroup_key=args.cgroup_key))
