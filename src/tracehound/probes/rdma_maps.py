"""The RDMA probe's map layouts and their decoding: the names of its enums,
the key/value structs of rdma.h, and a snapshot of every map at one instant.

Nothing outside probes/rdma*.py knows the map names or byte layouts; the
collector, the detector and `rdma show` get MirrorObject and RdmaSnapshot.
The name tables follow rdma.h's enums (obj_type, rdma_op) and the kernel's
ib_event_type and ib_qp_state, whose values are ABI: uverbs hands them to
user space as is.
"""
from __future__ import annotations

import errno as errno_mod
import struct
from dataclasses import dataclass, field

from ..bpf.layout import EnumLayout, Layout
from ..host.rdma import TYPES

OPS = ("create_ctx", "alloc_pd", "create_cq", "create_qp", "reg_mr", "create_srq",
       "dealloc_pd", "destroy_cq", "destroy_qp", "dereg_mr", "destroy_srq",
       "modify_qp", "umem_get", "close_ctx")
DESTROY_OPS = frozenset({"dealloc_pd", "destroy_cq", "destroy_qp", "dereg_mr", "destroy_srq"})
QP_STATES = ("RESET", "INIT", "RTR", "RTS", "SQD", "SQE", "ERR")
EVENTS = ("CQ_ERR", "QP_FATAL", "QP_REQ_ERR", "QP_ACCESS_ERR", "COMM_EST", "SQ_DRAINED",
          "PATH_MIG", "PATH_MIG_ERR", "DEVICE_FATAL", "PORT_ACTIVE", "PORT_ERR", "LID_CHANGE",
          "PKEY_CHANGE", "SM_CHANGE", "SRQ_ERR", "SRQ_LIMIT_REACHED", "QP_LAST_WQE_REACHED",
          "CLIENT_REREGISTER", "GID_CHANGE", "WQ_FATAL")
HEALTH = ("objects_full", "unknown_del", "pending_full", "app_full", "counters_full")
APP_ERR_UNKNOWN = 0xFFFFFFFF     # a create failed with no kernel call failing under it
APP_F_RELEASE_FAILED = 1
DEVICE_NAME_LEN = 64

# rdma.h as Python sees it; tests/unit/test_layouts.py checks these against
# the BTF of the built rdma.bpf.o
OBJECT = "rdma"
LAYOUTS = (
    Layout("rdma_obj_key", [("dev", "I"), ("type", "I"), ("id", "I"), ("pad", "I")]),
    Layout("rdma_obj", [("cgroup_id", "Q"), ("created_ns", "Q"), ("tgid", "I"), ("flags", "I"),
                        ("comm", "16s"), ("lkey", "I"), ("pad", "I")]),
    Layout("verb_key", [("op", "I"), ("err", "I"), ("cgroup_id", "Q")]),
    Layout("event_key", [("dev", "I"), ("port", "I"), ("event", "I"), ("tgid", "I"),
                         ("cgroup_id", "Q")]),
    Layout("dev_name", [("name", "64s")]),
    Layout("app_key", [("tgid", "I"), ("type", "I"), ("handle", "Q")]),
    Layout("app_obj", [("context", "Q"), ("created_ns", "Q"), ("cgroup_id", "Q"),
                       ("release_ns", "Q"), ("ident", "I"), ("flags", "I"), ("release_err", "I"),
                       ("pad", "I"), ("comm", "16s"), ("device", f"{DEVICE_NAME_LEN}s")]),
    Layout("app_verb_key", [("op", "I"), ("err", "I"), ("cgroup_id", "Q"),
                            ("device", f"{DEVICE_NAME_LEN}s")]),
    EnumLayout("obj_type", TYPES, "OBJ_"),
    EnumLayout("rdma_op", OPS, "OP_"),
    EnumLayout("rdma_health", HEALTH, "H_", stop="H_MAX"),
)
OBJ_KEY, OBJ_VALUE, VERB_KEY, EVENT_KEY = (lay.struct for lay in LAYOUTS[:4])
APP_KEY, APP_VALUE, APP_VERB_KEY = (lay.struct for lay in LAYOUTS[5:8])
U32 = struct.Struct("=I")
U64 = struct.Struct("=Q")
OBJ_F_USER = 1
OBJ_F_SEEDED = 2


def _name(table: tuple[str, ...], idx: int) -> str:
    return table[idx] if 0 <= idx < len(table) else str(idx)


def errno_name(err: int) -> str:
    if err == APP_ERR_UNKNOWN:
        return "userspace"         # refused before the kernel: the errno is not seen
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
    lkey: int = 0       # an MR's local key

    @property
    def user(self) -> bool:
        return bool(self.flags & OBJ_F_USER)

    @property
    def seeded(self) -> bool:
        return bool(self.flags & OBJ_F_SEEDED)


def decode_object(key: bytes, value: bytes) -> MirrorObject:
    dev, type_idx, oid, _ = OBJ_KEY.unpack(key[:OBJ_KEY.size])
    cgid, created, tgid, flags, comm, lkey, _ = OBJ_VALUE.unpack(value[:OBJ_VALUE.size])
    return MirrorObject(dev, _name(TYPES, type_idx), oid, tgid, cgid, created, flags, _cstr(comm),
                        lkey)


