"""RDMA probe maps -> snapshots and Prometheus metric families at scrape time.

Key and value layouts mirror the structs in probes/rdma.bpf.c; the name
tables follow its enums (obj_type, rdma_op) and the kernel's ib_event_type
and ib_qp_state, whose values are ABI: uverbs hands them to user space as is.
"""
from __future__ import annotations

import errno as errno_mod
import struct
from dataclasses import dataclass, field

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from ..attribution.resolver import WorkloadResolver
from ..attribution.workload import WORKLOAD_LABELS
from ..host.rdma import TYPES

OPS = ("create_ctx", "alloc_pd", "create_cq", "create_qp", "reg_mr", "create_srq",
       "dealloc_pd", "destroy_cq", "destroy_qp", "dereg_mr", "destroy_srq",
       "modify_qp", "umem_get")
DESTROY_OPS = frozenset({"dealloc_pd", "destroy_cq", "destroy_qp", "dereg_mr", "destroy_srq"})
QP_STATES = ("RESET", "INIT", "RTR", "RTS", "SQD", "SQE", "ERR")
EVENTS = ("CQ_ERR", "QP_FATAL", "QP_REQ_ERR", "QP_ACCESS_ERR", "COMM_EST", "SQ_DRAINED",
          "PATH_MIG", "PATH_MIG_ERR", "DEVICE_FATAL", "PORT_ACTIVE", "PORT_ERR", "LID_CHANGE",
          "PKEY_CHANGE", "SM_CHANGE", "SRQ_ERR", "SRQ_LIMIT_REACHED", "QP_LAST_WQE_REACHED",
          "CLIENT_REREGISTER", "GID_CHANGE", "WQ_FATAL")
HEALTH = ("objects_full", "unknown_del", "pending_full")

OBJ_KEY = struct.Struct("=IIII")        # dev, type, id, pad
OBJ_VALUE = struct.Struct("=QQII16s")   # cgroup_id, created_ns, tgid, flags, comm
VERB_KEY = struct.Struct("=II")         # op, err
EVENT_KEY = struct.Struct("=IIII")      # dev, port, event, pad
U32 = struct.Struct("=I")
U64 = struct.Struct("=Q")
OBJ_F_USER = 1
OBJ_F_SEEDED = 2
KERNEL_OWNER = "kernel"                 # cgroup label of objects a kernel module owns


def _name(table: tuple[str, ...], idx: int) -> str:
    return table[idx] if 0 <= idx < len(table) else str(idx)


def errno_name(err: int) -> str:
    return errno_mod.errorcode.get(err, str(err))


def _cstr(raw: bytes) -> str:
    return raw.split(b"\0", 1)[0].decode(errors="replace")


@dataclass(frozen=True)
class MirrorObject:
    device: int
    type: str
    id: int
    tgid: int
    cgroup_id: int
    created_ns: int     # CLOCK_MONOTONIC ns; 0 when it predates the probe
    flags: int
    comm: str

    @property
    def user(self) -> bool:
        return bool(self.flags & OBJ_F_USER)

    @property
    def seeded(self) -> bool:
        return bool(self.flags & OBJ_F_SEEDED)


def decode_object(key: bytes, value: bytes) -> MirrorObject:
    dev, type_idx, oid, _ = OBJ_KEY.unpack(key[:OBJ_KEY.size])
    cgid, created, tgid, flags, comm = OBJ_VALUE.unpack(value[:OBJ_VALUE.size])
    return MirrorObject(dev, _name(TYPES, type_idx), oid, tgid, cgid, created, flags, _cstr(comm))


def encode_object(obj: MirrorObject) -> tuple[bytes, bytes]:
    key = OBJ_KEY.pack(obj.device, TYPES.index(obj.type), obj.id, 0)
    value = OBJ_VALUE.pack(obj.cgroup_id, obj.created_ns, obj.tgid, obj.flags,
                           obj.comm.encode()[:15])
    return key, value


