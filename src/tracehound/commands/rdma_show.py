"""Which RDMA objects a process holds: the kernel's tracker beside the mirror.

The kernel side comes from `rdma resource show TYPE -j`; the mirror from the
map a running agent pins in bpffs. An object in only one of them is worth a
look: the mirror missed a tracker update, or the tracker changed between the
two readings.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

from ..attribution.procs import cgroup_v2_path
from ..host import rdma as kernel_view
from ..host.mounts import MountTable


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


@dataclass
class ProcessView:
    rows: list[ObjectRow]
    notes: list[str]
    mirror_known: bool = True
    kernel_known: bool = True

    def counts(self) -> dict[str, tuple[int, int]]:
        """type -> (objects per the kernel, objects per the mirror)"""
        out: dict[str, tuple[int, int]] = {}
        for r in self.rows:
            k, m = out.get(r.type, (0, 0))
            out[r.type] = (k + r.in_kernel, m + r.in_mirror)
        return out


def build_view(kernel_objects, mirror_objects, devices: dict[int, str], pid: int | None = None,
               now_ns: int | None = None) -> ProcessView:
    """Join both views on (device, type, id); `mirror_objects` may be None
    when no agent runs."""
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
    ordered = sorted(rows.values(), key=lambda r: (r.pid, r.device, r.type, r.id))
    return ProcessView(ordered, notes, mirror_objects is not None)


def process_view(pid: int | None = None) -> ProcessView:
    """Both views of `pid` (of every process when None), read now."""
    from ..probes.rdma_maps import decode_object
    from ..errors import TracehoundError
    from ..probes.rdma import PinnedObjects

    notes = []
    try:
        kernel = kernel_view.objects()   # build_view keeps the rows of `pid`
        devices = kernel_view.devices()
    except kernel_view.RdmaToolError as exc:
        kernel, devices = [], {}
        notes.append(f"kernel: {exc}")
    try:
        pinned = PinnedObjects()
    except TracehoundError:
        mirror = None
    else:
        try:
            mirror = [decode_object(k, v) for k, v in pinned.items()]
        finally:
            pinned.close()
    view = build_view(kernel, mirror, devices, pid)
    view.notes[:0] = notes
    view.kernel_known = not notes
    return view


def workload_name(pid: int, resolver, proc_root: str = "/proc") -> str:
    """The most specific workload a process belongs to: Slurm job[.step],
    namespace/pod, VM, systemd unit; its cgroup path otherwise."""
    path = cgroup_v2_path(pid, proc_root)
    if path is None:
        return ""
    w = resolver.resolve(path)
    if w.job_id:
        return f"job {w.job_id}" + (f".{w.step}" if w.step else "")
    if w.pod:
        return f"{w.namespace}/{w.pod}" if w.namespace else w.pod
    return w.vm or w.unit or path


def label_workloads(view: ProcessView, resolver, job: str | None = None,
                    proc_root: str = "/proc") -> ProcessView:
    """Name each row's workload; with `job`, keep only the rows of processes
    whose Slurm job id, pod name (or namespace/pod) or VM is `job`."""
    names: dict[int, str] = {}
    keep = []
    for r in view.rows:
        if r.pid not in names:
            names[r.pid] = workload_name(r.pid, resolver, proc_root) if r.pid else ""
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
            f"{'KERNEL':<6} {'MIRROR':<6} AGE")
    lines = [head]
    for r in view.rows:
        age = f"{r.age_s:.1f}s" if r.age_s is not None else "-"
        mirror = ("yes" if r.in_mirror else "NO") if view.mirror_known else "-"
        lines.append(f"{r.device:<10} {r.type:<6} {r.id:>10} {r.pid or '-':>8} {r.comm[:16]:<16} "
                     f"{(r.workload or '-')[:22]:<22} "
                     f"{'yes' if r.in_kernel else 'NO':<6} {mirror:<6} {age}")
    totals = ", ".join(f"{t} {k}/{m}" for t, (k, m) in sorted(view.counts().items()))
    lines.append(f"objects (kernel/mirror): {totals or 'none'}")
    lines += view.notes
    return "\n".join(lines)


def add_parser(sub, hook=None) -> None:
    rdma = sub.add_parser("rdma", help="RDMA objects: the kernel's tracker beside the agent's mirror")
    actions = rdma.add_subparsers(dest="rdma_command", metavar="ACTION", required=True)
    show = actions.add_parser("show", help="list live RDMA objects, per process",
                              description="List the RDMA objects the kernel tracks (rdma resource "
                                          "show) beside the running agent's BPF mirror.")
    who = show.add_mutually_exclusive_group()
    who.add_argument("--pid", type=int, metavar="PID", help="only the objects this process holds")
    who.add_argument("--job", metavar="ID",
                     help="only the objects of one workload's processes: a Slurm job id, a pod "
                          "(name or namespace/pod) or a VM name")
    show.set_defaults(handler=_show)


def _show(args) -> int:
    from ..errors import TracehoundError

    from ..attribution.resolver import WorkloadResolver
    from ..probes.rdma import subsystem_absent

    view = process_view(args.pid)
    if not view.kernel_known and not view.mirror_known:
        # say what the host lacks, not what the netlink socket answered
        absent = subsystem_absent()
        raise TracehoundError("rdma show: " + (absent or view.notes[0].removeprefix("kernel: "))
                              + ", and no agent with the rdma probe is running")
    root = MountTable().cgroup2_root()
    label_workloads(view, WorkloadResolver(root), args.job)
    print(format_view(view))
    return 0
