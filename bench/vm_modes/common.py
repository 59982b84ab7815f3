"""What the host, the guest and the program holders of bench/vm_modes
share: where things are, the fio workloads and the hook modes compared."""
from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
STATS = Path("/proc/sys/kernel/bpf_stats_enabled")
MNT = "/tmp/vm-modes-bench"          # the tmpfs in the guest; CEEMS keys on this path
CGROUP = "vm-modes-fio"              # fio runs here: CEEMS ignores the root cgroup
MODES = ("fentry", "kprobe", "tracepoint")
WORKLOADS = {  # name: (file, fio rw, block size)
    "randread-4k": ("r", "randread", "4k"),
    "seqread-1m": ("r", "read", "1M"),
    "seqwrite-1m": ("w", "write", "1M"),
}
