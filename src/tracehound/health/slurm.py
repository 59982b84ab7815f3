"""Slurm's side of `tracehound health`: scontrol found without PATH, the
nodes as slurmctld sees them, drain and resume, node comments, and the
drain lock the fleet breaker (breaker.py) decides under.

slurmd runs a HealthCheckProgram with SLURMD_NODENAME alone in its
environment (no PATH, often no SLURM_CONF), so scontrol is looked up by
absolute path. A drain made here carries REASON_PREFIX; only such a drain
is ever resumed, and only such drains count against the breaker.

Only Slurm's operators (root, SlurmUser, admins) may update nodes, comments
and reservations, so what tracehound reads of them is theirs, never a
user's.
"""
from __future__ import annotations

import os
import random
import shutil
import subprocess
import time
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
    comment: str = ""               # where health declares what it found (breaker.py)

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
        comment = fields.get("Comment", "").strip()
        out[fields["NodeName"]] = Node(fields["NodeName"], state, flags, reason, parts, when,
                                       "" if comment == "(null)" else comment)
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

    def set_comment(self, node: str, text: str) -> None:
        if not self.dry_run:
            self._run("update", f"nodename={node}", f"comment={text}")

    def try_reserve(self, name: str, node: str, minutes: int) -> bool:
        """Create reservation `name` on `node` for `minutes`: True when made,
        False when one of that name exists (slurmctld refuses a second)."""
        try:
            self._run("create", "reservation", f"reservationname={name}", "users=root",
                      f"nodes={node}", "starttime=now", f"duration={minutes}",
                      "flags=ignore_jobs,overlap")
        except SlurmError as exc:
            if "Duplicate reservation name" in str(exc):
                return False
            raise
        return True

    def reservation_nodes(self, name: str) -> str | None:
        """The Nodes= of reservation `name`, None when there is none."""
        try:
            out = self._run("show", "reservation", name, "-o")
        except SlurmError:
            return None
        for word in out.split():
            if word.startswith("Nodes="):
                return word[len("Nodes="):]
        return None

    def unreserve(self, name: str) -> None:
        self._run("delete", f"reservation={name}")


LOCK_NAME = "tracehound-drain-lock"
# the reservation is the lease: slurmctld ends it by itself this many minutes
# on, so a node that died holding it blocks the others this long at most
LOCK_MINUTES = 1
# what a holder may spend of the lease before it gives up without draining:
# past it the lease could end under a slow holder and a second one begin
LOCK_USE_S = 25.0


class LockBusy(SlurmError):
    pass


class DrainLock:
    """The breaker's lock (breaker.py): a reservation of LOCK_NAME on the
    node that holds it, made and ended through slurmctld. `wait_s` bounds
    the wait for another holder (short jittered retries)."""

    def __init__(self, slurm: Slurm, node: str, wait_s: float = 10.0,
                 clock=time.monotonic, sleep=time.sleep):
        self.slurm, self.node, self.wait_s = slurm, node, wait_s
        self.clock, self.sleep = clock, sleep
        self.taken_at: float | None = None

    def __enter__(self) -> "DrainLock":
        if self.slurm.dry_run:
            self.taken_at = self.clock()
            return self
        deadline = self.clock() + self.wait_s
        pause = 0.05
        while not self.slurm.try_reserve(LOCK_NAME, self.node, LOCK_MINUTES):
            if self.clock() >= deadline:
                holder = self.slurm.reservation_nodes(LOCK_NAME) or "?"
                raise LockBusy(f"breaker busy: {holder} held the drain lock for "
                               f"{self.wait_s:g} s; not drained this run")
            self.sleep(pause * (0.5 + random.random()))
            pause = min(pause * 2, 1.0)
        self.taken_at = self.clock()
        return self

    def fresh(self) -> bool:
        """Whether the lease is still safely ours (see LOCK_USE_S)."""
        return self.taken_at is not None and self.clock() - self.taken_at < LOCK_USE_S

    def __exit__(self, *exc) -> None:
        if self.slurm.dry_run or self.taken_at is None:
            return
        # past its use the lease may have ended and gone to another node
        if self.fresh() or self.slurm.reservation_nodes(LOCK_NAME) == self.node:
            try:
                self.slurm.unreserve(LOCK_NAME)
            except SlurmError:
                pass        # it ends by itself within LOCK_MINUTES
        self.taken_at = None


def drain_reason(phrases: list[str]) -> str:
    """`tracehound: <phrase>; <phrase>`, printable, at most MAX_REASON long."""
    text = "; ".join(dict.fromkeys(phrases))
    text = "".join(c if c.isprintable() and c not in "\"'" else " " for c in text)
    reason = f"{REASON_PREFIX} {text}"
    return reason if len(reason) <= MAX_REASON else reason[:MAX_REASON - 3] + "..."
