"""The fleet journal: which node got what, written before it is launched.

One JSON-lines file per fleet run, `<journal>/fleet/<run>.jsonl`, made as
the local journal is (a new 0600 file, never through a link, fsync'd after
every record, locked while its launcher lives). A node's own run journals
into `<journal>/fleet/<run>/<node>/` on that node, a path `recover --slurm`
derives from the run and node names again: nothing read back from the file
names a path to act on.

    fleet-start  run, pid, host, title, source, plan
    launch       node, job_id          (before srun starts)
    step         node, step            (its step's id, once squeue lists it)
    node-end     node, rc, status      (after srun returned)
    recovered    node, ok, detail
    run-end      status                (the launcher finished)
"""
from __future__ import annotations

import fcntl
import os
import re
import socket

from .. import journal as local
from .. import trust

FLEET = "fleet"
_NODE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
_RUN = re.compile(r"^[0-9]{8}T[0-9]{6}-[0-9a-f]{8}$")
_JOB = re.compile(r"^[0-9]{1,12}$")
# a node's run that ended by itself: its own journal is closed and clean
CLEAN = ("completed", "deviated", "failed", "aborted", "interrupted")


def directory(base: str) -> str:
    return os.path.join(base, FLEET)


def node_journal(base: str, run_id: str, node: str) -> str:
    """Where a node's own run keeps its journal (on that node)."""
    if not _RUN.match(run_id) or not _NODE.match(node):
        raise local.BadJournal(f"not a fleet run and node name: {run_id!r} {node!r}")
    return os.path.join(directory(base), run_id, node)


def check_node(name: str) -> str:
    if not _NODE.match(name):
        raise ValueError(f"{name!r} is not a node name")
    return name


class FleetJournal(local.Journal):
    """The local journal's file handling (write, adopt, close) with the
    fleet's records."""

    def __init__(self, base: str, run_id: str):
        # not the local journal's __init__: that one writes a local run's start
        self.base, self.run_id = base, run_id
        d = directory(base)
        os.makedirs(d, mode=0o700, exist_ok=True)
        local.check_directory(d)
        self.path = os.path.join(d, f"{run_id}.jsonl")
        self._fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND
                           | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)

    def start(self, title: str, source: str, plan: dict) -> None:
        self.write({"event": "fleet-start", "run": self.run_id, "pid": os.getpid(),
                    "host": socket.gethostname(), "title": title, "source": source,
                    "plan": plan})

    def launch(self, node: str, job_id: str | None) -> None:
        self.write({"event": "launch", "node": node, "job_id": job_id})

    def step(self, node: str, step_id: str) -> None:
        self.write({"event": "step", "node": node, "step": step_id})

    def node_end(self, node: str, rc: int | None, status: str) -> None:
        self.write({"event": "node-end", "node": node, "rc": rc, "status": status})

    def recovered(self, node: str, ok: bool, detail: str) -> None:
        self.write({"event": "recovered", "node": node, "ok": ok, "detail": detail})


class DeadFleetRun:
    """A fleet run whose launcher is gone, locked by the recovery: the nodes
    it launched on whose runs did not end clean and are not recovered yet."""

    def __init__(self, run_id: str, fd: int, title: str, nodes: dict[str, str | None],
                 steps: dict[str, str] | None = None):
        self.run_id, self.fd, self.title = run_id, fd, title
        self.nodes = nodes          # node -> the job id it ran inside (None: its own)
        self.steps = steps or {}    # node -> its run's step id, where the launcher learnt it


def touched(records: list[dict]) -> dict[str, str | None]:
    """node -> job id, of every launch not followed by a clean end or a
    successful recovery (in file order: a recovery that failed leaves it)."""
    out: dict[str, str | None] = {}
    for rec in records:
        event, node = rec.get("event"), rec.get("node")
        if event not in ("launch", "node-end", "recovered") or not isinstance(node, str) \
                or not _NODE.match(node):
            continue
        if event == "launch":
            job = rec.get("job_id")
            out[node] = job if isinstance(job, str) and _JOB.match(job) else None
        elif event == "node-end" and rec.get("status") in CLEAN:
            out.pop(node, None)
        elif event == "recovered" and rec.get("ok") is True:
            out.pop(node, None)
    return out


_STEP = re.compile(r"^[0-9]{1,12}\.[0-9]{1,9}$")


def steps(records: list[dict]) -> dict[str, str]:
    """node -> the step id of its latest launch, where one was journalled."""
    out: dict[str, str] = {}
    for rec in records:
        node = rec.get("node")
        if not isinstance(node, str) or not _NODE.match(node):
            continue
        if rec.get("event") == "launch":
            out.pop(node, None)
        elif rec.get("event") == "step" and isinstance(rec.get("step"), str) \
                and _STEP.match(rec["step"]):
            out[node] = rec["step"]
    return out


def dead_runs(base: str, err) -> list[DeadFleetRun]:
    """Fleet runs to recover, each locked (a live launcher holds its own
    lock: its run is skipped). A file that is not a fleet journal is named
    and left alone."""
    d = directory(base)
    if not os.path.isdir(d):
        return []
    local.check_directory(d)
    out = []
    for name in sorted(os.listdir(d)):
        run_id, ext = os.path.splitext(name)
        if ext != ".jsonl" or not _RUN.match(run_id):
            continue
        path = os.path.join(d, name)
        try:
            fd, _ = trust.open_regular(path, os.O_RDWR)
        except (trust.UntrustedFile, OSError) as exc:
            err(f"tracehound: chaos recover: skipping {path}: {exc}")
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)        # its launcher is alive
            continue
        try:
            records = local.parse_records(local.read_open(fd, path))
        except local.BadJournal as exc:
            err(f"tracehound: chaos recover: skipping {path}: {exc}")
            os.close(fd)
            continue
        nodes = touched(records)
        ended = any(r.get("event") == "run-end" for r in records)
        if not nodes and ended:
            os.close(fd)
            continue
        title = next((r.get("title") for r in records if r.get("event") == "fleet-start"), "")
        out.append(DeadFleetRun(run_id, fd, str(title), nodes, steps(records)))
    return out
