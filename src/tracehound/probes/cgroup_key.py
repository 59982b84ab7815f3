"""The cgroup key a probe counts by (cgroup_key.bpf.h), set before load."""
from __future__ import annotations

import struct

from ..bpf.loader import BpfObject

# cgroup_key.bpf.h CGROUP_KEY_*
CODES = {"v2": 0, "freezer": 1, "cpuset": 2, "memory": 3}
RODATA = ".rodata.cgroup_key"


def set_cgroup_key(obj: BpfObject, key: str) -> None:
    """Before obj.load(): count by `key` ("v2" or a v1 controller of CODES)."""
    obj.map(RODATA).set_initial_value(struct.pack("=I", CODES[key]))
