"""Which RDMA NIC a GPU process uses, and how that NIC sits against its GPU.

A process's NICs are the uverbs devices it holds open (/proc/PID/fd links
to /dev/infiniband/uverbsN; /sys/class/infiniband_verbs/uverbsN/ibdev names
the RDMA device), which is what every libibverbs user holds for as long as
it has a context. The relation follows the two PCI devices' sysfs paths, in
the terms of `nvidia-smi topo -m`:

  pcie_switch   they share a PCIe bridge below the root port (PIX/PXB):
                GPUDirect RDMA goes peer to peer
  host_bridge   same PCIe root complex, no shared switch (PHB)
  numa_node     different root complexes on one NUMA node (NODE)
  cross_numa    different NUMA nodes (SYS): every transfer crosses the
                inter-socket link
  unknown       sysfs does not say (a container without /sys/bus/pci)

All paths are under the Topology's root, so tests use a fake tree.
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass

from ..host.procs import read_text
from ..host.topology import Topology

_UVERBS = re.compile(r"^/dev/infiniband/(uverbs\d+)$")
_PCI_ADDR = re.compile(r"^[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$")


@dataclass(frozen=True)
class RdmaNic:
    name: str               # mlx5_0
    pci_bus_id: str         # 0000:5e:00.0, "" when not a PCI device (soft-RoCE)
    numa_node: int | None


class Affinity:
    """One scrape's view of the RDMA NICs; build a new one per scrape."""

    def __init__(self, topo: Topology):
        self.topo = topo
        self.nics: dict[str, RdmaNic] = {}
        self._uverbs: dict[str, str] = {}       # uverbsN -> RDMA device
        self._held: dict[int, list[RdmaNic]] = {}   # pid -> its NICs, once per scrape
        base = os.path.join(topo.root, "sys/class/infiniband")
        for name in _listdir(base):
            dev = os.path.join(base, name, "device")
            real = os.path.basename(os.path.realpath(dev)) if os.path.exists(dev) else ""
            node = _int(read_text(os.path.join(dev, "numa_node")))
            self.nics[name] = RdmaNic(name, real if _PCI_ADDR.match(real) else "",
                                      node if node is not None and node >= 0 else None)
        verbs = os.path.join(topo.root, "sys/class/infiniband_verbs")
        for uv in _listdir(verbs):
            ibdev = read_text(os.path.join(verbs, uv, "ibdev"))
            if ibdev:
                self._uverbs[uv] = ibdev.strip()

    def nics_of(self, pid: int) -> list[RdmaNic]:
        """The RDMA devices the process holds open, by name (a process on
        several GPUs has its fds read once)."""
        if not self._uverbs:
            return []
        if pid not in self._held:
            self._held[pid] = self._scan(pid)
        return self._held[pid]

    def _scan(self, pid: int) -> list[RdmaNic]:
        fd_dir = os.path.join(self.topo.root, "proc", str(pid), "fd")
        found = set()
        for fd in _listdir(fd_dir):
            try:
                target = os.readlink(os.path.join(fd_dir, fd))
            except OSError:
                continue        # closed meanwhile
            m = _UVERBS.match(target)
            if m and m.group(1) in self._uverbs:
                found.add(self._uverbs[m.group(1)])
        return [self.nics[n] for n in sorted(found) if n in self.nics]

    def relation(self, gpu_bus_id: str, gpu_node: int | None, nic: RdmaNic) -> str:
        if gpu_node is not None and nic.numa_node is not None and gpu_node != nic.numa_node:
            return "cross_numa"
        a, b = self._pci_path(gpu_bus_id), self._pci_path(nic.pci_bus_id)
        if not a or not b:
            return "unknown"
        common = 0
        for x, y in zip(a, b):
            if x != y:
                break
            common += 1
        if common == 0:
            # different root complexes: on one node if both say so
            return "numa_node" if gpu_node is not None and gpu_node == nic.numa_node \
                else "unknown"
        # a[0] is the root complex (pci0000:00); a shared device after it is a bridge
        return "pcie_switch" if common > 1 else "host_bridge"

    def _pci_path(self, bus_id: str) -> list[str]:
        """['pci0000:3a', '0000:3a:00.0', '0000:3b:00.0', ...] from
        /sys/devices, the PCI device itself last; [] when unknown."""
        if not bus_id:
            return []
        link = os.path.join(self.topo.root, "sys/bus/pci/devices", bus_id)
        if not os.path.exists(link):
            return []
        parts = os.path.realpath(link).split(os.sep)
        for i, part in enumerate(parts):
            if part.startswith("pci") and ":" in part:
                return parts[i:-1]      # the device itself is not a shared hop
        return []


def _int(text: str | None) -> int | None:
    try:
        return int(text.strip()) if text is not None else None
    except ValueError:
        return None


def _listdir(path: str) -> list[str]:
    try:
        return sorted(os.listdir(path))
    except OSError:
        return []
