"""Loader for cgroup_names.bpf.o: the kernel's own name for every cgroup
made in the hierarchy the agent counts by (see the object's header for why).

One hook, the cgroup_mkdir trace event. A kernel that refuses it leaves the
probe unavailable with a reason: the agent then learns names by watching the
tree and rescanning it, as before, and never stops for it.
"""
from __future__ import annotations

import os
import struct

from ..bpf import features
from ..bpf.layout import EnumLayout, Layout
from ..bpf.lifecycle import OptionalProbe, open_loaded
from ..bpf.loader import BpfObject, Map
from ..errors import TracehoundError
from . import object_path

OBJECT = "cgroup_names"
NAME_LEN = 512                       # CGROUP_NAME_LEN in cgroup_names.h
HEALTH = ("too_long",)
LAYOUTS = (
    Layout("cgroup_name", [("path", f"{NAME_LEN}s")]),
    EnumLayout("cgroup_names_health", HEALTH, "N_", stop="N_MAX"),
)
RODATA = ".rodata.hierarchy"
PROC_CGROUPS = "/proc/cgroups"
U64 = struct.Struct("=Q")


def hierarchy_id(key: str, proc_cgroups: str = PROC_CGROUPS) -> int:
    """The kernel's number for the hierarchy a cgroup key counts by: 0 for
    v2, else the one the v1 controller is bound to (/proc/cgroups)."""
    if key == "v2":
        return 0
    with open(proc_cgroups, encoding="ascii", errors="replace") as f:
        for line in f:
            fields = line.split()
            if len(fields) >= 2 and fields[0] == key and fields[1].isdigit():
                if int(fields[1]) == 0:
                    break
                return int(fields[1])
    raise TracehoundError(f"the {key} controller is bound to no v1 hierarchy ({proc_cgroups})")


def decode_path(raw: bytes) -> str | None:
    """A path as the resolver keeps it, or None for one that is not a path.
    Names are a user's bytes: those that are not UTF-8 stay as surrogates,
    as os.walk gives them."""
    path = raw[:NAME_LEN].split(b"\0", 1)[0]
    if not path.startswith(b"/"):
        return None
    return os.fsdecode(path)


class CgroupNamesProbe(OptionalProbe):
    """start() never raises for a refusing kernel: `available` is then
    False and `reason` says why."""

    name = "cgroup_names"

    def __init__(self, cgroup_key: str = "v2"):
        self.cgroup_key = cgroup_key
        self.obj: BpfObject | None = None
        self._names: Map | None = None

    def _start(self) -> None:
        if not features.ensure_tracefs():
            raise TracehoundError("tracefs is not mounted and could not be mounted")
        if not os.path.isdir(os.path.join(features.TRACEFS, "events", "cgroup", "cgroup_mkdir")):
            raise TracehoundError("no cgroup/cgroup_mkdir trace event")
        hierarchy = struct.pack("=i", hierarchy_id(self.cgroup_key))
        self.obj, maps = open_loaded(
            object_path(OBJECT), maps=("cgroup_names",),
            prepare=lambda obj: obj.map(RODATA).set_initial_value(hierarchy))
        self._names = maps["cgroup_names"]

    def lookup(self, cgroup_id: int) -> str | None:
        """The path the kernel gave the cgroup at mkdir, if it was made
        while the probe ran and its name is still held."""
        table = self._names
        if table is None:
            return None
        raw = table.lookup(U64.pack(cgroup_id))
        return None if raw is None else decode_path(raw)

    def close(self) -> None:
        self._names = None
        if self.obj is not None:
            self.obj.close()
            self.obj = None
