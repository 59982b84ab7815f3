"""One run of `tracehound health`: ask the agent, decide, act on Slurm.

    verdict = check(options)     # Verdict: findings, action, refusal, exit code

The evidence is the agent's own answer on its root-only local channel
(exporter/local.py): a port any user can bind or crowd is not evidence. An
agent that does not answer is retried within the run (short backoff), and
is `agent_down` only after `agent_down_after` runs in a row failed, so a
restart or a loaded moment drains nothing; its cause is in the reason.

Actions on this node, as slurmctld sees it:
  fit, not drained by tracehound          nothing
  fit, drained by tracehound              resume
  unfit, not drained                      drain with the findings as reason,
                                          under the drain lock, unless the
                                          breaker refuses or the condition is
                                          common mode (breaker.py)
  unfit, drained by tracehound            nothing (the first reason stays)
  drained by anyone else                  nothing, whatever the findings
Every run with Slurm also declares what it found in the node's comment
(when that comment is empty or tracehound's), which common mode counts.
"""
from __future__ import annotations

import json
import time
import urllib.parse
from dataclasses import dataclass, field

from ..clients.local_agent import LocalAgentError, read_local
from .breaker import Breaker, Declaration, parse_comment
from .files import FileRefused, read_own, write_whole
from .rules import WANTED_NAMES, Finding, Memory, Rules, findings
from .slurm import DrainLock, LockBusy, Slurm, drain_reason

# exit codes: also what NHC's check_cmd_status and a textfile alert read
FIT, UNFIT, ERROR, REFUSED = 0, 1, 2, 3
HEALTH_QUERY = "/health"
MAX_STATE_BYTES = 1 << 20
# pauses between tries of one run (then the run's time is up)
BACKOFF_S = (0.2, 0.5, 1.0)


@dataclass
class Options:
    node: str
    socket: str                   # the agent's local channel
    timeout: float                # the run's whole time for the agent, tries included
    rules: Rules
    breaker: Breaker
    slurm: Slurm | None           # None: --check-only, Slurm is not asked
    state_file: str | None
    agent_down_after: int = 2
    lock_wait_s: float = 10.0


@dataclass
class Verdict:
    node: str
    findings: list
    action: str = "none"           # none, drain, resume
    reason: str = ""
    refusal: str = ""
    drained_by_other: str = ""
    pending: str = ""              # the agent failed, fewer runs in a row than agent_down_after
    common_mode: dict = field(default_factory=dict)    # condition -> why

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
            head = "unfit: " + "; ".join(dict.fromkeys(f.phrase for f in self.findings))
        out = f"{self.node}: {head}"
        if self.pending:
            out += f" so far; {self.pending}"
        if self.action in ("drain", "resume"):
            out += "; drained" if self.action == "drain" else "; resumed"
        if self.drained_by_other:
            out += f"; drained by someone else ({self.drained_by_other}), left alone"
        if self.refusal:
            out += f"; not drained: {self.refusal}"
        return out


def ask_agent(socket_path: str, timeout: float, sleep=time.sleep) -> str:
    """The agent's /health text, tried again after short pauses while the
    run's time lasts; LocalAgentError (the last cause) when it never answers."""
    deadline = time.monotonic() + timeout
    query = HEALTH_QUERY + "?" + urllib.parse.urlencode([("name[]", n) for n in WANTED_NAMES])
    tries = 0
    while True:
        left = deadline - time.monotonic()
        try:
            return read_local(socket_path, query, max(left, 0.05)).decode("utf-8", "replace")
        except LocalAgentError as exc:
            last = exc
        pause = BACKOFF_S[min(tries, len(BACKOFF_S) - 1)]
        tries += 1
        if time.monotonic() + pause >= deadline:
            suffix = "" if tries == 1 else f" ({tries} tries)"
            raise LocalAgentError(f"{last}{suffix}", last.transient)
        sleep(pause)


def load_memory(path: str | None) -> Memory:
    if not path:
        return Memory()
    try:
        data = read_own(path, MAX_STATE_BYTES)
        return Memory() if data is None else Memory.from_json(json.loads(data))
    except (OSError, ValueError):
        return Memory()         # a refused or broken state starts afresh


