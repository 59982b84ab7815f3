"""The fleet breaker of `tracehound health`: how many nodes it may hold
drained, and when a shared reason is the fleet's fault and drains none.

slurmctld serialises updates but has no compare-and-swap on a node, so every
node deciding for itself from its own read races: twenty nodes failing at
once each see room for one more. The breaker therefore decides only under
a lock that slurmctld itself arbitrates (health/slurm.py, `DrainLock`): a
reservation of a fixed name, which slurmctld refuses to create twice. A node
that wants to drain takes it, reads the nodes afresh, decides, drains, and
gives it back; the limits below are checked on that fresh read, so however
many nodes fail at once no moment has more of them drained by tracehound
than the limits allow. Resuming needs no lock: it only lowers the counts.

Limits, each on the nodes drained by tracehound (reason `tracehound:`):
  share     per partition of the node: `percent` of its nodes, at least `minimum`
  cap       across the cluster: at most `cap` (0: none)
  rate      at most `rate` drains begun within `rate_window_s` (0: none): the
            drained nodes' reason times, and the drains nodes remember in
            their comment after resuming

Common mode: every run of an unfit node declares its conditions in its node
comment (`tracehound: unfit=cond@since,...`, only where the comment is
empty or already ours: an admin's comment is never touched). When more
nodes of a partition than its share limit began to fail for one condition
within `window_s`, that condition is the monitor's or the fleet's fault (an
agent rollout, a driver, a kernel log every node shares), not the nodes':
no node is drained for it, and each says so. Nodes drained before the crowd
formed stay drained: undoing them would flap.
"""
from __future__ import annotations

import math
import re
import time
from dataclasses import dataclass

COMMENT_PREFIX = "tracehound:"
_CONDITION = re.compile(r"[a-z_]{1,40}")
_NUMBER = re.compile(r"[0-9]{1,12}")


@dataclass(frozen=True)
class Declaration:
    """What a node's comment says of it (all empty when it is not ours)."""
    unfit: dict        # condition -> since (epoch seconds)
    seen: float = 0.0  # when the node last said so
    drained: float = 0.0   # when its last drain by tracehound began
    ours: bool = False  # the comment is tracehound's (or empty): it may be written

    def text(self) -> str:
        """The comment that says it ('' when there is nothing to say)."""
        parts = []
        if self.unfit:
            parts.append("unfit=" + ",".join(f"{c}@{int(t)}" for c, t in
                                             sorted(self.unfit.items())))
            parts.append(f"seen={int(self.seen)}")
        if self.drained:
            parts.append(f"drained={int(self.drained)}")
        return f"{COMMENT_PREFIX} {' '.join(parts)}" if parts else ""


def parse_comment(comment: str) -> Declaration:
    """A node's Comment as a Declaration; anything not of our exact grammar
    is an admin's (ours=False) and says nothing."""
    if comment in ("", "(null)"):
        return Declaration({}, ours=True)
    if not comment.startswith(COMMENT_PREFIX):
        return Declaration({})
    unfit, seen, drained = {}, 0.0, 0.0
    for word in comment[len(COMMENT_PREFIX):].split():
        key, _, value = word.partition("=")
        if key == "unfit":
            for item in value.split(","):
                cond, _, since = item.partition("@")
                if _CONDITION.fullmatch(cond) and _NUMBER.fullmatch(since):
                    unfit[cond] = float(since)
        elif key in ("seen", "drained") and _NUMBER.fullmatch(value):
            if key == "seen":
                seen = float(value)
            else:
                drained = float(value)
    return Declaration(unfit, seen, drained, ours=True)


def reason_epoch(when: str) -> float | None:
    """Slurm's reason time ('2026-12-02T10:09:29', local time) in epoch seconds."""
    try:
        return time.mktime(time.strptime(when.partition("@")[2] or when, "%Y-%m-%dT%H:%M:%S"))
    except ValueError:
        return None


@dataclass(frozen=True)
class Breaker:
    percent: float = 10.0
    minimum: int = 1
    cap: int = 0                    # drained by tracehound across the cluster; 0: none
    rate: int = 0                   # drains begun within rate_window_s; 0: none
    rate_window_s: float = 3600.0
    window_s: float = 300.0         # common mode: failures that began this close together

    def limit(self, members: int) -> int:
        return max(self.minimum, math.floor(members * self.percent / 100))

    def refusal(self, nodes: dict, me: str, now: float) -> str | None:
        """Why draining `me` now would break a limit, or None; `nodes` read
        under the drain lock."""
        ours = sorted(n.name for n in nodes.values() if n.ours and n.name != me)
        for part in nodes[me].partitions:
            members = [n for n in nodes.values() if part in n.partitions]
            held = [n.name for n in members if n.ours and n.name != me]
            limit = self.limit(len(members))
            if len(held) >= limit:
                return (f"breaker: partition {part} has {len(held)} of {len(members)} nodes "
                        f"drained by tracehound ({', '.join(held[:5])}), limit {limit}")
        if self.cap and len(ours) >= self.cap:
            return (f"breaker: {len(ours)} nodes drained by tracehound ({', '.join(ours[:5])}), "
                    f"cap {self.cap}")
        if self.rate:
            begun = [n.name for n in nodes.values() if n.name != me
                     and now - self._drain_began(n) < self.rate_window_s]
            if len(begun) >= self.rate:
                return (f"breaker: {len(begun)} drains begun within the last "
                        f"{self.rate_window_s:g} s ({', '.join(sorted(begun)[:5])}), "
                        f"rate limit {self.rate}")
        return None

    @staticmethod
    def _drain_began(node) -> float:
        began = parse_comment(node.comment).drained
        if node.ours:
            began = max(began, reason_epoch(node.reason_time) or 0.0)
        return began or -math.inf

    def common_mode(self, nodes: dict, me: str, conditions, now: float) -> dict[str, str]:
        """condition -> why it is common mode, for those of `conditions` that
        more nodes of a partition of `me` than its limit began to fail for
        within the window (`me` counted as declaring them now)."""
        out = {}
        for part in nodes[me].partitions:
            members = [n for n in nodes.values() if part in n.partitions]
            limit = self.limit(len(members))
            for cond in conditions:
                if cond in out:
                    continue
                crowd = [n.name for n in members if n.name == me or self._began(n, cond, now)]
                if len(crowd) > limit:
                    out[cond] = (f"common mode: {len(crowd)} of {len(members)} nodes of "
                                 f"partition {part} began to fail for {cond} within "
                                 f"{self.window_s:g} s (limit {limit}): the monitor's or the "
                                 "fleet's fault, not the nodes'; drained none for it")
        return out

    def _began(self, node, cond: str, now: float) -> bool:
        d = parse_comment(node.comment)
        since = d.unfit.get(cond)
        return since is not None and now - since < self.window_s and now - d.seen < self.window_s