@dataclass
class RdmaSnapshot:
    """What the probe's maps held at one instant."""
    objects: list[MirrorObject] = field(default_factory=list)
    verbs: dict[tuple[str, int], int] = field(default_factory=dict)   # (op, errno or 0) -> calls
    events: dict[tuple[int, int, str], int] = field(default_factory=dict)  # (dev, port, event)
    qp_states: dict[str, int] = field(default_factory=dict)
    health: dict[str, int] = field(default_factory=dict)
    devices: dict[int, str] = field(default_factory=dict)

    def device_name(self, dev: int) -> str:
        return self.devices.get(dev) or f"dev{dev}"

    def object_counts(self) -> dict[tuple[int, str], int]:
        out: dict[tuple[int, str], int] = {}
        for o in self.objects:
            out[(o.device, o.type)] = out.get((o.device, o.type), 0) + 1
        return out

    def calls(self, op: str) -> int:
        return sum(n for (o, _), n in self.verbs.items() if o == op)

    def errors(self) -> dict[tuple[str, int], int]:
        return {k: n for k, n in self.verbs.items() if k[1]}


def read_snapshot(maps, objects: bool = True) -> RdmaSnapshot:
    """`maps`: name -> map with items() (and lookup() for arrays)."""
    snap = RdmaSnapshot()
    if objects:
        snap.objects = [decode_object(k, v) for k, v in maps["rdma_objects"].items()]
    for k, v in maps["rdma_verbs"].items():
        op, err = VERB_KEY.unpack(k[:VERB_KEY.size])
        snap.verbs[(_name(OPS, op), err)] = U64.unpack(v[:8])[0]
    for k, v in maps["rdma_events"].items():
        dev, port, event, _ = EVENT_KEY.unpack(k[:EVENT_KEY.size])
        snap.events[(dev, port, _name(EVENTS, event))] = U64.unpack(v[:8])[0]
    for idx, state in enumerate(QP_STATES):
        raw = maps["rdma_qp_states"].lookup(U32.pack(idx))
        snap.qp_states[state] = U64.unpack(raw[:8])[0] if raw else 0
    for idx, name in enumerate(HEALTH):
        raw = maps["rdma_health"].lookup(U32.pack(idx))
        snap.health[name] = U64.unpack(raw[:8])[0] if raw else 0
    for k, v in maps["rdma_devices"].items():
        snap.devices[U32.unpack(k[:4])[0]] = _cstr(v)
    return snap