def encode_object(obj: MirrorObject) -> tuple[bytes, bytes]:
    key = OBJ_KEY.pack(obj.device, TYPES.index(obj.type), obj.id, 0)
    value = OBJ_VALUE.pack(obj.cgroup_id, obj.created_ns, obj.tgid, obj.flags,
                           obj.comm.encode()[:15], obj.lkey, 0)
    return key, value


@dataclass(frozen=True)
class AppObject:
    """An object libibverbs handed a process, as the process knows it."""
    tgid: int
    type: str
    handle: int         # its address in the process
    context: int        # address of its ibv_context
    device: str
    ident: int          # QP number, MR lkey; the uverbs handle otherwise
    cgroup_id: int
    created_ns: int
    comm: str
    release_err: int = 0    # a destroy of it failed with this errno...
    release_ns: int = 0     # ...at this time (the process may carry on without it)

    @property
    def release_failed(self) -> bool:
        return bool(self.release_err)


def app_key(obj: AppObject) -> bytes:
    return APP_KEY.pack(obj.tgid, TYPES.index(obj.type), obj.handle)


def decode_app_object(key: bytes, value: bytes) -> AppObject:
    tgid, type_idx, handle = APP_KEY.unpack(key[:APP_KEY.size])
    ctx, created, cgid, rel_ns, ident, flags, rel_err, _, comm, dev = \
        APP_VALUE.unpack(value[:APP_VALUE.size])
    failed = flags & APP_F_RELEASE_FAILED
    return AppObject(tgid, _name(TYPES, type_idx), handle, ctx, _cstr(dev), ident, cgid, created,
                     _cstr(comm), rel_err if failed else 0, rel_ns if failed else 0)


@dataclass
class RdmaSnapshot:
    """What the probe's maps held at one instant."""
    objects: list[MirrorObject] = field(default_factory=list)
    # (op, errno or 0, cgroup id) -> calls that reached the kernel
    verbs: dict[tuple[str, int, int], int] = field(default_factory=dict)
    app_objects: list[AppObject] = field(default_factory=list)
    # (op, errno or 0, cgroup id, device) -> libibverbs calls
    app_verbs: dict[tuple[str, int, int, str], int] = field(default_factory=dict)
    app_closed: set[tuple[int, int]] = field(default_factory=set)   # (tgid, context address)
    events: dict[tuple[int, int, str], int] = field(default_factory=dict)  # (dev, port, event)
    # QP events with their QP's owner: (dev, port, event, tgid, cgroup id) -> count
    qp_events: dict[tuple[int, int, str, int, int], int] = field(default_factory=dict)
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
        return sum(n for (o, _, _), n in self.verbs.items() if o == op)

    def errors(self) -> dict[tuple[str, int, int], int]:
        """(op, errno, cgroup id) -> failed calls"""
        return {k: n for k, n in self.verbs.items() if k[1]}


MAPS = ("rdma_objects", "rdma_verbs", "rdma_events", "rdma_qp_states", "rdma_health",
        "rdma_devices", "app_objects", "app_verbs", "app_closed")


def read_snapshot(maps, objects: bool = True) -> RdmaSnapshot:
    """`maps`: name (MAPS) -> map with items() (and lookup() for arrays)."""
    snap = RdmaSnapshot()
    if objects:
        snap.objects = [decode_object(k, v) for k, v in maps["rdma_objects"].items()]
        snap.app_objects = [decode_app_object(k, v) for k, v in maps["app_objects"].items()]
        snap.app_closed = {(t, h) for t, _, h in (APP_KEY.unpack(k[:APP_KEY.size])
                                                   for k, _ in maps["app_closed"].items())}
    for k, v in maps["rdma_verbs"].items():
        op, err, cgid = VERB_KEY.unpack(k[:VERB_KEY.size])
        snap.verbs[(_name(OPS, op), err, cgid)] = U64.unpack(v[:8])[0]
    for k, v in maps["app_verbs"].items():
        op, err, cgid, dev = APP_VERB_KEY.unpack(k[:APP_VERB_KEY.size])
        snap.app_verbs[(_name(OPS, op), err, cgid, _cstr(dev))] = U64.unpack(v[:8])[0]
    for k, v in maps["rdma_events"].items():
        dev, port, event, tgid, cgid = EVENT_KEY.unpack(k[:EVENT_KEY.size])
        n = U64.unpack(v[:8])[0]
        if tgid:
            snap.qp_events[(dev, port, _name(EVENTS, event), tgid, cgid)] = n
        else:
            snap.events[(dev, port, _name(EVENTS, event))] = n
    for idx, state in enumerate(QP_STATES):
        raw = maps["rdma_qp_states"].lookup(U32.pack(idx))
        snap.qp_states[state] = U64.unpack(raw[:8])[0] if raw else 0
    for idx, name in enumerate(HEALTH):
        raw = maps["rdma_health"].lookup(U32.pack(idx))
        snap.health[name] = U64.unpack(raw[:8])[0] if raw else 0
    for k, v in maps["rdma_devices"].items():
        snap.devices[U32.unpack(k[:4])[0]] = _cstr(v)
    return snap
