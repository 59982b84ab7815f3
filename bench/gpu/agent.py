"""The agent scripts/gpu-check reads (bench/gpu's parts 2 and 3):
`tracehound run` on a free port or, where that will not start, the same
Agent with only the subsystems that need no BPF; and the samples it exports.

prometheus_client, tracehound and bench/detection/chaos.py (yaml) are imported
where used: `python -m bench.gpu --missing-deps` runs on an interpreter without them.
"""
from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.request

from bench.gpu.report import ROOT, one_line

# the driver, which serves the GPU-only agent under --serve-gpu-only (run from ROOT)
DRIVER = ["-m", "bench.gpu"]
AGENT_READY_S = 90


def metric_samples(text: str, prefix: str = ""):
    """(name, labels, value) of each sample in Prometheus text whose name
    starts with `prefix`."""
    from prometheus_client.parser import text_string_to_metric_families

    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name.startswith(prefix):
                yield s.name, s.labels, s.value


def tracehound_cmd() -> list[str]:
    from bench.common import tracehound
    return tracehound()


class Agent:
    """A tracehound agent on a free port: `tracehound run`, or where that
    will not start (no libbpf, no BTF, a kernel that refuses BPF), the same
    Agent with only the subsystems that need no BPF (gpu among them)."""

    def __init__(self, work: str):
        self.work = work
        self.proc: subprocess.Popen | None = None
        self.lines: list[str] = []
        self.url = ""
        self.mode = ""
        self.refused = ""

    def start(self) -> None:
        state = os.path.join(self.work, "agent-state")
        os.makedirs(state, exist_ok=True)
        full = tracehound_cmd() + ["run", "--listen", "127.0.0.1:0", "--state-dir", state]
        why = self._launch(full)
        if not why:
            self.mode = "tracehound run"
            return
        self.refused = why
        gpu_only = [sys.executable, *DRIVER, "--serve-gpu-only", "--state-dir", state]
        why2 = self._launch(gpu_only)
        if why2:
            raise RuntimeError(f"`tracehound run` did not start ({why}); the GPU-only agent "
                               f"did not either ({why2})")
        self.mode = "GPU-only agent (no BPF subsystems)"

    def _launch(self, cmd: list[str]) -> str:
        """"" once it serves, else why not (its last lines)."""
        self.lines = []
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     text=True, start_new_session=True, cwd=ROOT)
        threading.Thread(target=self._drain, args=(self.proc, self.lines), daemon=True).start()
        deadline = time.monotonic() + AGENT_READY_S
        while time.monotonic() < deadline:
            m = next((re.search(r"serving metrics on (\S+)", line) for line in self.lines
                      if "serving metrics on" in line), None)
            if m:
                self.url = m.group(1)
                # the status lines follow at once; let them arrive
                n = -1
                while n != len(self.lines):
                    n = len(self.lines)
                    time.sleep(0.5)
                return ""
            if self.proc.poll() is not None:
                time.sleep(0.2)
                return f"exited {self.proc.returncode}: " + one_line(
                    " / ".join(self.lines[-4:]), 400)
            time.sleep(0.1)
        self.stop()
        return f"not serving after {AGENT_READY_S} s: " + one_line(" / ".join(self.lines[-4:]))

    @staticmethod
    def _drain(proc, lines: list) -> None:
        for line in proc.stdout:
            lines.append(line.rstrip("\n"))

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()

    def scrape(self) -> str:
        with urllib.request.urlopen(self.url, timeout=10) as r:
            return r.read().decode()

    def gpu_line(self) -> str:
        """What the agent's gpu subsystem said at start-up."""
        return next((line.split("tracehound: ", 1)[-1] for line in self.lines
                     if line.startswith("tracehound: gpu: ")), "gpu: said nothing")

    def probes(self) -> tuple[list[str], list[str]]:
        """(probes loaded, as "name (mode)"; what did not load, with why)."""
        loaded = []
        try:
            for name, labels, _ in metric_samples(self.scrape(), "tracehound_probe"):
                if name == "tracehound_probe_info":
                    loaded.append(f"{labels['probe']} ({labels['mode']})")
        except (OSError, ValueError):
            pass
        missing = [line.split("tracehound: ", 1)[-1] for line in self.lines
                   if "not available" in line or "not hooked" in line or "no TCP counters" in line]
        if self.refused:
            missing.insert(0, "every BPF probe: `tracehound run` refused to start "
                              f"({self.refused})")
        return loaded, missing


def serve_gpu_only(state_dir: str, listen: str = "127.0.0.1:0") -> int:
    """The agent with the subsystems that need no BPF, until SIGTERM."""
    from tracehound.agent import Agent as TracehoundAgent
    from tracehound.config import AgentConfig
    from tracehound.subsystems import SUBSYSTEMS

    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    os.makedirs(state_dir, exist_ok=True)
    subsystems = tuple(s for s in SUBSYSTEMS if not s.needs_bpf)
    agent = TracehoundAgent(AgentConfig(listen=listen, state_dir=state_dir),
                            subsystems=subsystems, stop=stop).start()
    try:
        print(f"tracehound: serving metrics on {agent.exporter.url}", flush=True)
        print(f"tracehound: subsystems {', '.join(s.name for s in subsystems)} only", flush=True)
        for s in agent.subsystems:
            for line in s.status_lines():
                print(f"tracehound: {line}", flush=True)
        stop.wait()
    finally:
        agent.stop()
    return 0
