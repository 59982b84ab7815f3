"""The guest's handle on one tracer of bench/vm_modes: started in its own
session, ready once its set of BPF programs settles, and the run counts of
those programs read from /proc."""
from __future__ import annotations

import json
import os
import re
from pathlib import Path

from bench import tracer
from bench.common import sh


def prog_runs(pid: int) -> dict[int, tuple[int, int]]:
    """run_cnt and run_time_ns of each program the process holds an fd of,
    from fdinfo: bpftool would cost seconds per call under emulation."""
    out = {}
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            if "bpf-prog" not in os.readlink(f"/proc/{pid}/fd/{fd}"):
                continue
            info = dict(re.findall(r"^(\w+):\s*(\d+)$", Path(f"/proc/{pid}/fdinfo/{fd}").read_text(), re.M))
        except OSError:
            continue
        if "run_cnt" in info:
            out[int(info["prog_id"])] = (int(info["run_cnt"]), int(info["run_time_ns"]))
    return out


def prog_names(ids: set[int]) -> dict[int, str]:
    return {p["id"]: p.get("name", "?") for p in json.loads(sh(["bpftool", "prog", "show", "-j"]))
            if p["id"] in ids}


class Tool(tracer.Tool):
    """Under emulation everything is slower: a longer start, settle and stop."""
    settle_s, poll_s, stop_wait_s, drain_wait_s, tail = 1.0, 0.2, 60, 10, 15

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.names: dict[int, str] = {}      # program id -> name, filled once it is ready

    def start(self, timeout: float = 240) -> None:
        super().start(timeout)
