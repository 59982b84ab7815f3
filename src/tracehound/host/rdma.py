"""The kernel's own view of RDMA resources, through iproute2's `rdma` tool.

`rdma resource show -j` answers from the kernel's resource tracker over
netlink (nldev); it is the reference the BPF mirror is checked against and
the per-process view `tracehound rdma show` prints.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
from dataclasses import dataclass

from ..errors import TracehoundError

# Object types in the order of the probe's enum obj_type (rdma.bpf.c); the
# names are the ones `rdma resource show` uses.
TYPES = ("pd", "cq", "qp", "cm_id", "mr", "ctx", "srq")

# The field `rdma resource show TYPE -j` reports the tracker's id in. A QP is
# shown by its number, and the tracker keys special QPs (SMI/GSI, one per
# port) as number | port << 24.
ID_FIELD = {"pd": "pdn", "cq": "cqn", "qp": "lqpn", "cm_id": "cm_idn", "mr": "mrn",
            "ctx": "ctxn", "srq": "srqn"}
SPECIAL_QP_TYPES = ("SMI", "GSI")

TIMEOUT_S = 10


@dataclass(frozen=True)
class KernelObject:
    device: int        # ib_device index ("ifindex" in the tool's output)
    device_name: str
    type: str
    id: int
    pid: int           # 0 for objects a kernel module owns
    comm: str
    lkey: int = 0      # an MR's local key (what the application is handed)


class RdmaToolError(TracehoundError):
    pass


def tool_path() -> str | None:
    return shutil.which("rdma") or next(
        (p for p in ("/usr/sbin/rdma", "/sbin/rdma", "/usr/bin/rdma") if os.access(p, os.X_OK)), None)


def _run_json(args: list[str]):
    tool = tool_path()
    if tool is None:
        raise RdmaToolError("the rdma tool (iproute2) is not installed")
    try:
        out = subprocess.run([tool, *args, "-j"], capture_output=True, text=True,
                             timeout=TIMEOUT_S, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise RdmaToolError(f"rdma {' '.join(args)}: {exc}") from None
    if out.returncode != 0:
        raise RdmaToolError(f"rdma {' '.join(args)} failed: {out.stderr.strip() or out.returncode}")
    text = out.stdout.strip()
    if not text:
        return []
    try:
        return json.loads(text)
    except ValueError as exc:
        raise RdmaToolError(f"rdma {' '.join(args)}: unparsable JSON ({exc})") from None


def parse_summary(rows: list[dict]) -> dict[tuple[int, str], int]:
    """`rdma resource show -j` -> {(device index, type): live objects}."""
    out = {}
    for row in rows:
        dev = int(row.get("ifindex", -1))
        for t in TYPES:
            if t in row:
                out[(dev, t)] = int(row[t])
    return out


def summary() -> dict[tuple[int, str], int]:
    return parse_summary(_run_json(["resource", "show"]))


def object_id(kind: str, row: dict) -> int | None:
    value = row.get(ID_FIELD[kind])
    if value is None:
        return None
    value = int(value)
    if kind == "qp" and row.get("type") in SPECIAL_QP_TYPES:
        value |= int(row.get("port", 0)) << 24
    return value


def parse_objects(kind: str, rows: list[dict]) -> list[KernelObject]:
    out = []
    for row in rows:
        oid = object_id(kind, row)
        if oid is None:
            continue
        lkey = row.get("lkey", 0)
        out.append(KernelObject(int(row.get("ifindex", -1)), row.get("ifname", ""), kind, oid,
                                int(row.get("pid", 0)), row.get("comm", ""),
                                lkey if isinstance(lkey, int) and lkey >= 0 else 0))
    return out


def objects(kinds=TYPES, pid: int | None = None) -> list[KernelObject]:
    """Every tracked object of these types; only those of `pid` if given."""
    out = []
    for kind in kinds:
        out += parse_objects(kind, _run_json(["resource", "show", kind]))
    return [o for o in out if pid is None or o.pid == pid]


def devices() -> dict[int, str]:
    """ib_device index -> name."""
    return {int(d["ifindex"]): d["ifname"] for d in _run_json(["dev", "show"])}
