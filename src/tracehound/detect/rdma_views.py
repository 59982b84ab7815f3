"""The application's view of its RDMA objects against the kernel's.

The application's view is what libibverbs handed each process (uprobes,
probes/rdma_app.bpf.h); the kernel's is the resource-tracker mirror. Both are
compared per process, device and object type: one by one where the object
has an identity both sides know (a QP's number, an MR's lkey), by count
otherwise (PD, CQ, SRQ, context).

Only what both views could have seen is compared:
- a process is covered once the application probe saw it open a device; a
  process with objects of a context the probe never saw open (opened before
  the probe attached) is left out, as are kernel objects older than the
  first attach;
- objects of a context closed with ibv_close_device are gone with it (the
  kernel frees them when the file closes): they are returned to be dropped.

A difference is only a candidate here; the detector reports it once it has
lasted the grace period (a create is in the kernel a few microseconds before
libibverbs returns it).
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from ..probes.rdma_maps import AppObject, RdmaSnapshot

# the identity both views know, by type
IDENTITY = {"qp": "qpn", "mr": "lkey"}


@dataclass
class Disagreement:
    tgid: int
    comm: str
    cgroup_id: int
    device: str
    type: str
    # objects the process holds and the kernel does not: identities, or a count
    app_only: list = field(default_factory=list)
    app_only_count: int = 0
    # kernel objects the process released with a destroy that failed: (identity, errno)
    released: list = field(default_factory=list)
    # kernel objects the process never saw: identities, or a count
    unseen: list = field(default_factory=list)
    unseen_count: int = 0

    @property
    def kernel_only_count(self) -> int:
        return len(self.released) + self.unseen_count


@dataclass
class Comparison:
    disagreements: list[Disagreement]
    covered: set[int]            # processes compared
    uncovered: set[int]          # processes with a context the probe never saw open
    stale: list[AppObject]       # records of closed contexts: to drop


def compare(snap: RdmaSnapshot, since_ns: int) -> Comparison:
    contexts: dict[int, set[int]] = {}
    for o in snap.app_objects:
        if o.type == "ctx":
            contexts.setdefault(o.tgid, set()).add(o.handle)
    stale, uncovered = [], set()
    app: dict[tuple[int, str, str], list[AppObject]] = {}
    for o in snap.app_objects:
        if o.type != "ctx" and o.context not in contexts.get(o.tgid, ()):
            if (o.tgid, o.context) in snap.app_closed:
                stale.append(o)
            else:
                uncovered.add(o.tgid)
            continue
        app.setdefault((o.tgid, o.device, o.type), []).append(o)
    covered = set(contexts) - uncovered
    kernel: dict[tuple[int, str, str], list] = {}
    for k in snap.objects:
        if k.user and k.tgid in covered and k.created_ns >= since_ns and not k.seeded:
            kernel.setdefault((k.tgid, snap.device_name(k.device), k.type), []).append(k)
    found = []
    for key in sorted(set(app) | set(kernel), key=str):
        if key[0] not in covered:
            continue
        d = _one(key, app.get(key, []), kernel.get(key, []))
        if d is not None:
            found.append(d)
    return Comparison(found, covered, uncovered, stale)


def _kernel_identity(obj, kind: str) -> int:
    return obj.lkey if kind == "mr" else obj.id


def _one(key, app_objs: list[AppObject], kernel_objs: list) -> Disagreement | None:
    tgid, device, kind = key
    held = [o for o in app_objs if not o.release_failed]
    released = [o for o in app_objs if o.release_failed]
    first = (app_objs or kernel_objs)[0]
    d = Disagreement(tgid, first.comm, first.cgroup_id, device, kind)
    if kind in IDENTITY:
        app_ids = Counter(o.ident for o in held)
        kernel_ids = Counter(_kernel_identity(k, kind) for k in kernel_objs)
        d.app_only = sorted((app_ids - kernel_ids).elements())
        extra = kernel_ids - app_ids
        rel = {o.ident: o.release_err for o in released}
        d.released = [(i, rel[i]) for i in sorted(extra.elements()) if i in rel]
        d.unseen = sorted(i for i in extra.elements() if i not in rel)
        d.app_only_count, d.unseen_count = len(d.app_only), len(d.unseen)
    else:
        diff = len(kernel_objs) - len(held)
        d.app_only_count = max(0, -diff)
        extra = max(0, diff)
        d.released = [(o.ident, o.release_err) for o in released][:extra]
        d.unseen_count = extra - len(d.released)
    if not d.app_only_count and not d.kernel_only_count:
        return None
    return d
