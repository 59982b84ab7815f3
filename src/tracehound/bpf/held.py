"""The BPF programs and maps a process holds, read from /proc/PID/fdinfo.

Going by the holder rather than diffing the kernel's global lists keeps out
whatever else loads BPF meanwhile (tests, another agent, a second bench).
A program fd and a link fd both name their program (`prog_id:`), a map fd
its map (`map_id:`); the kernel frees each once its last holder closes it.
"""
from __future__ import annotations

import os
import re

_ID = re.compile(r"^(prog|map)_id:\s*(\d+)", re.M)


def held_ids(pid: int, proc: str = "/proc") -> dict[str, set[int]]:
    """{"prog": ids, "map": ids} that process `pid` holds an fd of."""
    out: dict[str, set[int]] = {"prog": set(), "map": set()}
    for fd in os.listdir(f"{proc}/{pid}/fdinfo"):
        try:
            with open(f"{proc}/{pid}/fdinfo/{fd}") as f:
                info = f.read()
        except OSError:
            continue            # closed since the listing
        for kind, ident in _ID.findall(info):
            out[kind].add(int(ident))
    return out