def save_memory(path: str | None, memory: Memory) -> None:
    if path:
        write_whole(path, json.dumps(memory.to_json()).encode(), 0o600)


def evaluate(opts: Options, verdict: Verdict, now: float) -> None:
    memory = load_memory(opts.state_file)
    try:
        text = ask_agent(opts.socket, opts.timeout)
    except LocalAgentError as exc:
        memory.agent_failures += 1
        cause = f"agent not answering: {exc}"
        if memory.agent_failures >= opts.agent_down_after:
            if "agent_down" in opts.rules.conditions:
                verdict.findings = [Finding("agent_down", cause)]
        else:
            verdict.pending = (f"{cause} (run {memory.agent_failures} of "
                               f"{opts.agent_down_after} before agent_down)")
    else:
        memory.agent_failures = 0
        verdict.findings = findings(text, opts.rules, memory, now)
    try:
        save_memory(opts.state_file, memory)
    except OSError as exc:
        raise OSError(f"state file {opts.state_file}: {exc}") from None


def check(opts: Options) -> Verdict:
    now = time.time()
    verdict = Verdict(opts.node, [])
    evaluate(opts, verdict, now)
    if opts.slurm is None:
        return verdict
    nodes = opts.slurm.nodes()
    me = nodes.get(opts.node)
    if me is None:
        raise LookupError(f"slurmctld knows no node {opts.node}")
    if verdict.pending:
        # undecided: keep whatever holds, but say it, so common mode sees the crowd
        _declare(opts.slurm, me, {"agent_down"}, now, opts.breaker)
        return verdict
    _declare(opts.slurm, me, {f.condition for f in verdict.findings}, now, opts.breaker)
    if me.drained and not me.ours:
        verdict.drained_by_other = me.reason or "no reason"
        return verdict
    if not verdict.findings:
        if me.ours:
            opts.slurm.resume(opts.node)
            verdict.action = "resume"
        return verdict
    if not me.ours:
        _drain(opts, verdict, nodes, now)
    return verdict


def _drain(opts: Options, verdict: Verdict, nodes: dict, now: float) -> None:
    conditions = {f.condition for f in verdict.findings}
    verdict.common_mode = opts.breaker.common_mode(nodes, opts.node, conditions, now)
    drainable = [f for f in verdict.findings if f.condition not in verdict.common_mode]
    if not drainable:
        verdict.refusal = "; ".join(dict.fromkeys(verdict.common_mode.values()))
        return
    try:
        with DrainLock(opts.slurm, opts.node, opts.lock_wait_s) as lock:
            nodes = opts.slurm.nodes()         # the fresh read the limits are judged on
            me = nodes.get(opts.node)
            if me is None or me.drained:       # drained meanwhile, by us or anyone
                return
            refusal = opts.breaker.refusal(nodes, opts.node, time.time())
            if refusal:
                verdict.refusal = refusal
                return
            if not lock.fresh():
                verdict.refusal = "breaker: the drain lock's lease ran short; not drained"
                return
            verdict.reason = drain_reason([f.phrase for f in drainable])
            opts.slurm.drain(opts.node, verdict.reason)
            verdict.action = "drain"
            d = parse_comment(me.comment)
            if d.ours:
                opts.slurm.set_comment(opts.node, Declaration(
                    d.unfit, d.seen, time.time(), True).text())
    except LockBusy as exc:
        verdict.refusal = str(exc)


def _declare(slurm: Slurm, me, conditions: set, now: float, breaker: Breaker) -> None:
    """The node's comment says what it found (breaker.py): written when it
    changes, or to keep `seen` fresh; an admin's comment is left alone."""
    d = parse_comment(me.comment)
    if not d.ours:
        return
    unfit = {c: d.unfit.get(c, now) for c in sorted(conditions)}
    drained = d.drained if now - d.drained < breaker.rate_window_s else 0.0
    stale = unfit and now - d.seen > breaker.window_s / 3
    if set(unfit) == set(d.unfit) and drained == d.drained and not stale:
        return
    slurm.set_comment(me.name, Declaration(unfit, now if unfit else 0.0, drained, True).text())


__all__ = ["FIT", "UNFIT", "ERROR", "REFUSED", "Options", "Verdict", "check", "FileRefused"]
