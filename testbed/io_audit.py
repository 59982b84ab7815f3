"""The full histograms of an agent run with `--latency audit`: it times
every call, lets the sampler pick as it would, and keeps both histograms of
the same calls, each read by the same clock: the sampled one (weights, as
exported) in io_stats, the full one (every call once) in io_audit
(io_sample.bpf.h). bench/latency_sampling compares the two, and the kernel
tests check them.

io_audit is read from the kernel by the agent's pid (the maps it holds),
with bpftool's BTF-formatted dump, and turned into the buckets the exporter
would make of it (tracehound.collectors.io.LATENCY)."""
from __future__ import annotations

import json
import math
import os
import re
import subprocess
from collections.abc import Collection

from tracehound.collectors.io import LATENCY
from tracehound.host.mounts import MountTable
from tracehound.probes.io_maps import HIST_SLOTS, HISTS, IO_KEY

AUDIT_SIZE = len(HISTS) * (HIST_SLOTS + 1) * 8      # struct io_audit


def _bpftool(*args: str):
    return json.loads(subprocess.run(["bpftool", "-j", *args], check=True, capture_output=True,
                                     text=True).stdout)


def audit_map_id(pid: int) -> int:
    """The io_audit map that process `pid` (the agent) holds: picked by its
    shape in /proc/PID/fdinfo (a hash of io_key to io_audit, not
    preallocated), then its name checked, so that a single bpftool call is
    made (each costs seconds in an emulated guest)."""
    shape = {"map_type": 1, "key_size": IO_KEY.size, "value_size": AUDIT_SIZE, "map_flags": 1}
    found = set()
    for fd in os.listdir(f"/proc/{pid}/fdinfo"):
        try:
            with open(f"/proc/{pid}/fdinfo/{fd}") as f:
                info = dict(re.findall(r"^(\w+):\s*(\S+)", f.read(), re.M))
        except OSError:
            continue            # closed since the listing
        if "map_id" in info and all(int(info.get(k, "-1"), 0) == v for k, v in shape.items()):
            found.add(int(info["map_id"]))
    named = [m for m in found if _bpftool("map", "show", "id", str(m)).get("name") == "io_audit"]
    if len(named) != 1:
        raise RuntimeError(f"agent {pid} holds {len(named)} io_audit maps, expected 1 "
                           "(is it run with --latency audit?)")
    return named[0]


def full_histograms(pid: int, picked: dict | None = None
                    ) -> dict[tuple[int, int], dict[str, list[int]]]:
    """(cgroup id, mount id) -> {read, write, fsync: log2 slots}, every call
    counted once. PICKED, where given, is filled from the same dump: (cgroup
    id, mount id) -> {read, write, fsync: calls the sampler picked}."""
    out = {}
    for entry in _bpftool("map", "dump", "id", str(audit_map_id(pid))):
        rec = entry.get("formatted", entry)
        key, hist = rec["key"], rec["value"]["hist"]
        if key["flags"]:
            continue            # a device number for a mount: not a workload's file
        # BTF gives the 2-D array as rows, one per histogram
        rows = hist if isinstance(hist[0], list) else \
            [hist[i * HIST_SLOTS:(i + 1) * HIST_SLOTS] for i in range(len(HISTS))]
        out[(key["cgroup_id"], key["mnt"])] = dict(zip(HISTS, map(list, rows)))
        if picked is not None:
            picked[(key["cgroup_id"], key["mnt"])] = dict(zip(HISTS, rec["value"]["picked"]))
    return out


def buckets(slots: list[int]) -> dict[float, float]:
    """le -> cumulative count, as the exporter renders log2 slots."""
    return dict(zip([*LATENCY.bounds, math.inf], map(float, LATENCY.cumulative(slots))))


def summed(hists: dict, cgroup_id: int, mnt_ids: set[int], hist: str = "read") -> list[int]:
    """One cgroup's slots of HIST over the mounts given."""
    total = [0] * HIST_SLOTS
    for (cg, mnt), by_hist in hists.items():
        if cg == cgroup_id and mnt in mnt_ids:
            total = [a + b for a, b in zip(total, by_hist[hist])]
    return total


def picked_by(picked: dict, cgroup_id: int, mnt_ids: set[int], hist: str = "read") -> int:
    """One cgroup's calls of HIST the sampler picked, over the mounts given
    (PICKED as full_histograms fills it)."""
    return sum(by_hist[hist] for (cg, mnt), by_hist in picked.items()
               if cg == cgroup_id and mnt in mnt_ids)


def mount_ids(mountpoints: Collection[str]) -> set[int]:
    """The ids of the mounts at MOUNTPOINTS, as the kernel keys them."""
    return {m.mnt_id for m in MountTable().mounts if m.mountpoint in mountpoints}
