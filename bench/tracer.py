"""A tracer under test, as the benches run it (bench.overhead on the host,
bench.vm_modes in the guest): started in its own session, its output drained by
a thread so a full pipe never stalls it, ready once it has printed its ready
line and the set of BPF programs it holds has stopped changing."""
from __future__ import annotations

import os
import queue
import re
import signal
import subprocess
import threading
import time

from tracehound.bpf.held import held_ids


class Tool:
    settle_s = 0.7          # the program set must stay the same this long
    poll_s = 0.1
    stop_wait_s = 30
    drain_wait_s = 5        # bpftrace prints its maps on the way out
    tail = 20               # output lines an error shows

    def __init__(self, name: str, cmd: list[str], ready: str, stop_sig: int = signal.SIGTERM,
                 env: dict | None = None, cwd: str | os.PathLike | None = None):
        self.name, self.cmd, self.ready, self.stop_sig, self.env = name, cmd, ready, stop_sig, env
        self.cwd = cwd          # the repository root for a part of bench run by -m
        self.lines: list[str] = []
        self.q: queue.Queue = queue.Queue()
        self.proc: subprocess.Popen | None = None
        self.prog_ids: set[int] = set()

    def _drain(self) -> None:
        for line in self.proc.stdout:
            self.lines.append(line.rstrip("\n"))
            self.q.put(line)
        self.q.put(None)

    def _last(self) -> str:
        return "\n".join(self.lines[-self.tail:])

    def start(self, timeout: float = 60) -> None:
        self.lines, self.q = [], queue.Queue()
        self.proc = subprocess.Popen(self.cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     text=True, start_new_session=True, env=self.env,
                                     cwd=self.cwd)
        self.drainer = threading.Thread(target=self._drain, daemon=True)
        self.drainer.start()
        deadline = time.monotonic() + timeout
        try:
            self.next_line(self.ready, deadline - time.monotonic())
        except RuntimeError:
            self.stop()
            raise RuntimeError(f"{self.name} did not get ready:\n{self._last()}") from None
        # "ready" is printed before or while attaching: wait until the set of
        # programs it holds stops changing
        last, since = set(), time.monotonic()
        while time.monotonic() < deadline:
            ids = held_ids(self.proc.pid)["prog"]
            if ids != last:
                last, since = ids, time.monotonic()
            elif ids and time.monotonic() - since > self.settle_s:
                break
            time.sleep(self.poll_s)
        if not last:
            self.stop()
            raise RuntimeError(f"{self.name} holds no BPF programs:\n{self._last()}")
        self.prog_ids = last

    def next_line(self, pattern: str, timeout: float = 60) -> str:
        """The next output line matching `pattern`, within `timeout` seconds."""
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
        """A tracer that died mid-run would make its round a baseline round."""
        if self.proc.poll() is not None:
            self.drainer.join(timeout=self.drain_wait_s)
            raise RuntimeError(f"{self.name} exited ({self.proc.returncode}) during the run:\n"
                               + self._last())

    def stop(self) -> None:
        if not self.proc or self.proc.poll() is not None:
            return
        try:
            self.proc.send_signal(self.stop_sig)
            self.proc.wait(timeout=self.stop_wait_s)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        self.drainer.join(timeout=self.drain_wait_s)

    def url(self) -> str | None:
        """Where a tracehound agent serves its metrics."""
        for line in self.lines:
            m = re.search(r"serving metrics on (\S+)", line)
            if m:
                return m.group(1)
        return None
