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
   once per ``min_interval`` seconds, on a miss, within ``timeout`` seconds
   and ``MAX_ANSWER_BYTES``; a failed read is an empty table and a warning.
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

import logging
import os
import re
import selectors
import shutil
import signal
import subprocess
import time
from collections.abc import Sequence
from typing import Callable, Optional

log = logging.getLogger(__name__)

StepId = tuple[str, str]
JobIdSource = Callable[[int], Optional[StepId]]

# Slurm's reserved step numbers, as they appear in environments and sockets.
SPECIAL_STEPS = {"4294967290": "interactive", "4294967291": "batch", "4294967292": "extern"}

_STEPD_TITLE = re.compile(r"^slurmstepd: \[(\d+)\.([A-Za-z0-9+]+)\]")

MiB = 1024 * 1024
# A node running 10,000 tasks answers in about 0.5 MiB. The cap is kept low
# because the table costs far more than its text: 4 MiB of the shortest rows
# is about 350,000 pids and some 60 MB of dict.
MAX_ANSWER_BYTES = 4 * MiB
MAX_CMDLINE_BYTES = 4096      # the title is matched at its start only
MAX_ENVIRON_BYTES = 1 * MiB   # a job's environment is a few KiB
_STDERR_KEPT = 4096
_PID_MAX = 1 << 22            # PID_MAX_LIMIT on 64-bit Linux
_PID = re.compile(r"[0-9]{1,7}")
_JOB_ID = re.compile(r"[0-9]{1,10}")
_STEP = re.compile(r"[A-Za-z0-9+]{1,32}")
# What scontrol listpids says, exiting 1, on a node with no job running.
_NO_STEPS = "No job steps exist on this node."


def parse_listpids(text: str) -> dict[int, StepId]:
    """``scontrol listpids`` output (header ``PID JOBID STEPID LOCALID
    GLOBALID``) as pid -> (job_id, step). Rows with pid -1 (a task that has
    not started or has no pid), and rows whose pid, job id or step is not
    one Slurm could print, are skipped."""
    table: dict[int, StepId] = {}
    steps: dict[StepId, StepId] = {}    # one tuple per step, not one per pid
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
            pid, job, step = (fields[cols[name]] for name in ("PID", "JOBID", "STEPID"))
        except IndexError:
            continue
        # Patterns, not int() or isdigit(): those also take "+5", "1_0" or "²".
        if _PID.fullmatch(pid) and 0 < int(pid) <= _PID_MAX and _JOB_ID.fullmatch(job) \
                and int(job) < 2**32 and _STEP.fullmatch(step):
            table[int(pid)] = steps.setdefault((job, step), (job, step))
    return table


def _exited(pid: int) -> bool:
    """Whether the child has exited, leaving it unreaped."""
    try:
        return os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None
    except ChildProcessError:
        return True


def _answer(argv: Sequence[str], timeout: float,
            max_bytes: int) -> tuple[bytes, bytes, int | None, str | None]:
    """Runs argv: (stdout, start of stderr, exit status, None), or, when
    it was killed or could not run, (b"", b"", None, why)."""
    try:
        # Its own process group, so that a kill reaches whatever it started.
        proc = subprocess.Popen(list(argv), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, start_new_session=True)
    except (OSError, ValueError, subprocess.SubprocessError) as e:
        return b"", b"", None, f"cannot run: {getattr(e, 'strerror', None) or e}"
    deadline = time.monotonic() + timeout
    out, err = bytearray(), bytearray()
    reason = None
    try:
        with selectors.DefaultSelector() as sel:
            sel.register(proc.stdout, selectors.EVENT_READ, out)
            sel.register(proc.stderr, selectors.EVENT_READ, err)
            while reason is None:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    reason = f"no answer within {timeout:g} s; killed"
                    break
                exited = _exited(proc.pid)
                # Short waits: something the command left behind may hold the
                # pipe open, so its exit, not EOF, ends the answer. After EOF
                # the exit is usually microseconds away.
                wait = 0.05 if sel.get_map() else 0.002
                ready = sel.select(0 if exited else min(remaining, wait))
                if not ready and exited:
                    break           # all it wrote before exiting has been read
                for key, _ in ready:
                    buf = key.data
                    want = max_bytes + 1 - len(out) if buf is out else 65536
                    chunk = os.read(key.fd, min(65536, want))
                    if not chunk:
                        sel.unregister(key.fileobj)
                    elif buf is out or len(buf) < _STDERR_KEPT:
                        buf += chunk
                if len(out) > max_bytes:
                    size = f"{max_bytes / MiB:g} MiB" if max_bytes >= MiB else f"{max_bytes} bytes"
                    reason = f"printed more than {size}; killed"
    finally:
        # Nothing the command started may outlive its answer. The leader is
        # not reaped yet (at worst a zombie), so its group id is still ours.
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except OSError:
            pass
        proc.stdout.close()
        proc.stderr.close()
        try:
            proc.wait(1.0)
        except subprocess.TimeoutExpired:
            # Stuck in the kernel past SIGKILL; subprocess reaps it on a later Popen.
            reason = reason or "did not exit after SIGKILL"
    if reason:
        return b"", b"", None, reason
    return bytes(out), bytes(err), proc.returncode, None


