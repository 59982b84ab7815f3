"""The guest kernel's console, watched while the VM runs: an oops ends the
boot at once instead of after the scenarios' timeouts.

Why a boot can oops here: the VM runs under TCG (no KVM). With two vCPUs,
an agent attaching fentry programs rewrote the entry of functions
(vfs_read...) that the other vCPU was running: a 6.1 guest oopsed at a NULL
instruction pointer in pread64 that way, once in many runs, then wedged a
CPU for the rest of the run. The guest now has one vCPU (GUEST_CPUS of
tests/vm/scenarios.py);
the watch stays for any other oops. The harness boots again once
(run_scenarios) and says so; a second oops fails the tier.
"""
from __future__ import annotations

from pathlib import Path

# what the kernel prints when it oopses or panics (not a soft lockup warning:
# an emulated CPU can be that slow and still recover)
MARKERS = (b"Oops: ", b"Kernel panic - not syncing", b"BUG: kernel NULL pointer dereference")


class ConsoleWatch:
    def __init__(self, path: Path):
        self.path = path
        self.offset = 0
        self.carry = b""

    def oops(self) -> str | None:
        """The first oops line written since the last look, or None."""
        try:
            with open(self.path, "rb") as f:
                f.seek(self.offset)
                data = f.read()
        except OSError:
            return None
        self.offset += len(data)
        text, self.carry = self.carry + data, b""
        lines = text.split(b"\n")
        self.carry = lines.pop()            # an unfinished line: looked at next time
        for line in lines:
            if any(m in line for m in MARKERS):
                return line.decode("utf-8", "replace").strip()
        return None
