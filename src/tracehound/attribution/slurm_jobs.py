"""pid -> (job id, step): asking slurmd's side of the node who a process is.

Used when a cgroup path names a job directory by an opaque id instead of
``job_<number>``. The job id is never derived from such a name; it comes
from a JobIdSource, a callable ``pid -> (job_id, step) | None``.

The default source (``default_job_id_source``) chains two sources, both of
which answer from state only Slurm's root-owned daemons can write:

1. ``scontrol listpids`` (when ``scontrol`` is on PATH). scontrol finds the
   step sockets slurmstepd creates in slurmd's spool directory
   (``<SlurmdSpoolDir>/<nodename>_<jobid>.<stepid>``) and asks every
   slurmstepd, over that socket, for the pids of its tasks and of its
   process-tracking container (the step's cgroup). This is the same
   membership Slurm itself uses to signal and account the step, so a
   process cannot claim to be in another job. The table is read at most
   once per ``min_interval`` seconds, on a miss.
2. The slurmstepd's own process title, when scontrol is missing (an agent
   container with the host's /proc but no Slurm client). slurmstepd sets
   its title to ``[<jobid>.<step>]`` (shown as ``slurmstepd: [42.batch]``)
   and lives inside the job's cgroup tree (``step_<n>/slurm`` in v2). Only
   a process whose real uid is 0 and whose executable is named
   ``slurmstepd`` is believed: a user can rename their own process, but not
   a root one.

``StepEnvironment`` (SLURM_JOB_ID in /proc/<pid>/environ) is provided but
never used by default: a process's environment is whatever its parent
exec'd it with, so any user can make a process claim any job.
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import time
from collections.abc import Sequence
from typing import Callable, Optional

StepId = tuple[str, str]
JobIdSource = Callable[[int], Optional[StepId]]

# Slurm's reserved step numbers, as they appear in environments and sockets.
SPECIAL_STEPS = {"4294967290": "interactive", "4294967291": "batch", "4294967292": "extern"}

_STEPD_TITLE = re.compile(r"^slurmstepd: \[(\d+)\.([A-Za-z0-9+]+)\]")


def parse_listpids(text: str) -> dict[int, StepId]:
    """``scontrol listpids`` output (header ``PID JOBID STEPID LOCALID
    GLOBALID``) as pid -> (job_id, step). Rows with pid -1 (a task that has
    not started or has no pid) are skipped."""
    table: dict[int, StepId] = {}
    cols: dict[str, int] | None = None
    for line in text.splitlines():
        fields = line.split()
        if not fields:
            continue
        if cols is None:
            if "PID" in fields and "JOBID" in fields and "STEPID" in fields:
                cols = {name: i for i, name in enumerate(fields)}
            continue
        try:
            pid = int(fields[cols["PID"]])
            job, step = fields[cols["JOBID"]], fields[cols["STEPID"]]
        except (IndexError, ValueError):
            continue
        if pid > 0 and job.isdigit():
            table[pid] = (job, step)
    return table


def _run_command(argv: Sequence[str], timeout: float) -> str:
    try:
        done = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout, check=False)
    except (OSError, subprocess.SubprocessError):
        return ""
    return done.stdout


class ScontrolListPids:
    """JobIdSource backed by ``scontrol listpids``.

    With several slurmd on one host, scontrol talks to one of them unless
    told the node, so pass every local node name in `node_names`.
    """

    def __init__(self, scontrol: str = "scontrol", node_names: Sequence[str] = (),
                 min_interval: float = 10.0, timeout: float = 5.0,
                 run: Callable[[Sequence[str], float], str] = _run_command,
                 clock: Callable[[], float] = time.monotonic):
        self.scontrol = scontrol
        self.node_names = tuple(node_names)
        self.min_interval = min_interval
        self.timeout = timeout
        self._run = run
        self._clock = clock
        self._table: dict[int, StepId] = {}
        self._read_at: float | None = None

    def refresh(self) -> None:
        self._read_at = self._clock()
        if not self.node_names:
            self._table = parse_listpids(self._run([self.scontrol, "listpids"], self.timeout))
            return
        table: dict[int, StepId] = {}
        for node in self.node_names:
            table.update(parse_listpids(self._run([self.scontrol, "listpids", "*", node], self.timeout)))
        self._table = table

    def __call__(self, pid: int) -> StepId | None:
        if pid not in self._table and (
                self._read_at is None or self._clock() - self._read_at >= self.min_interval):
            self.refresh()
        return self._table.get(pid)


def _real_uid(proc_dir: str) -> int | None:
    try:
        with open(os.path.join(proc_dir, "status")) as f:
            for line in f:
                if line.startswith("Uid:"):
                    return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return None


class StepdProcessTitle:
    """JobIdSource that recognises slurmstepd processes by their title.

    Answers only for a slurmstepd (real uid 0, executable named
    ``slurmstepd``); every other pid gets None, so it is meant to be asked
    about all the pids of a job's cgroup tree, which holds the stepd.
    """

    def __init__(self, proc_root: str = "/proc"):
        self.proc_root = proc_root

    def __call__(self, pid: int) -> StepId | None:
        proc_dir = os.path.join(self.proc_root, str(pid))
        if _real_uid(proc_dir) != 0:
            return None
        try:
            exe = os.readlink(os.path.join(proc_dir, "exe"))
        except OSError:
            return None
        # A binary replaced by a package upgrade reads "<path> (deleted)".
        exe = exe.removesuffix(" (deleted)")
        if os.path.basename(exe) != "slurmstepd":
            return None
        try:
            with open(os.path.join(proc_dir, "cmdline"), "rb") as f:
                title = f.read().replace(b"\0", b" ").decode("utf-8", "replace")
        except OSError:
            return None
        m = _STEPD_TITLE.match(title)
        return (m.group(1), m.group(2)) if m else None


class StepEnvironment:
    """JobIdSource reading SLURM_JOB_ID / SLURM_STEP_ID from a process's
    environment. Not trustworthy (users control their environment); only for
    sites that accept that, never part of the default."""

    def __init__(self, proc_root: str = "/proc"):
        self.proc_root = proc_root

    def __call__(self, pid: int) -> StepId | None:
        try:
            with open(os.path.join(self.proc_root, str(pid), "environ"), "rb") as f:
                raw = f.read()
        except OSError:
            return None
        env = {}
        for entry in raw.split(b"\0"):
            key, sep, value = entry.partition(b"=")
            if sep and key in (b"SLURM_JOB_ID", b"SLURM_STEP_ID"):
                env[key] = value.decode("ascii", "replace")
        job = env.get(b"SLURM_JOB_ID", "")
        if not job.isdigit():
            return None
        step = env.get(b"SLURM_STEP_ID", "")
        return job, SPECIAL_STEPS.get(step, step)


def first_of(*sources: JobIdSource) -> JobIdSource:
    """A source that returns the first answer of `sources`, in order."""
    def ask(pid: int) -> StepId | None:
        for source in sources:
            answer = source(pid)
            if answer is not None:
                return answer
        return None
    return ask


def default_job_id_source(proc_root: str = "/proc", scontrol: str | None = None,
                          node_names: Sequence[str] = ()) -> JobIdSource:
    """scontrol listpids when scontrol is installed, then slurmstepd titles."""
    sources: list = []
    exe = scontrol or shutil.which("scontrol")
    if exe:
        sources.append(ScontrolListPids(exe, node_names))
    sources.append(StepdProcessTitle(proc_root))
    return first_of(*sources)