class BoundedCommand:
    """``(argv, timeout) -> stdout``: a command's answer, read with a
    deadline and a size cap. Any failure is "" and one warning, which is not
    repeated while the same command keeps failing the same way.

    `empty_answers`: first lines of stderr that, with a non-zero exit, mean
    "nothing to list" rather than a failure.
    """

    def __init__(self, max_bytes: int = MAX_ANSWER_BYTES, empty_answers: Sequence[str] = ()):
        self.max_bytes = max_bytes
        self.empty_answers = frozenset(empty_answers)
        self._warned: dict[tuple[str, ...], str] = {}

    def __call__(self, argv: Sequence[str], timeout: float) -> str:
        key = tuple(argv)
        out, err, status, reason = _answer(argv, timeout, self.max_bytes)
        if status:
            # One line of someone else's text in our log: short and printable.
            first = err.decode("utf-8", "replace").strip().split("\n", 1)[0].strip()[:200]
            first = "".join(c if c.isprintable() else "?" for c in first)
            if status > 0 and first in self.empty_answers:
                out = b""
            elif status < 0:
                reason = f"killed by signal {-status}"
            else:
                reason = f"exited {status}: {first}" if first else f"exited {status}"
        if reason is None:
            if self._warned.pop(key, None) is not None:
                log.info("%s: answers again", " ".join(key))
            return out.decode("utf-8", "replace")
        message = f"{' '.join(key)}: {reason}"
        if self._warned.get(key) != message:
            self._warned[key] = message
            log.warning("%s", message)
        return ""


class ScontrolListPids:
    """JobIdSource backed by ``scontrol listpids``.

    With several slurmd on one host, scontrol talks to one of them unless
    told the node, so pass every local node name in `node_names`.
    """

    def __init__(self, scontrol: str = "scontrol", node_names: Sequence[str] = (),
                 min_interval: float = 10.0, timeout: float = 5.0,
                 run: Callable[[Sequence[str], float], str] | None = None,
                 clock: Callable[[], float] = time.monotonic):
        self.scontrol = scontrol
        self.node_names = tuple(node_names)
        self.min_interval = min_interval
        self.timeout = timeout
        self._run = run or BoundedCommand(empty_answers=(_NO_STEPS,))
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
                raw = f.read(MAX_CMDLINE_BYTES)
        except OSError:
            return None
        title = raw.replace(b"\0", b" ").decode("utf-8", "replace")
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
                raw = f.read(MAX_ENVIRON_BYTES + 1)
        except OSError:
            return None
        if len(raw) > MAX_ENVIRON_BYTES:
            return None     # a SLURM_ variable past the cap cannot be told from one absent
        env = {}
        for entry in raw.split(b"\0"):
            key, sep, value = entry.partition(b"=")
            if sep and key in (b"SLURM_JOB_ID", b"SLURM_STEP_ID"):
                env[key] = value.decode("ascii", "replace")
        job = env.get(b"SLURM_JOB_ID", "")
        step = env.get(b"SLURM_STEP_ID", "")
        if not _JOB_ID.fullmatch(job) or (step and not _STEP.fullmatch(step)):
            return None     # it would become a label value
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
