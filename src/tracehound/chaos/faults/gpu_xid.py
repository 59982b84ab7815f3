"""gpu.xid: a synthetic XID, written to the kernel log as the driver would.

It proves the path kernel log -> agent -> Prometheus -> alert on any node,
with or without a GPU: the line is an ordinary "NVRM: Xid (PCI:...): N, ..."
record in /dev/kmsg (root only), which the agent's kernel-log watcher
counts like the driver's own. It is synthetic: no GPU is touched, and the
default bus id (0000:ff:00.0) names no real device. It is still marked
destructive: automation that drains a node on a fatal XID would act on it.

Rollback has nothing to undo (the kernel ring keeps the line until it is
overwritten); the fault is journaled like any other. A fatal XID sets the
bus id's tracehound_gpu_health{condition="recent_fatal_xid"} to 1 until the
agent's --gpu-fatal-xid-window passes; it clears then, not on rollback.
"""
from __future__ import annotations

import os
import re

from ...gpu.kmsg import DEFAULT_PATH, normalize_pci
from ...gpu.xid_catalog import is_fatal, lookup
from . import Arg, Availability, Detection, Fault, FaultError, Prepared

SYNTHETIC_PCI = "0000:ff:00.0"
_PCI = re.compile(r"^(?:([0-9a-fA-F]{4,8}):)?([0-9a-fA-F]{2}):([01][0-9a-fA-F])\.([0-7])$")
# what would end a field of the driver's line early, or start another record
_FIELD_BREAK = re.compile(r"[,\n\r\x00]")


def parse_pci(text: str) -> str | None:
    m = _PCI.match(text or "")
    return normalize_pci(*m.groups()) if m else None


def xid_line(xid: int, pci: str, pid: int | None, name: str | None, message: str,
             level: int = 4) -> str:
    """The record to write: the driver's form, with a syslog priority."""
    domain, bus, rest = pci.split(":")
    device, function = rest.split(".")
    where = f"PCI:{domain}:{bus}:{device}" + (f".{function}" if function != "0" else "")
    pid_text = str(pid) if pid is not None else "'<unknown>'"
    return (f"<{level}>NVRM: Xid ({where}): {xid}, pid={pid_text}, "
            f"name={name or '<unknown>'}, {message}")


class GpuXid(Fault):
    name = "gpu.xid"
    summary = "write a synthetic NVRM Xid line to the kernel log (/dev/kmsg)"
    where = "host"
    args = {
        "xid": Arg(int, "XID number (e.g. 48 double-bit ECC, 79 fallen off the bus)",
                   required=True, minimum=1, maximum=9999),
        "pci_bus_id": Arg(str, "the GPU's PCI bus id; the default names no real device",
                          default=SYNTHETIC_PCI),
        "pid": Arg(int, "process the line names (pid=)", minimum=1),
        "process": Arg(str, "process name the line names (name=)"),
        "message": Arg(str, "the driver's text after the fields",
                       default="synthetic XID written by tracehound chaos"),
        "level": Arg(int, "syslog priority of the record (4: warning)", default=4,
                     minimum=0, maximum=7),
    }

    def check(self, args):
        problems = []
        if parse_pci(args["pci_bus_id"]) is None:
            problems.append(f"pci_bus_id {args['pci_bus_id']!r} is not a PCI bus id like "
                            f"{SYNTHETIC_PCI}")
        for key in ("process", "message"):
            if args.get(key) and _FIELD_BREAK.search(args[key]):
                problems.append(f"{key} must not hold a comma or a line break (it would "
                                "change the line's fields)")
        return problems

    def availability(self):
        if os.access(DEFAULT_PATH, os.W_OK):
            return Availability(True, f"{DEFAULT_PATH} writable")
        return Availability(False, f"{DEFAULT_PATH} is not writable here (root only)")

    def prepare(self, args, fault_id):
        pci = parse_pci(args["pci_bus_id"])
        if pci is None:
            raise FaultError(f"pci_bus_id {args['pci_bus_id']!r} is not a PCI bus id")
        line = xid_line(args["xid"], pci, args.get("pid"), args.get("process"),
                        args["message"], args["level"])
        info = lookup(args["xid"])
        return Prepared([f"kernel log: XID {args['xid']} ({info.name}, {info.severity}) on "
                         f"{pci} (synthetic)"],
                        {"line": line, "pci": pci, "xid": args["xid"]})

    def apply(self, state):
        # one open per line: /dev/kmsg rate-limits each open file's writes
        try:
            fd = os.open(DEFAULT_PATH, os.O_WRONLY | os.O_CLOEXEC)
        except OSError as exc:
            raise FaultError(f"cannot open {DEFAULT_PATH} for writing: {exc.strerror}") from None
        try:
            os.write(fd, state["line"].encode() + b"\n")
        except OSError as exc:
            raise FaultError(f"writing to {DEFAULT_PATH}: {exc.strerror}") from None
        finally:
            os.close(fd)
        return None

    def rollback(self, state):
        note = "nothing to undo: the line stays in the kernel log"
        if is_fatal(state["xid"]):
            note += ("; the GPU's recent_fatal_xid health condition clears when the agent's "
                     "--gpu-fatal-xid-window passes")
        return note

    def detection(self, args, state=None):
        pci = (state or {}).get("pci") or parse_pci(args.get("pci_bus_id", SYNTHETIC_PCI))
        q = f'tracehound_gpu_xid_errors_total{{pci_bus_id="{pci}",xid="{args.get("xid")}"}}'
        return Detection.counter_grows(q, f"the agent counts XID {args.get('xid')} on {pci} "
                                          "from the kernel log")


FAULTS = [GpuXid()]