class RdmaCollector:
    """prometheus_client collector over a started RdmaProbe."""

    def __init__(self, probe, cgroups, detector=None, workloads=None):
        self.probe = probe
        self.cgroups = cgroups
        self.detector = detector
        self.workloads = workloads or WorkloadResolver(job_id_source=None, pod_source=None)

    def owner_label(self, obj: MirrorObject) -> str:
        return self.cgroups.path(obj.cgroup_id) if obj.user else KERNEL_OWNER

    def collect(self):
        snap = self.probe.snapshot()
        self.cgroups.new_scrape()
        objects = GaugeMetricFamily(
            "tracehound_rdma_objects",
            "Live RDMA objects in the kernel's resource tracker, mirrored in BPF "
            f"(cgroup '{KERNEL_OWNER}': owned by a kernel module).",
            labels=["device", "type", "cgroup", *WORKLOAD_LABELS])
        # Objects far outnumber owners: labels are resolved once per owner,
        # in the order the objects first name them.
        per_owner: dict[tuple[int, str, bool, int], tuple[MirrorObject, int]] = {}
        for o in snap.objects:
            owner_key = (o.device, o.type, o.user, o.cgroup_id if o.user else 0)
            first, n = per_owner.get(owner_key, (o, 0))
            per_owner[owner_key] = (first, n + 1)
        counts: dict[tuple[str, ...], int] = {}
        for o, n in per_owner.values():
            owner = self.owner_label(o)
            workload = self.workloads.labels(owner) if o.user else ("",) * len(WORKLOAD_LABELS)
            key = (snap.device_name(o.device), o.type, owner, *workload)
            counts[key] = counts.get(key, 0) + n
        for labels, n in sorted(counts.items()):
            objects.add_metric(list(labels), n)
        yield objects

        calls = CounterMetricFamily("tracehound_rdma_verb_calls",
                                    "User verbs that reached the kernel, successful or not.",
                                    labels=["op"])
        errors = CounterMetricFamily("tracehound_rdma_verb_errors",
                                     "User verbs that returned an error, by errno.",
                                     labels=["op", "errno"])
        for op in OPS:
            calls.add_metric([op], snap.calls(op))
        for (op, err), n in sorted(snap.errors().items()):
            errors.add_metric([op, errno_name(err)], n)
        yield calls
        yield errors

        events = CounterMetricFamily("tracehound_rdma_async_events",
                                     "Asynchronous events the RDMA core dispatched.",
                                     labels=["device", "port", "event"])
        for (dev, port, event), n in sorted(snap.events.items()):
            events.add_metric([snap.device_name(dev), str(port), event], n)
        yield events

        states = CounterMetricFamily("tracehound_rdma_qp_transitions",
                                     "Successful QP state changes, by target state.",
                                     labels=["to_state"])
        for state in QP_STATES:
            states.add_metric([state], snap.qp_states.get(state, 0))
        yield states

        health = CounterMetricFamily("tracehound_rdma_mirror_drops",
                                     "Tracker updates the BPF mirror could not apply.",
                                     labels=["reason"])
        for name in HEALTH:
            health.add_metric([name], snap.health.get(name, 0))
        yield health

        if self.detector is not None:
            yield self.detector.metric()


class RdmaRuntime:
    """The RDMA probe with its collector and anomaly detection, as the agent
    runs them. Without RDMA (or with every hook refused) only the probe's
    reason remains."""

    def __init__(self, probe, collector=None, watcher=None):
        self.probe = probe
        self.collector = collector
        self.watcher = watcher

    def collectors(self) -> list:
        return [self.collector] if self.collector is not None else []

    def status_lines(self) -> list[str]:
        if not self.probe.available:
            return [f"rdma: not available ({self.probe.reason})"]
        lines = [f"probe {name:<10} mode {mode}" for name, mode in self.probe.modes().items()]
        lines += [f"{name}: not available ({why})" for name, why in self.probe.missing().items()]
        return lines

    def close(self) -> None:
        if self.watcher is not None:
            self.watcher.stop()
        self.probe.close()


def open_rdma(hook_mode: str, cgroup_root: str, grace_s: float = 10.0,
              workloads=None) -> RdmaRuntime:
    # imported here: the probe module decodes its maps with this one
    from ..attribution.cgroups import CgroupResolver
    from ..detect.rdma import RdmaDetector, RdmaDetectorConfig, RdmaWatcher
    from ..host.rdma import summary
    from ..probes.rdma import RdmaProbe, RdmaProbeConfig

    probe = RdmaProbe(RdmaProbeConfig(hook_mode, cgroup_root=cgroup_root)).start()
    if not probe.available:
        return RdmaRuntime(probe)
    # a resolver of its own: the I/O collector forgets cgroups it stopped seeing
    cgroups = CgroupResolver(cgroup_root)

    def cgroup_path(cgroup_id: int) -> str:
        cgroups.new_scrape()
        return cgroups.path(cgroup_id)

    detector = RdmaDetector(RdmaDetectorConfig(grace_s=grace_s), cgroup_path=cgroup_path)
    watcher = RdmaWatcher(probe, detector, kernel_view=summary).start()
    return RdmaRuntime(probe, RdmaCollector(probe, cgroups, detector, workloads), watcher)
