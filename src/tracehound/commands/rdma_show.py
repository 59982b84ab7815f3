"""Which RDMA objects a process holds: the kernel's tracker, the agent's
mirror of it, and the application's own view.

The kernel side comes from `rdma resource show TYPE -j`; the mirror and the
applications' view (what libibverbs handed each process) from the maps a
running agent pins in bpffs. An object in only one of them is worth a look:
the mirror missed a tracker update, the tracker changed between two
readings, or the process and the kernel disagree (a destroy the kernel
refused, an object the process never saw).

QPs are matched with the application's view by number and MRs by lkey; other
objects have no identity both sides know and are matched by count, per
process, device and type.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

from .. import defaults
from ..host.procs import cgroup_v2_path
from ..host import rdma as kernel_view
from ..host.mounts import MountTable
from ..instance import instance_name


@dataclass
class ObjectRow:
    device: str
    type: str
    id: int
    pid: int
    comm: str
    in_kernel: bool
    in_mirror: bool
    age_s: float | None = None   # known when the probe saw it being created
    workload: str = ""           # job, pod, VM or unit of the owning process
    in_app: str = ""             # "yes", "released" (its destroy failed), "" (not held)


@dataclass
class ProcessView:
    rows: list[ObjectRow]
    notes: list[str]
    mirror_known: bool = True
    kernel_known: bool = True
    app_known: bool = False

    def counts(self) -> dict[str, tuple[int, ...]]:
        """type -> (objects per the kernel, per the mirror[, per the applications])"""
        out: dict[str, tuple[int, ...]] = {}
        for r in self.rows:
            k, m, a = out.get(r.type, (0, 0, 0))
            out[r.type] = (k + r.in_kernel, m + r.in_mirror, a + (r.in_app == "yes"))
        return out if self.app_known else {t: c[:2] for t, c in out.items()}


def build_view(kernel_objects, mirror_objects, devices: dict[int, str], pid: int | None = None,
               now_ns: int | None = None, app_objects=None) -> ProcessView:
    """Join the views on (device, type, id); `mirror_objects` and
    `app_objects` may be None when no agent runs (or it has no application
    view)."""
    now_ns = time.monotonic_ns() if now_ns is None else now_ns
    rows: dict[tuple[int, str, int], ObjectRow] = {}
    for k in kernel_objects:
        if pid is None or k.pid == pid:
            devices.setdefault(k.device, k.device_name)
            rows[(k.device, k.type, k.id)] = ObjectRow(k.device_name, k.type, k.id, k.pid, k.comm,
                                                       True, False)
    notes = []
    if mirror_objects is None:
        notes.append("mirror: no agent with the rdma probe is running; kernel view only")
    for m in mirror_objects or ():
        if pid is not None and m.tgid != pid:
            continue
        row = rows.get((m.device, m.type, m.id))
        if row is None:
            row = rows[(m.device, m.type, m.id)] = ObjectRow(
                devices.get(m.device, f"dev{m.device}"), m.type, m.id, m.tgid, m.comm, False, True)
        row.in_mirror = True
        if m.created_ns:
            row.age_s = max(0.0, (now_ns - m.created_ns) / 1e9)
    # an MR's lkey, the identity the process knows it by: (pid, device, MR id) -> lkey
    lkeys = {(m.tgid, devices.get(m.device, f"dev{m.device}"), m.id): m.lkey
             for m in mirror_objects or () if m.type == "mr"}
    lkeys.update({(k.pid, k.device_name, k.id): k.lkey
                  for k in kernel_objects if k.type == "mr" and k.lkey})
    if app_objects is not None:
        _join_app(rows, [a for a in app_objects if pid is None or a.tgid == pid], lkeys)
    ordered = sorted(rows.values(), key=lambda r: (r.pid, r.device, r.type, r.id))
    return ProcessView(ordered, notes, mirror_objects is not None, app_known=app_objects is not None)


def _join_app(rows: dict, app_objects, lkeys: dict) -> None:
    """Mark each row the process holds in its own view; add the objects only
    the process believes in."""
    by_owner: dict[tuple, list[ObjectRow]] = {}
    for r in rows.values():
        by_owner.setdefault((r.pid, r.device, r.type), []).append(r)
    for (tgid, device, kind), objs in _group(app_objects).items():
        owned = sorted(by_owner.get((tgid, device, kind), []), key=lambda r: r.id)
        if kind in ("qp", "mr"):
            ident = {r.id if kind == "qp" else lkeys.get((r.pid, r.device, r.id), -1): r
                     for r in owned}
            pairs = [(ident.pop(a.ident, None), a) for a in objs]
        else:
            pairs = list(zip(owned + [None] * len(objs), objs))
        for row, a in pairs:
            if row is None:      # only the process believes in it
                row = rows[(device, kind, "app", a.handle)] = ObjectRow(
                    device, kind, a.ident, tgid, a.comm, False, False)
            row.in_app = "released" if a.release_failed else "yes"


def _group(app_objects) -> dict:
    out: dict[tuple, list] = {}
    for a in app_objects:
        out.setdefault((a.tgid, a.device, a.type), []).append(a)
    return out


def process_view(pid: int | None = None, instance: str | None = None) -> ProcessView:
    """The three views of `pid` (of every process when None), read now; the
    mirror is the one the agent of `instance` (the default one) pinned."""
    notes = []
    try:
        kernel = kernel_view.objects()   # build_view keeps the rows of `pid`
        devices = kernel_view.devices()
    except kernel_view.RdmaToolError as exc:
        kernel, devices = [], {}
        notes.append(f"kernel: {exc}")
    mirror, app = _pinned(False, instance), _pinned(True, instance)
    view = build_view(kernel, mirror, devices, pid, app_objects=app)
    view.kernel_known = not notes
    if mirror is not None and app is None:
        notes.append("app: the agent has no application view (see its log)")
    view.notes[:0] = notes
    return view


def _pinned(app: bool, instance: str | None = None):
    """The decoded rows of the mirror (or with `app` the applications' view)
    a running agent of `instance` pinned, or None without one."""
    from ..errors import TracehoundError
    from ..probes.rdma import PinnedObjects, pin_path
    from ..probes.rdma_maps import decode_app_object, decode_object

    path = pin_path("app_objects" if app else "rdma_objects", instance or defaults.INSTANCE)
    try:
        pinned = PinnedObjects(path, app=app)
    except TracehoundError:
        return None
    decode = decode_app_object if app else decode_object
    try:
        return [decode(k, v) for k, v in pinned.items()]
    finally:
        pinned.close()


def workload_name(pid: int, resolver, proc_root: str = "/proc", path_of_pid=cgroup_v2_path) -> str:
    """The most specific workload a process belongs to: Slurm job[.step],
    namespace/pod, VM, systemd unit; its cgroup path otherwise (in the
    hierarchy `path_of_pid` reads, the one `resolver` resolves)."""
    path = path_of_pid(pid, proc_root)
    if path is None:
        return ""
    w = resolver.resolve(path)
    if w.job_id:
        return f"job {w.job_id}" + (f".{w.step}" if w.step else "")
    if w.pod:
        return f"{w.namespace}/{w.pod}" if w.namespace else w.pod
    return w.vm or w.unit or path


def label_workloads(view: ProcessView, resolver, job: str | None = None,
                    proc_root: str = "/proc", path_of_pid=cgroup_v2_path) -> ProcessView:
    """Name each row's workload; with `job`, keep only the rows of processes
    whose Slurm job id, pod name (or namespace/pod) or VM is `job`."""
    names: dict[int, str] = {}
    keep = []
    for r in view.rows:
        if r.pid not in names:
            names[r.pid] = workload_name(r.pid, resolver, proc_root, path_of_pid) if r.pid else ""
        r.workload = names[r.pid]
        if job is None or _matches(r.workload, job):
            keep.append(r)
    view.rows = keep
    return view


def _matches(name: str, job: str) -> bool:
    if name.startswith("job "):
        return name[4:].split(".")[0] == job
    return name == job or name.rpartition("/")[2] == job


def format_view(view: ProcessView) -> str:
    head = (f"{'DEVICE':<10} {'TYPE':<6} {'ID':>10} {'PID':>8} {'COMM':<16} {'WORKLOAD':<22} "
            f"{'KERNEL':<6} {'MIRROR':<6} {'APP':<8} AGE")
    lines = [head]
    for r in view.rows:
        age = f"{r.age_s:.1f}s" if r.age_s is not None else "-"
        mirror = ("yes" if r.in_mirror else "NO") if view.mirror_known else "-"
        # kernel module objects have no process to hold them
        app = (r.in_app or "NO") if view.app_known and r.pid else "-"
        lines.append(f"{r.device:<10} {r.type:<6} {r.id:>10} {r.pid or '-':>8} {r.comm[:16]:<16} "
                     f"{(r.workload or '-')[:22]:<22} "
                     f"{'yes' if r.in_kernel else 'NO':<6} {mirror:<6} {app:<8} {age}")
    totals = ", ".join(f"{t} {'/'.join(map(str, c))}" for t, c in sorted(view.counts().items()))
    sides = "kernel/mirror/app" if view.app_known else "kernel/mirror"
    lines.append(f"objects ({sides}): {totals or 'none'}")
    lines += view.notes
    return "\n".join(lines)


def add_parser(sub, hook=None) -> None:
    rdma = sub.add_parser("rdma", help="RDMA objects: the kernel's tracker, the agent's mirror and "
                                       "the applications' own view")
    actions = rdma.add_subparsers(dest="rdma_command", metavar="ACTION", required=True)
    show = actions.add_parser("show", help="list live RDMA objects, per process",
                              description="List the RDMA objects the kernel tracks (rdma resource "
                                          "show) beside the running agent's BPF mirror and what "
                                          "libibverbs handed each process (APP: yes, NO, or "
                                          "released: its destroy failed and the kernel kept it).")
    who = show.add_mutually_exclusive_group()
    who.add_argument("--pid", type=int, metavar="PID", help="only the objects this process holds")
    who.add_argument("--job", metavar="ID",
                     help="only the objects of one workload's processes: a Slurm job id, a pod "
                          "(name or namespace/pod) or a VM name")
    show.add_argument("--instance", type=instance_name, default=defaults.INSTANCE, metavar="NAME",
                      help="read the mirror of the agent running as this instance "
                           f"(default {defaults.INSTANCE})")
    show.set_defaults(handler=_show)


def _show(args) -> int:
    from ..errors import TracehoundError

    from ..attribution.resolver import WorkloadResolver
    from ..probes.rdma import subsystem_absent

    view = process_view(args.pid, args.instance)
    if not view.kernel_known and not view.mirror_known:
        # say what the host lacks, not what the netlink socket answered
        absent = subsystem_absent()
        raise TracehoundError("rdma show: " + (absent or view.notes[0].removeprefix("kernel: "))
                              + ", and no agent with the rdma probe is running")
    # the hierarchy the agent's default key counts by: a Slurm v1 job is
    # found in freezer on a hybrid host
    from ..attribution.cgroup_layout import choose
    layout = choose(MountTable())
    label_workloads(view, WorkloadResolver(layout.root), args.job,
                    path_of_pid=layout.path_of_pid)
    print(format_view(view))
    return 0
