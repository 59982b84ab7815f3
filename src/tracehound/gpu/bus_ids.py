"""--gpu-bus-ids: the GPUs one agent serves, when several agents share a
host's GPUs (one per container, partition or simulated node).

Bus ids are compared in the kernel log's form (0000:3b:00.0), the form
NVML's are normalised to."""
from __future__ import annotations

import argparse
import re

from ..host.topology import normalize_pci_bus_id

_BUS_ID = re.compile(r"[0-9a-f]{1,8}:[0-9a-f]{2}:[0-1][0-9a-f]\.[0-7]", re.A)


def bus_id_list(value: str) -> frozenset[str]:
    """'0000:3b:00.0,00000000:5E:00.0' -> {'0000:3b:00.0', '0000:5e:00.0'}"""
    out = set()
    for item in value.split(","):
        item = item.strip().lower()
        if not _BUS_ID.fullmatch(item):
            raise argparse.ArgumentTypeError(f"not a PCI bus id (DOMAIN:BUS:DEVICE.FUNCTION): "
                                             f"{item!r}")
        out.add(normalize_pci_bus_id(item))
    if not out:
        raise argparse.ArgumentTypeError("no bus id given")
    return frozenset(out)


def served(bus_ids: frozenset[str] | None, pci: str | None) -> bool:
    """Whether an agent restricted to bus_ids (None: all) serves this GPU;
    with a restriction, a line or GPU that names no bus id is not served."""
    return bus_ids is None or (pci is not None and pci in bus_ids)
