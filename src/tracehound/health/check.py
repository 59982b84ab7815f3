"""One run of `tracehound health`: ask the agent, decide, act on Slurm.

    verdict = check(options)     # Verdict: findings, action, refusal, exit code

Actions on this node, as slurmctld sees it:
  fit, not drained by tracehound          nothing
  fit, drained by tracehound              resume
  unfit, not drained                      drain with the findings as reason,
                                          unless the breaker refuses
  unfit, drained by tracehound            nothing (the first reason stays: it
                                          dates the drain the breaker ranks by)
  drained by anyone else                  nothing, whatever the findings
"""
from __future__ import annotations

import http.client
import json
import os
import time
import urllib.error
import urllib.parse
from dataclasses import dataclass, field

from ..clients.agent_client import open_agent
from .rules import WANTED_NAMES, Finding, Memory, Rules, findings
from .slurm import Breaker, Slurm, drain_reason

# exit codes: also what NHC's check_cmd_status and a textfile alert read
FIT, UNFIT, ERROR, REFUSED = 0, 1, 2, 3
# far above any agent's exposition (its series are bounded by --max-series)
MAX_METRICS_BYTES = 64 << 20
# the agent renders only these (the name[] filter), not its I/O series
METRICS_QUERY = "/metrics?" + urllib.parse.urlencode([("name[]", n) for n in WANTED_NAMES])


@dataclass
class Options:
    node: str
    url: str
    timeout: float
    rules: Rules
    breaker: Breaker
    slurm: Slurm | None           # None: --check-only, Slurm is not asked
    state_file: str | None
    agent_env: dict = field(default_factory=dict)


@dataclass
class Verdict:
    node: str
    findings: list
    action: str = "none"           # none, drain, resume, left (someone else's drain)
    reason: str = ""
    refusal: str = ""
    drained_by_other: str = ""

    @property
    def code(self) -> int:
        if self.refusal:
            return REFUSED
        return UNFIT if self.findings else FIT

    def line(self) -> str:
        """The one line NHC and slurmd's log get."""
        if not self.findings:
            head = "fit"
        else:
            head = "unfit: " + "; ".join(f.phrase for f in self.findings)
        out = f"{self.node}: {head}"
        if self.action in ("drain", "resume"):
            out += "; drained" if self.action == "drain" else "; resumed"
        if self.drained_by_other:
            out += f"; drained by someone else ({self.drained_by_other}), left alone"
        if self.refusal:
            out += f"; not drained: {self.refusal}"
        return out


def scrape(url: str, timeout: float, env: dict) -> str | None:
    """The agent's /metrics text, or None when it does not answer in full
    within `timeout` (an agent that trickles its answer is as unfit as one
    that does not answer: the check must end within its time)."""
    deadline = time.monotonic() + timeout
    chunks, size = [], 0
    try:
        with open_agent(url.rstrip("/") + METRICS_QUERY, timeout=timeout, env=env) as resp:
            while True:
                left = deadline - time.monotonic()
                if left <= 0:
                    return None
                _socket_timeout(resp, left)
                chunk = resp.read1(65536) if hasattr(resp, "read1") else resp.read(65536)
                if not chunk:
                    break
                size += len(chunk)
                if size > MAX_METRICS_BYTES:
                    return None
                chunks.append(chunk)
    except (urllib.error.URLError, http.client.HTTPException, OSError, ValueError):
        return None
    return b"".join(chunks).decode("utf-8", "replace")


def _socket_timeout(resp, seconds: float) -> None:
    sock = getattr(getattr(getattr(resp, "fp", None), "raw", None), "_sock", None)
    if sock is not None:
        sock.settimeout(seconds)


def load_memory(path: str | None) -> Memory:
    if not path:
        return Memory()
    try:
        with open(path) as f:
            return Memory.from_json(json.load(f))
    except (OSError, ValueError):
        return Memory()


def save_memory(path: str | None, memory: Memory) -> None:
    if not path:
        return
    os.makedirs(os.path.dirname(path) or ".", mode=0o755, exist_ok=True)
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w") as f:
        json.dump(memory.to_json(), f)
    os.replace(tmp, path)


def evaluate(opts: Options) -> list[Finding]:
    text = scrape(opts.url, opts.timeout, opts.agent_env)
    if text is None:
        found = [Finding("agent_down", f"agent not answering at {opts.url}")]
        return [f for f in found if f.condition in opts.rules.conditions]
    memory = load_memory(opts.state_file)
    found = findings(text, opts.rules, memory, time.time())
    save_memory(opts.state_file, memory)
    return found


def check(opts: Options) -> Verdict:
    verdict = Verdict(opts.node, evaluate(opts))
    if opts.slurm is None:
        return verdict
    nodes = opts.slurm.nodes()
    me = nodes.get(opts.node)
    if me is None:
        raise LookupError(f"slurmctld knows no node {opts.node}")
    if me.drained and not me.ours:
        verdict.drained_by_other = me.reason or "no reason"
        return verdict
    if not verdict.findings:
        if me.ours:
            opts.slurm.resume(opts.node)
            verdict.action = "resume"
        return verdict
    if not me.ours:
        refusal = opts.breaker.refusal(nodes, opts.node)
        if refusal:
            verdict.refusal = refusal
            return verdict
        verdict.reason = drain_reason([f.phrase for f in verdict.findings])
        opts.slurm.drain(opts.node, verdict.reason)
        verdict.action = "drain"
        if opts.slurm.dry_run:
            return verdict
        nodes = opts.slurm.nodes()
    # nodes draining at the same moment may each have seen room for one more
    over = opts.breaker.overshoot(nodes, opts.node)
    if over:
        opts.slurm.resume(opts.node)
        verdict.action, verdict.refusal = "none", over
    return verdict
