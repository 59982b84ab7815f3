"""The kernel log's records (/dev/kmsg) and the NVIDIA driver's lines in them.

Pure parsing, no I/O: gpu/kmsg.py reads the log and hands each record here.
Every function takes any text or bytes: it returns its result, None for
what is not its business, or a "malformed" event for a driver line that
starts like an XID/SXid report and does not parse (counted, skipped).
"""
from __future__ import annotations

import re
from dataclasses import dataclass

EVENT_KINDS = ("xid", "sxid", "fallen_off_bus", "init_failed")
MALFORMED = "malformed"


@dataclass(frozen=True)
class KmsgRecord:
    seq: int
    usec: int               # CLOCK_MONOTONIC at logging time
    message: str            # unescaped; may hold newlines of a multi-line printk
    level: int = 6
    facility: int = 0       # 0: the kernel; 1: written from user space
    fragment: bool = False  # flag 'c': part of a line printed in pieces
    fields: tuple[tuple[str, str], ...] = ()   # the " KEY=value" lines


_ESCAPE = re.compile(rb"\\x([0-9a-fA-F]{2})")


def _unescape(raw: bytes) -> str:
    # the kernel writes non-printable bytes, bytes >= 0x7f and '\' as \xNN
    return _ESCAPE.sub(lambda m: bytes((int(m.group(1), 16),)), raw).decode("utf-8", "replace")


def parse_record(raw: bytes) -> KmsgRecord | None:
    """One read() of /dev/kmsg -> record; None when it is not one."""
    header, sep, body = raw.partition(b";")
    parts = header.split(b",")
    try:
        prio, seq, usec = int(parts[0]), int(parts[1]), int(parts[2])
    except (ValueError, IndexError):
        return None
    if not sep or seq < 0:
        return None
    flags = parts[3] if len(parts) > 3 else b"-"
    lines = body.split(b"\n")
    fields = []
    for line in lines[1:]:
        if line.startswith(b" "):
            key, eq, value = line[1:].partition(b"=")
            if eq:
                fields.append((_unescape(key), _unescape(value)))
    return KmsgRecord(seq=seq, usec=usec, message=_unescape(lines[0]),
                      level=prio & 7, facility=prio >> 3,
                      fragment=b"c" in flags, fields=tuple(fields))


@dataclass(frozen=True)
class GpuKernelEvent:
    kind: str
    message: str
    pci: str | None = None
    number: int | None = None
    pid: int | None = None
    process: str | None = None
    device: str | None = None
    fatal: bool | None = None
    gpu_instance: int | None = None
    detail: str = ""
    seq: int | None = None
    usec: int | None = None
    # read back from the ring at start-up (logged before the reader started),
    # not read live as the kernel logged it
    replayed: bool = False
    # replayed with no saved position to resume from (a first start): the
    # ring's history, possibly long past, not lines the agent missed
    history: bool = False


# The driver's grammar, anchored, in ASCII only (re.A: \d and \s match no
# other digits or spaces). Any user can put text at the start of a kernel
# line: a segfault line begins with the process name (15 bytes at most),
# then "[pid]: segfault ...", and ends with the binary's file name. So what
# makes a line the driver's must follow from its very start, in the
# driver's words: a bus id where the driver puts one, never one found
# anywhere in the line.
_HEX = "[0-9a-fA-F]"
_BUS = rf"(?:PCI:)?(?:({_HEX}{{4,8}}):)?({_HEX}{{2}}):({_HEX}{{2}})(?:\.([0-7]))?"
_BUS_ANY = rf"(?:PCI:)?(?:{_HEX}{{4,8}}:)?{_HEX}{{2}}:{_HEX}{{2}}(?:\.[0-7])?"   # no groups
_PCI = re.compile(_BUS, re.A)
_DMESG_STAMP = re.compile(r"^\s*(?:\[\s*\d+\.\d+\]\s*)?", re.A)
_NEWLINES = re.compile(r"\s*\n\s*(?:NVRM:\s*)?", re.A)
_XID = re.compile(rf"NVRM:\s*Xid\s*\(\s*({_BUS_ANY}(?:[\s,]+GPU-I:\s*\d{{1,4}})?)"
                  r"\s*\)\s*:\s*(\d{1,6})\s*(?:,\s*(.*))?$",
                  re.I | re.S | re.A)
_XID_START = re.compile(r"NVRM:\s*Xid\b", re.I | re.A)
# an SXid is the NVSwitch driver's, which names its device first: a line
# that starts "SXid" or "traps: SXid" is a process's name (14 bytes make
# "SXid(e5:00):1,") in the kernel's segfault or trap line
_SXID = re.compile(rf"(nvidia-nvswitch\d{{1,4}}):\s*SXid\s*\(\s*"
                   rf"({_BUS_ANY})"
                   r"\s*\)\s*:\s*(\d{1,6})\s*(?:,\s*(.*))?$", re.I | re.S | re.A)
