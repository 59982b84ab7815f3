"""What an NVIDIA XID number means, how bad it is, and what to do about it.

A summary, in our own words, of NVIDIA's public XID catalog (the "XID Errors"
pages of docs.nvidia.com, the Ampere-and-newer catalog with its "resolution
buckets", and the older catalog for numbers retired since) and of the
recovery advice in NVIDIA's GPU debug guidelines.

Interface::

    info = lookup(79)
    info.name        # "GPU fell off the bus"
    info.severity    # "fatal" | "error" | "warning" | "info"
    info.action      # what an operator should do, one sentence
    info.known       # False for a number the table does not hold

    for info in entries():          # every known XID, by number (info metric)
        ...

    xid154_recovery_action(detail)  # Xid 154's text -> "Node Reboot Required"

Severities:
  fatal    the GPU needs a reset or the node a reboot before it is trusted
           again (double-bit ECC, uncontained errors, fallen off the bus,
           NVLink/GSP failures, micro-controller halts);
  error    something failed (usually an application) but the GPU itself is
           expected to be healthy: restart the work, investigate on repeat;
  warning  the hardware is degrading or a reset is pending; plan for it;
  info     bookkeeping that needs no action by itself.

The same number can mean different things on different generations (63/64
are row remapping on Ampere and newer, page retirement before); the entry
covers both and says so. Severity follows NVIDIA's immediate action: a
"reset the GPU" or "restart the node" bucket is fatal.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from types import MappingProxyType
from typing import Iterator

FATAL, ERROR, WARNING, INFO = "fatal", "error", "warning", "info"
SEVERITIES = (FATAL, ERROR, WARNING, INFO)

# Recurring pieces of advice, so the table below stays one line per XID.
_APP = "restart the application"
_APP_DEBUG = ("restart the application; if it recurs, debug it "
              "(compute-sanitizer memcheck, cuda-gdb)")
_APP_SUPPORT = "restart the application; report to NVIDIA support if it recurs"
_RESET = "reset the GPU; report to NVIDIA support if it recurs"
_RESET_RMA = "reset the GPU (or reboot the node); report to the hardware vendor (RMA) if it recurs"
_NVLINK = ("reset the GPU (or reboot the node); check the NVLink/cable and the GPU or "
           "NVSwitch at the other end; RMA if it recurs")
_GSP = "reset the GPU; reboot the node if it persists, then follow NVIDIA's GPU debug guidelines"
_NONE = "none: informational"

# (xid, short name, severity, recommended action). Data, not code: a change
# of NVIDIA's advice is a change of one row.
_TABLE = (
    (8, "GPU stopped processing (idle timeout)", ERROR, _APP_SUPPORT),
    (11, "invalid push buffer stream", ERROR, _APP_DEBUG),
    (13, "graphics engine exception", ERROR, _APP_DEBUG),
    (14, "injected test error", INFO, _NONE),
    (25, "illegal push buffer stream", ERROR, _APP_DEBUG),
    (31, "GPU memory page fault", ERROR, _APP_DEBUG),
    (32, "corrupted push buffer stream (PBDMA)", ERROR,
     "restart the application; if it recurs, check the PCIe link (replays, AER errors)"),
    (37, "driver firmware error (unimplemented method)", WARNING,
     "none unless it recurs; then report to NVIDIA support"),
    (38, "driver firmware error (watchdog timeout)", WARNING,
     "none unless it recurs; then report to NVIDIA support"),
    (39, "copy engine exception", ERROR, _APP_SUPPORT),
    (40, "copy engine exception", ERROR, _APP_SUPPORT),
    (41, "copy engine exception", ERROR, _APP_SUPPORT),
    (43, "GPU stopped processing (application fault)", ERROR,
     "restart the application; the GPU stays healthy"),
    (44, "graphics engine fault during context switch", ERROR, _APP_SUPPORT),
    (45, "preemptive cleanup after an abort or an earlier error", INFO,
     "none by itself: follows an application exit or another XID; act on that one"),
    (46, "GPU stopped processing (timeout)", FATAL, _RESET),
    (48, "double-bit ECC error", FATAL, _RESET_RMA),
    (54, "auxiliary power not connected", FATAL,
     "check the GPU's power cables; report to the hardware vendor if they are seated"),
    (56, "display engine error (pre-Ampere)", ERROR, _APP_SUPPORT),
    (57, "error programming the video memory interface (pre-Ampere)", ERROR,
     "reset the GPU if it recurs; report to the hardware vendor"),
    (58, "unstable video memory interface (pre-Ampere)", FATAL, _RESET_RMA),
    (60, "video processor exception", ERROR, _APP_SUPPORT),
    (61, "internal micro-controller breakpoint or warning", WARNING,
     "none unless the GPU stops responding (often precedes XID 62); then reset the GPU"),
    (62, "internal micro-controller halt", FATAL, _RESET),
    (63, "row remap pending (page retired before Ampere)", WARNING,
     "reset the GPU when convenient to apply the remap (older GPUs: reload the driver)"),
    (64, "row remap failed (page retirement failed before Ampere)", FATAL,
     "reset the GPU; report to the hardware vendor (RMA) if it recurs"),
    (66, "illegal register access by the driver", WARNING,
     "none unless it recurs; then update the driver or report to NVIDIA support"),
    (67, "illegal access by the driver", WARNING,
     "none unless it recurs; then report to NVIDIA support"),
    (68, "video decoder (NVDEC0) exception", ERROR, _APP_SUPPORT),
    (69, "graphics engine class error", ERROR, _APP_DEBUG),
    (73, "video encoder (NVENC2) error", ERROR, _APP_SUPPORT),
    (74, "NVLink error", FATAL, _NVLINK),
    (78, "vGPU start error", ERROR, "update the vGPU software and firmware"),
    (79, "GPU fell off the bus", FATAL,
     "reboot the node (power cycle); check PCIe seating, risers and power; "
     "report to the hardware vendor (RMA) if it recurs"),
    (80, "corrupted data sent to the GPU", ERROR, _APP_DEBUG),
    (92, "high single-bit ECC error rate", WARNING,
     "none right away: watch the ECC counters; plan a reset or RMA if the rate stays high"),
    (93, "InfoROM wear limit reached", WARNING,
     "clear the InfoROM erase limit with nvflash; report to NVIDIA if that does not help"),
    (94, "contained memory error", ERROR,
     "restart the affected application; reset the GPU when convenient"),
    (95, "uncontained memory error", FATAL,
     "reset the GPU before restarting applications; RMA if it recurs"),
    (109, "context switch timeout", FATAL, _RESET),
    (110, "security fault", FATAL,
     "revert recent hardware changes and cold-reset the node; report to the hardware vendor"),
    (119, "GSP RPC timeout", FATAL, _GSP),
    (120, "GSP error", FATAL, _GSP),
    (121, "corrected C2C link errors", WARNING,
     "none now: reset the GPU at the next maintenance window to retrain the link"),
    (123, "SPI flash write failure (PMU RPC)", ERROR,
     "report to NVIDIA support if it recurs"),
    (136, "NVLink training failed", FATAL, _NVLINK),
    (137, "NVLink privilege error (illegal peer access)", ERROR, _APP_DEBUG),
    (140, "unrecovered ECC error", FATAL, _RESET_RMA),
    (143, "GPU initialization error", FATAL, _RESET),
    (144, "NVLink SAW error", FATAL, _NVLINK),
    (145, "NVLink RLW error", FATAL, _NVLINK),
    (146, "NVLink TLW error", FATAL, _NVLINK),
    (147, "NVLink TREX error", ERROR, "report to NVIDIA support if it recurs"),
    (148, "NVLink NVLPW control error", ERROR, "report to NVIDIA support if it recurs"),
    (149, "NVLink NETIR error (link fatal)", FATAL, _NVLINK),
    (150, "NVLink MSE error", FATAL, _NVLINK),
    (151, "key rotation error", FATAL, "restart the virtual machine"),
    (154, "GPU recovery action changed", INFO,
     "follow the recovery action the line names (none, drain P2P, reset GPU, reboot node)"),
    (155, "NVLink link down (software-defined)", FATAL,
     "reset the GPU; check whether the link was taken down on purpose"),
    (156, "resource retirement event", WARNING, "reset the GPU when convenient to apply it"),
    (157, "resource retirement failure", WARNING,
     "none right away: the error may repeat; report to NVIDIA support"),
    (158, "GPU fatal timeout", FATAL, _RESET),
)


@dataclass(frozen=True)
class XidInfo:
    xid: int
    name: str
    severity: str
    action: str
    known: bool = True


CATALOG = MappingProxyType({x: XidInfo(x, name, sev, action)
                            for x, name, sev, action in _TABLE})


def lookup(xid: int) -> XidInfo:
    """The catalog entry, or an "unknown" one (severity error: an XID is
    never good news, but nothing says a reset is needed)."""
    info = CATALOG.get(xid)
    if info is not None:
        return info
    return XidInfo(xid, "unknown XID", ERROR,
                   "look the number up in NVIDIA's XID catalog for this driver", known=False)


def entries() -> Iterator[XidInfo]:
    """Every known XID in ascending order."""
    for xid in sorted(CATALOG):
        yield CATALOG[xid]


def is_fatal(xid: int) -> bool:
    return lookup(xid).severity == FATAL


# "... GPU recovery action changed from 0x0 (None) to 0x2 (Node Reboot Required)"
_RECOVERY_TO = re.compile(r"\bto\s+(?:0x[0-9a-fA-F]+\s*)?\(([^)]+)\)")


def xid154_recovery_action(detail: str) -> str | None:
    """The recovery action an XID 154 line moves to, as the driver names it."""
    m = _RECOVERY_TO.search(detail or "")
    return m.group(1).strip() if m else None


_SXID_FATAL = ("stop the node's GPU jobs and reset the NVSwitch fabric (reset the GPUs and "
               "switches, or reboot the node); report to the hardware vendor if it recurs")
_SXID_NONFATAL = "none right away: the switch contained it; report to NVIDIA support if it recurs"
_INIT_FAILED = ("check the driver and firmware versions match and the GPU is seated and "
                "powered; reboot the node; report to the hardware vendor if it recurs")


def kernel_event_info(kind: str, number: int | None = None,
                      fatal: bool | None = None) -> dict[str, str]:
    """{name, severity, action} of a kernel-log GPU report (gpu/kmsg.py's
    kinds): an XID from the table above, an NVSwitch SXid by its
    fatal/non-fatal mark (the SXid numbers themselves are not catalogued),
    a GPU fallen off the bus (XID 79's entry) or an adapter that failed to
    initialise."""
    if kind == "xid" and number is not None:
        info = lookup(number)
    elif kind == "fallen_off_bus":
        info = lookup(79)
    elif kind == "sxid":
        if fatal:
            return {"name": "NVSwitch fatal error", "severity": FATAL, "action": _SXID_FATAL}
        if fatal is False:
            return {"name": "NVSwitch non-fatal error", "severity": WARNING,
                    "action": _SXID_NONFATAL}
        return {"name": "NVSwitch error", "severity": ERROR, "action": _SXID_FATAL}
    elif kind == "init_failed":
        return {"name": "GPU initialization failed", "severity": FATAL, "action": _INIT_FAILED}
    else:
        raise ValueError(f"not a kernel GPU event kind: {kind!r}")
    return {"name": info.name, "severity": info.severity, "action": info.action}
