"""Which nodes a fleet run touches, decided before anything is launched.

A selection names nodes (--nodes), a share of a partition's idle nodes
(--count K or --percent X, drawn at random with a seed, so the same seed
and the same idle nodes give the same draw), or the nodes of a running job
(--job). The blast radius is the share of the partition the run touches; a
plan above --max-share is refused unless the user says --allow-blast-radius.
"""
from __future__ import annotations

import math
import random
from dataclasses import dataclass, field

from . import slurm


class PlanError(Exception):
    """A selection that cannot be made or must not run; says why."""


@dataclass
class Plan:
    how: str                    # "nodes", "count", "percent", "job"
    partition: str | None
    nodes: list[str]            # the targets, in launch order
    partition_size: int
    job_id: str | None = None
    seed: int | None = None
    # node -> why it was not taken (drained, down, allocated...)
    skipped: dict[str, str] = field(default_factory=dict)

    @property
    def share(self) -> float:
        return len(self.nodes) / self.partition_size if self.partition_size else 1.0

    def waves(self, max_parallel: int) -> list[list[str]]:
        return [self.nodes[i:i + max_parallel] for i in range(0, len(self.nodes), max_parallel)]

    def to_json(self) -> dict:
        return {"how": self.how, "partition": self.partition, "nodes": self.nodes,
                "partition_size": self.partition_size, "job_id": self.job_id,
                "seed": self.seed, "skipped": self.skipped, "share": round(self.share, 4)}


def how_many(idle: int, count: int | None, percent: float | None) -> int:
    """--count K, or --percent X of the idle nodes rounded down, at least one
    (as Chaos Mesh's fixed-percent mode does)."""
    if count is not None:
        return count
    return max(1, math.floor(idle * percent / 100 + 1e-9))


def draw(names: list[str], k: int, seed: int) -> list[str]:
    """k of names, the same k for the same seed and names in any order."""
    return sorted(random.Random(seed).sample(sorted(names), k))


def choose(partition: str | None = None, nodes: str | None = None, count: int | None = None,
           percent: float | None = None, job_id: str | None = None,
           seed: int | None = None, cluster=None) -> Plan:
    """The plan for one of the selections (the CLI makes sure exactly one is
    given). `cluster` is the Slurm client (a module with partition_nodes,
    default_partition, hostnames and job; Slurm's clients by default)."""
    cluster = cluster or slurm
    if job_id is not None:
        job = cluster.job(job_id)
        size = len(cluster.partition_nodes(job.partition))
        if nodes is None:
            return Plan("job", job.partition, job.nodes, size, job_id=job.id)
        # some of the job's nodes only (one rank's node, say)
        wanted = list(dict.fromkeys(cluster.hostnames(nodes)))
        outside = [n for n in wanted if n not in job.nodes]
        if outside:
            raise PlanError(f"job {job.id} does not run on {', '.join(outside)} "
                            f"(its nodes: {', '.join(job.nodes)})")
        return Plan("job", job.partition, wanted, size, job_id=job.id,
                    skipped={n: "not named by --nodes" for n in job.nodes if n not in wanted})
    partition = partition or cluster.default_partition()
    members = cluster.partition_nodes(partition)
    by_name = {n.name: n for n in members}
    if nodes is not None:
        wanted = cluster.hostnames(nodes)
        missing = [n for n in wanted if n not in by_name]
        if missing:
            raise PlanError(f"not in partition {partition}: {', '.join(missing)}")
        return Plan("nodes", partition, list(dict.fromkeys(wanted)), len(members))
    idle = [n.name for n in members if n.idle]
    skipped = {n.name: f"not idle ({n.state})" for n in members if not n.idle}
    if count is not None and count < 1:
        raise PlanError("--count must be at least 1")
    if percent is not None and not 0 < percent <= 100:
        raise PlanError("--percent must be above 0 and at most 100")
    if not idle:
        raise PlanError(f"partition {partition} has no idle node: "
                        + ", ".join(f"{n} {why}" for n, why in skipped.items()))
    k = how_many(len(idle), count, percent)
    if k > len(idle):
        raise PlanError(f"--count {k}: partition {partition} has {len(idle)} idle node(s) "
                        f"({', '.join(idle)})")
    if seed is None:
        seed = random.SystemRandom().randrange(1 << 31)
    chosen = draw(idle, k, seed)
    skipped.update({n: "not drawn" for n in idle if n not in chosen})
    return Plan("count" if count is not None else "percent", partition, chosen, len(members),
                seed=seed, skipped=skipped)


def check_blast_radius(plan: Plan, max_share: float, allowed: bool) -> None:
    """Refuse a plan touching more than max_share (0..1) of its partition."""
    if plan.share > max_share + 1e-9 and not allowed:
        raise PlanError(
            f"{len(plan.nodes)} of {plan.partition_size} nodes of partition {plan.partition} "
            f"({plan.share:.0%}) is above the blast-radius limit --max-share "
            f"{max_share * 100:g}%: narrow the selection, raise --max-share, or pass "
            "--allow-blast-radius")