_SXID_START = re.compile(r"(?:[\w.-]+:\s*)?SXid\b", re.I | re.A)
# the kernel's report of a fatal signal (kernel.print-fatal-signals=1) starts
# with the executable's file name, up to 255 bytes of the user's choosing,
# and ends with its own words: whatever it starts with, it is not a driver's
_FATAL_SIGNAL = re.compile(r":\s*potentially unexpected fatal signal\s+\d{1,3}\.?$", re.A)
_PID = re.compile(r"pid\s*=\s*'?([^',]*)'?\s*(?:,\s*|$)", re.A)
_PID_NUMBER = re.compile(r"[0-9]{1,10}")
_NAME = re.compile(r"name\s*=\s*([^,]*?)\s*(?:,\s*|$)", re.A)
_GPU_INSTANCE = re.compile(r"GPU-I:\s*(\d{1,4})", re.A)
_GPU_PREFIX = re.compile(rf"GPU\s+{_BUS}\s*:\s*", re.A)
# "GPU has fallen off the bus." (after an optional "GPU <bus id>: "), or
# "The NVIDIA GPU <bus id> (PCI ID: 10de:xxxx) installed in this system has
# fallen off the bus and is not responding to commands."
_FALLEN = re.compile(r"GPU has fallen off the bus\b", re.I | re.A)
_FALLEN_LONG = re.compile(rf"The NVIDIA GPU\s+{_BUS}\s*\(PCI ID:\s*{_HEX}{{4}}:{_HEX}{{4}}\)\s*"
                          r"installed in this system has\s+fallen off the bus\b", re.I | re.A)
_INIT_FAILED = re.compile(r"(?:RmInitAdapter|rm_init_adapter)\s+failed", re.I | re.A)
_MINOR = re.compile(r"device minor number\s+(\d{1,4})", re.I | re.A)
# the second and third lines of one SXid report repeat its number
_SXID_FOLLOWUP = re.compile(r"(?:Severity\s+\d|Data\s*\{)", re.I)


def normalize_pci(domain: str | None, bus: str, device: str, function: str | None) -> str:
    """Driver forms (PCI:0000:3b:00, 00000000:3B:00.0) -> 0000:3b:00.0;
    a domain beyond 16 bits (VMD: 10000) keeps its digits, as in sysfs."""
    domain = (domain or "0").lstrip("0").rjust(4, "0")
    return f"{domain}:{bus}:{device}.{function or '0'}".lower()


def _pci_of(where: str) -> str | None:
    """The bus id the driver's grammar put first in `where`."""
    m = _PCI.match(where)
    return normalize_pci(*m.groups()) if m else None


def _xid(line: str, m: re.Match) -> GpuKernelEvent:
    where, number, rest = m.group(1), int(m.group(2)), m.group(3) or ""
    pid = process = None
    pm = _PID.match(rest)
    if pm:     # pid=1234, pid='<unknown>'
        digits = pm[1].strip()
        pid, rest = (int(digits) if _PID_NUMBER.fullmatch(digits) else None), rest[pm.end():]
    nm = _NAME.match(rest)
    if nm:
        name, rest = nm[1].strip("' "), rest[nm.end():]
        process = name if name and name != "<unknown>" else None
    gi = _GPU_INSTANCE.search(where)
    return GpuKernelEvent("xid", line, pci=_pci_of(where), number=number, pid=pid,
                          process=process, gpu_instance=int(gi.group(1)) if gi else None,
                          detail=rest.strip())


def _sxid(line: str, m: re.Match) -> GpuKernelEvent | None:
    device, where, number, rest = m.group(1), m.group(2), int(m.group(3)), m.group(4) or ""
    if _SXID_FOLLOWUP.match(rest):
        return None
    fatal = None
    head, sep, tail = rest.partition(",")
    if head.strip().lower() in ("fatal", "non-fatal", "nonfatal"):
        fatal, rest = head.strip().lower() == "fatal", tail if sep else ""
    return GpuKernelEvent("sxid", line, pci=_pci_of(where), number=number, device=device,
                          fatal=fatal, detail=rest.strip())


def parse_gpu_line(message: str) -> GpuKernelEvent | None:
    """A kernel log line -> GPU event, a "malformed" event (an XID/SXid line
    that does not parse: count it), or None for anything else."""
    line = _DMESG_STAMP.sub("", message, count=1)
    if "\n" in line:
        # one printk of several "NVRM: ..." lines is one record
        line = _NEWLINES.sub(" ", line.strip())
    line = line.strip()
    if _FATAL_SIGNAL.search(line):
        ours = _XID_START.match(line) or _SXID_START.match(line) or line.startswith("NVRM:")
        return GpuKernelEvent(MALFORMED, line) if ours else None
    if _XID_START.match(line):
        m = _XID.match(line)
        return _xid(line, m) if m else GpuKernelEvent(MALFORMED, line)
    if _SXID_START.match(line):
        m = _SXID.match(line)
        return _sxid(line, m) if m else GpuKernelEvent(MALFORMED, line)
    if not line.startswith("NVRM:"):
        return None
    text = line[len("NVRM:"):].strip()
    pci = None
    gm = _GPU_PREFIX.match(text)
    if gm:
        pci, text = normalize_pci(*gm.groups()), text[gm.end():]
    if _FALLEN.match(text):
        return GpuKernelEvent("fallen_off_bus", line, pci=pci, detail=text)
    long_form = None if pci else _FALLEN_LONG.match(text)
    if long_form:
        return GpuKernelEvent("fallen_off_bus", line, pci=normalize_pci(*long_form.groups()),
                              detail=text)
    if _INIT_FAILED.match(text):
        minor = _MINOR.search(text)
        return GpuKernelEvent("init_failed", line, pci=pci,
                              device=f"nvidia{minor.group(1)}" if minor else None, detail=text)
    return None
