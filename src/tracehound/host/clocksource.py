"""The kernel's clock source, which sets what a clock read costs a BPF
program (bpf_ktime_get_ns reads it): tens of ns where it is the CPU's own
counter, hundreds of ns to microseconds where it is a device (HPET, the ACPI
PM timer), whose reads also go through the hypervisor in a VM. Sampled
timing (--latency on) picks its default gap from it (defaults.py)."""
from __future__ import annotations

import re

from .. import defaults

CURRENT = "/sys/devices/system/clocksource/clocksource0/current_clocksource"
# read from a counter of the CPU itself, or a page the hypervisor keeps
# beside it: no device access
CHEAP = frozenset({"tsc", "kvm-clock", "xen", "hyperv_clocksource_tsc_page",
                   "arch_sys_counter", "riscv_clocksource", "tod"})
_NAME = re.compile(r"[A-Za-z0-9_.-]{1,40}")


def current(path: str = CURRENT) -> str | None:
    """The clock source's name, or None where it cannot be read (no sysfs,
    or not a name)."""
    try:
        with open(path, "rb") as f:
            raw = f.read(64)
    except OSError:
        return None
    name = raw.decode("ascii", "replace").strip()
    return name if _NAME.fullmatch(name) else None


def sample_gap_ns(source: str | None) -> tuple[int, str]:
    """The default gap of sampled timing for this clock source, and why."""
    if source is None:
        return defaults.LATENCY_SAMPLE_GAP_NS, "clock source unknown"
    if source in CHEAP:
        return defaults.LATENCY_SAMPLE_GAP_NS, f"clock source {source}"
    return defaults.LATENCY_SAMPLE_GAP_SLOW_CLOCK_NS, f"clock source {source}, slow to read"
