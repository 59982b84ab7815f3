"""The guest's handle on one tracer of bench/vm_modes.py: started in its own
session, ready once its set of BPF programs settles, and the run counts of
those programs read from /proc."""
from __future__ import annotations

import json
import os
import queue
import re
import signal
import subprocess
import threading
import time
from pathlib import Path

from tracehound.bpf.held import held_ids
from vm_modes_common import sh


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


class Tool:
    """A tracer in its own session; a thread drains its output so that a full
    pipe never stalls it."""

    def __init__(self, name: str, cmd: list[str], ready: str, stop_sig=signal.SIGTERM):
        self.name, self.cmd, self.ready, self.stop_sig = name, cmd, ready, stop_sig
        self.proc, self.lines, self.prog_ids, self.names = None, [], set(), {}

    def _drain(self) -> None:
        for line in self.proc.stdout:
            self.lines.append(line.rstrip("\n"))
            self.q.put(line)
        self.q.put(None)

    def start(self, timeout: float = 240) -> None:
        self.lines, self.q = [], queue.Queue()
        self.proc = subprocess.Popen(self.cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     text=True, start_new_session=True)
        self.drainer = threading.Thread(target=self._drain, daemon=True)
        self.drainer.start()
        deadline = time.monotonic() + timeout
        try:
            self.next_line(self.ready, deadline - time.monotonic())
        except RuntimeError:
            self.stop()
            raise RuntimeError(f"{self.name} did not get ready:\n" + "\n".join(self.lines[-15:]))
        # ready may be printed while still attaching: wait for the program set to settle
        last, since = set(), time.monotonic()
        while time.monotonic() < deadline:
            ids = held_ids(self.proc.pid)["prog"]
            if ids != last:
                last, since = ids, time.monotonic()
            elif ids and time.monotonic() - since > 1.0:
                break
            time.sleep(0.2)
        if not last:
            self.stop()
            raise RuntimeError(f"{self.name} holds no BPF programs:\n" + "\n".join(self.lines[-15:]))
        self.prog_ids = last

    def next_line(self, pattern: str, timeout: float = 60) -> str:
        deadline = time.monotonic() + timeout
        while True:
            try:
                line = self.q.get(timeout=max(0.1, deadline - time.monotonic()))
            except queue.Empty:
                line = None
            if line is None or time.monotonic() > deadline:
                raise RuntimeError(f"{self.name}: no line matching {pattern!r}")
            if re.search(pattern, line):
                return line

    def check_alive(self) -> None:
        if self.proc.poll() is not None:
            raise RuntimeError(f"{self.name} exited ({self.proc.returncode}):\n"
                               + "\n".join(self.lines[-15:]))

    def stop(self) -> None:
        if not self.proc or self.proc.poll() is not None:
            return
        try:
            self.proc.send_signal(self.stop_sig)
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        self.drainer.join(timeout=10)  # bpftrace prints its maps on the way out

