"""NUMA topology and per-process placement, read from sysfs and procfs.

Every path is taken relative to `root` so tests can point the reader at a
temporary tree that mimics /sys and /proc.
"""
from __future__ import annotations

import glob
import os
import re
from dataclasses import dataclass

from .procs import cgroup_v2_path, read_text

_NODE_DIR = re.compile(r"node(\d+)$")


def parse_cpulist(text: str) -> set[int]:
    """'0-3,8,10-11' (the kernel's list format) -> {0, 1, 2, 3, 8, 10, 11}."""
    out: set[int] = set()
    for part in text.strip().split(","):
        part = part.strip()
        if not part:
            continue
        lo, _, hi = part.partition("-")
        # ranges may carry a stride ("0-7:2") on recent kernels
        hi, _, stride = hi.partition(":")
        out.update(range(int(lo), int(hi or lo) + 1, int(stride or 1)))
    return out


def cpus_from_mask_words(words, word_bits: int = 64) -> set[int]:
    """An affinity bitmap as an array of words, lowest CPUs first -> CPU numbers."""
    cpus = set()
    for i, word in enumerate(words):
        word = int(word)
        bit = 0
        while word:
            if word & 1:
                cpus.add(i * word_bits + bit)
            word >>= 1
            bit += 1
    return cpus


def normalize_pci_bus_id(bus_id) -> str:
    """NVML's '00000000:3B:00.0' -> sysfs's '0000:3b:00.0'."""
    if isinstance(bus_id, bytes):
        bus_id = bus_id.decode(errors="replace")
    bus_id = bus_id.strip("\x00 \t\n").lower()
    domain, sep, rest = bus_id.partition(":")
    if sep and rest.count(":") == 1:
        # NVML pads the domain to 8 digits; sysfs uses 4, more for a domain
        # beyond 16 bits (Intel VMD: 10000), as the kernel log does
        domain = domain.lstrip("0").rjust(4, "0")
        return f"{domain}:{rest}"
    return bus_id


@dataclass(frozen=True)
class Nic:
    device: str
    subsystem: str      # "net" or "infiniband"
    numa_node: int      # -1 where the firmware does not say


@dataclass(frozen=True)
class Placement:
    """Where the kernel lets a process run and allocate."""
    cpus: frozenset[int]
    mems: frozenset[int]


class Topology:
    def __init__(self, root: str = "/"):
        self.root = root
        self._cpu_nodes: dict[int, int] | None = None

    def _path(self, *parts: str) -> str:
        return os.path.join(self.root, *parts)

    def _read(self, *parts: str) -> str | None:
        return read_text(self._path(*parts))

    def _read_int(self, *parts: str) -> int | None:
        text = self._read(*parts)
        try:
            return int(text.strip()) if text is not None else None
        except ValueError:
            return None

    def pci_numa_node(self, bus_id) -> int | None:
        """NUMA node of a PCI device; None when unknown (missing or -1)."""
        node = self._read_int("sys/bus/pci/devices", normalize_pci_bus_id(bus_id), "numa_node")
        return node if node is not None and node >= 0 else None

    def cpu_nodes(self) -> dict[int, int]:
        """CPU number -> NUMA node. Cached: hot-added CPUs are rare on GPU nodes."""
        if self._cpu_nodes is None:
            nodes: dict[int, int] = {}
            for d in glob.glob(self._path("sys/devices/system/node/node*")):
                m = _NODE_DIR.search(d)
                text = self._read(d, "cpulist") if m else None
                if text is None:
                    continue
                for cpu in parse_cpulist(text):
                    nodes[cpu] = int(m.group(1))
            self._cpu_nodes = nodes
        return self._cpu_nodes

    def numa_nodes_of_cpus(self, cpus) -> set[int]:
        table = self.cpu_nodes()
        return {table[c] for c in cpus if c in table}

    def nics(self) -> list[Nic]:
        """Network and RDMA devices backed by hardware (those with a device link)."""
        out = []
        for subsystem in ("net", "infiniband"):
            base = self._path("sys/class", subsystem)
            try:
                names = sorted(os.listdir(base))
            except OSError:
                continue
            for name in names:
                node = self._read_int("sys/class", subsystem, name, "device", "numa_node")
                if node is None:
                    continue    # virtual devices (lo, veth, bridges) have no device link
                out.append(Nic(name, subsystem, node))
        return out

    def process_cgroup(self, pid: int) -> str | None:
        """The process's cgroup v2 path (the '0::' line), None if it is gone."""
        return cgroup_v2_path(pid, os.path.join(self.root, "proc"))

    def process_placement(self, pid: int) -> Placement | None:
        text = self._read("proc", str(pid), "status")
        if text is None:
            return None
        fields = {}
        for line in text.splitlines():
            key, sep, value = line.partition(":")
            if sep:
                fields[key] = value.strip()
        try:
            cpus = parse_cpulist(fields.get("Cpus_allowed_list", ""))
            mems = parse_cpulist(fields.get("Mems_allowed_list", ""))
        except ValueError:
            return None
        return Placement(frozenset(cpus), frozenset(mems))

    def misplaced(self, placement: Placement, gpu_node: int) -> bool:
        """True when the process may neither run nor allocate near the GPU's node.

        Either side alone is enough: CPUs all on another node mean every
        host-side copy crosses the interconnect, and so do memory nodes all on
        another node. Unknown (empty) sets never count as misplaced.
        """
        cpu_nodes = self.numa_nodes_of_cpus(placement.cpus)
        if cpu_nodes and gpu_node not in cpu_nodes:
            return True
        return bool(placement.mems) and gpu_node not in placement.mems
