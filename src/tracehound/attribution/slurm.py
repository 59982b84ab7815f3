"""SLURM jobs, steps and tasks from cgroup paths.

Layouts, as Slurm's cgroup plugins create them:

cgroup v2 (plugin cgroup/v2), below the scope slurmd asks systemd for::

    system.slice/slurmstepd.scope/job_<id>/step_<step>/user/task_<n>
                                                      /user/task_special
                                                      /slurm          (the slurmstepd)
    system.slice/slurmstepd.scope/system                (stepds not yet in a job)

With multiple slurmd per host (built with --enable-multiple-slurmd) the scope
is ``<nodename>_slurmstepd.scope``. The scope may sit below a container's
cgroup (slurmd in a container), so it is searched anywhere in the path.

cgroup v1 (plugin cgroup/v1), in each controller (freezer, cpuset, memory...)::

    slurm/uid_<uid>/job_<id>/step_<step>/task_<n>

``slurm_<nodename>`` replaces ``slurm`` with multiple slurmd.

``<step>`` is the step as Slurm prints it: a number, ``batch``, ``extern``,
``interactive``, or ``<n>+<component>`` for a heterogeneous step. The
``task`` label is the task number, or ``special`` for ``task_special`` (pids
Slurm adopted into the step without a task, e.g. through pam_slurm_adopt).

A job directory that is not ``job_<number>`` (a layout keyed by an opaque id)
is never decoded from its name: its job id comes from a JobIdSource asked
about the processes inside it (see slurm_jobs.py), or stays empty.
"""
from __future__ import annotations

import os
import re
from collections.abc import Sequence
from dataclasses import dataclass

from ..host.procs import walk_pids
from .slurm_jobs import JobIdSource
from .workload import SLURM, Workload

_V2_SCOPE = re.compile(r"^(?:.+_)?slurmstepd(?:_.+)?\.scope$")
_V1_ROOT = re.compile(r"^slurm(?:_.+)?$")
_UID_DIR = re.compile(r"^uid_\d+$")
_JOB_DIR = re.compile(r"^job_(\d+)$")
_STEP_DIR = re.compile(r"^step_([A-Za-z0-9+_]+)$")
_TASK_DIR = re.compile(r"^task_(\d+|special)$")


@dataclass(frozen=True)
class SlurmPath:
    """What the path alone says. `job_dir` is the cgroup path of the job's
    directory ("" above job level); `opaque` marks a job directory whose
    name is not a job id."""
    job_id: str = ""
    step: str = ""
    task: str = ""
    job_dir: str = ""
    opaque: bool = False

    def workload(self, job_id: str | None = None, step: str | None = None) -> Workload:
        return Workload(kind=SLURM, job_id=self.job_id if job_id is None else job_id,
                        step=self.step if step is None else step, task=self.task)


def _join(components: Sequence[str]) -> str:
    return "/" + "/".join(components)


def _below_root(components: Sequence[str]) -> tuple[int, bool] | None:
    """Index of the first component below the Slurm root, and whether the
    layout is v2; None if the path is not Slurm's."""
    for i, comp in enumerate(components):
        if _V2_SCOPE.match(comp):
            return i + 1, True
        if _V1_ROOT.match(comp):
            nxt = components[i + 1] if i + 1 < len(components) else ""
            if _UID_DIR.match(nxt):
                return i + 2, False
            if nxt == "system" or (not nxt and comp == "slurm"):
                return len(components), False
    return None


def parse(components: Sequence[str]) -> SlurmPath | None:
    found = _below_root(components)
    if found is None:
        return None
    start, is_v2 = found
    rest = components[start:]
    if not rest or (is_v2 and rest[0] == "system"):
        return SlurmPath()
    job = _JOB_DIR.match(rest[0])
    job_dir = _join(components[:start + 1])
    step = task = ""
    for comp in rest[1:]:
        m = _STEP_DIR.match(comp)
        if m and not step:
            step = m.group(1)
            continue
        m = _TASK_DIR.match(comp)
        if m:
            task = m.group(1)
    if job:
        return SlurmPath(job_id=job.group(1), step=step, task=task, job_dir=job_dir)
    return SlurmPath(step=step, task=task, job_dir=job_dir, opaque=True)


def resolve_opaque(parsed: SlurmPath, cgroup_path: str, cgroup_root: str,
                   source: JobIdSource, max_pids: int = 256) -> tuple[str, str] | None:
    """(job_id, step) for a path below an opaque job directory, from what
    `source` says about the processes inside it; None unless every answer
    agrees on the job.

    The queried cgroup's own subtree is asked first, so a step-level cgroup
    gets its own step; the whole job directory is asked when that subtree
    has no process the source knows (e.g. a job-level cgroup in v2, or a
    user-process leaf: only the slurmstepd in ``.../slurm`` may be known).
    The step is taken from the path when the path names it.
    """
    own_dir = os.path.join(cgroup_root, cgroup_path.lstrip("/"))
    job_dir = os.path.join(cgroup_root, parsed.job_dir.lstrip("/"))
    at_job_level = cgroup_path.rstrip("/") == parsed.job_dir
    answers = _ask(own_dir, source, max_pids)
    step_answers = answers
    if not answers and not at_job_level:
        answers = _ask(job_dir, source, max_pids)
        step_answers = []
    jobs = {job for job, _step in answers}
    if len(jobs) != 1:
        return None
    if parsed.step or at_job_level:
        return jobs.pop(), parsed.step
    steps = {step for _job, step in step_answers}
    return jobs.pop(), steps.pop() if len(steps) == 1 else ""


def _ask(cgroup_dir: str, source: JobIdSource, max_pids: int) -> list[tuple[str, str]]:
    answers = []
    for pid in walk_pids(cgroup_dir, max_pids):
        try:
            answer = source(pid)
        except Exception:  # noqa: BLE001 - a broken source must not take the scrape down
            answer = None
        if answer is not None:
            answers.append(answer)
    return answers
