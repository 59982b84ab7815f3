"""Slurm's side of `tracehound health`: scontrol found without PATH, the
nodes as slurmctld sees them, drain and resume, and the fleet breaker.

slurmd runs a HealthCheckProgram with SLURMD_NODENAME alone in its
environment (no PATH, often no SLURM_CONF), so scontrol is looked up by
absolute path. A drain made here carries REASON_PREFIX; only such a drain
is ever resumed, and only such drains count against the breaker.
"""
from __future__ import annotations

import math
import os
import shutil
import subprocess
from dataclasses import dataclass, field

from ..errors import TracehoundError

REASON_PREFIX = "tracehound:"
SCONTROL_CANDIDATES = ("/usr/bin/scontrol", "/usr/local/bin/scontrol", "/opt/slurm/bin/scontrol",
                       "/usr/local/slurm/bin/scontrol", "/opt/slurm/current/bin/scontrol")
# Slurm keeps a reason in a fixed buffer of its messages; a long one is cut
MAX_REASON = 200
# the fields `scontrol show node -o` prints after Reason= (Reason may hold spaces)
_AFTER_REASON = {"Comment", "Extra", "ExtSensorsJoules", "ExtSensorsWatts", "ExtSensorsTemp",
                 "AllocTRES", "CfgTRES", "CapWatts", "CurrentWatts", "AveWatts",
                 "LastBusyTime", "ResumeAfterTime", "Features", "MCS_label"}


class SlurmError(TracehoundError):
    pass


@dataclass
class Node:
    name: str
    state: str                      # IDLE, ALLOCATED, DOWN... without flags
    flags: list = field(default_factory=list)     # DRAIN, NOT_RESPONDING...
    reason: str = ""
    partitions: list = field(default_factory=list)
    reason_time: str = ""           # the [user@time] Slurm appends to a reason

    @property
    def drained(self) -> bool:
        return "DRAIN" in self.flags or self.state in ("DRAINED", "DRAINING")

    @property
    def ours(self) -> bool:
        return self.drained and self.reason.startswith(REASON_PREFIX)


def find_scontrol(override: str | None = None) -> str:
    if override:
        return override
    for path in SCONTROL_CANDIDATES:
        if os.access(path, os.X_OK):
            return path
    found = shutil.which("scontrol")     # only where a PATH was given
    if found:
        return found
    raise SlurmError("scontrol not found in " + ", ".join(SCONTROL_CANDIDATES) +
                     " (give --scontrol PATH)")


def parse_nodes(text: str) -> dict[str, Node]:
    out = {}
    for line in text.splitlines():
        fields, key = {}, None
        for word in line.split(" "):
            k, eq, v = word.partition("=")
            starts = eq and k.isidentifier() and k[0].isupper()
            if starts and (key != "Reason" or k in _AFTER_REASON):
                key = k
                fields[key] = v
            elif key is not None and (word or key == "Reason"):
                fields[key] += " " + word
        if "NodeName" not in fields:
            continue
        state, *flags = (s.rstrip("*") for s in fields.get("State", "").split("+"))
        reason = fields.get("Reason", "").strip()
        when = ""
        if reason.endswith("]") and " [" in reason:
            reason, when = reason.rsplit(" [", 1)
            when = when[:-1]
        parts = [p for p in fields.get("Partitions", "").strip().split(",")
                 if p and p != "(null)"]
        out[fields["NodeName"]] = Node(fields["NodeName"], state, flags, reason, parts, when)
    return out


class Slurm:
    def __init__(self, scontrol: str, slurm_conf: str | None = None, timeout: float = 10.0,
                 dry_run: bool = False):
        self.scontrol = scontrol
        self.env = {"PATH": "/usr/bin:/bin"}
        conf = slurm_conf or os.environ.get("SLURM_CONF")
        if conf:
            self.env["SLURM_CONF"] = conf
        self.timeout = timeout
        self.dry_run = dry_run

    def _run(self, *argv: str) -> str:
        try:
            done = subprocess.run([self.scontrol, *argv], env=self.env, capture_output=True,
                                  text=True, timeout=self.timeout)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise SlurmError(f"scontrol {argv[0]}: {exc}") from None
        if done.returncode != 0:
            raise SlurmError(f"scontrol {' '.join(argv[:2])}: "
                             f"{(done.stderr or done.stdout).strip()[:300]}")
        return done.stdout

    def nodes(self) -> dict[str, Node]:
        return parse_nodes(self._run("show", "node", "-o"))

    def drain(self, node: str, reason: str) -> None:
        if not self.dry_run:
            self._run("update", f"nodename={node}", "state=drain", f"reason={reason}")

    def resume(self, node: str) -> None:
        if not self.dry_run:
            self._run("update", f"nodename={node}", "state=resume")


def drain_reason(phrases: list[str]) -> str:
    """`tracehound: <phrase>; <phrase>`, printable, at most MAX_REASON long."""
    text = "; ".join(dict.fromkeys(phrases))
    text = "".join(c if c.isprintable() and c not in "\"'" else " " for c in text)
    reason = f"{REASON_PREFIX} {text}"
    return reason if len(reason) <= MAX_REASON else reason[:MAX_REASON - 3] + "..."


@dataclass(frozen=True)
class Breaker:
    percent: float = 10.0
    minimum: int = 1

    def limit(self, members: int) -> int:
        return max(self.minimum, math.floor(members * self.percent / 100))

    def refusal(self, nodes: dict[str, Node], me: str) -> str | None:
        """Why draining `me` would break the limit, or None: per partition
        of `me`, the other nodes tracehound drained against the limit."""
        for part in nodes[me].partitions:
            members = [n for n in nodes.values() if part in n.partitions]
            ours = sorted(n.name for n in members if n.ours and n.name != me)
            limit = self.limit(len(members))
            if len(ours) >= limit:
                return (f"breaker: partition {part} has {len(ours)} of {len(members)} nodes "
                        f"drained by tracehound ({', '.join(ours[:5])}), limit {limit}")
        return None

    def overshoot(self, nodes: dict[str, Node], me: str) -> str | None:
        """After a drain: where nodes racing each other pushed a partition
        past the limit, the earliest drains (by reason time, then name)
        stay; a later one is given back. Every node ranks the same list."""
        for part in nodes[me].partitions:
            members = [n for n in nodes.values() if part in n.partitions]
            ours = sorted((n for n in members if n.ours), key=lambda n: (n.reason_time, n.name))
            limit = self.limit(len(members))
            if me in [n.name for n in ours[limit:]]:
                kept = ", ".join(n.name for n in ours[:limit])
                return (f"breaker: partition {part} has {len(ours)} of {len(members)} nodes "
                        f"drained by tracehound at once, limit {limit}: {kept} stay drained")
        return None
