"""The fault journal: one JSON-lines file per run, each line fsync'd before
the step it describes happens, so a run killed at any point leaves a record
of exactly what to undo.

Lines: run-start, fault (intent, with the state rollback needs: written
BEFORE apply), applied (facts learned while applying), rolled-back,
rollback-failed, run-end. A live run holds an exclusive flock on its file;
recovery only touches files nobody holds, i.e. runs that died.
"""
from __future__ import annotations

import errno
import fcntl
import glob
import json
import os
import socket
import time
import uuid
from dataclasses import dataclass, field

DEFAULT_DIR = "/var/lib/tracehound/chaos"


def new_run_id() -> str:
    return time.strftime("%Y%m%dT%H%M%S") + "-" + uuid.uuid4().hex[:8]


def _fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class Journal:
    def __init__(self, directory: str, run_id: str, title: str, source: str):
        os.makedirs(directory, mode=0o700, exist_ok=True)
        self.path = os.path.join(directory, f"{run_id}.jsonl")
        self._fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        _fsync_dir(directory)
        self.write({"event": "run-start", "run": run_id, "pid": os.getpid(),
                    "host": socket.gethostname(), "title": title, "source": source})

    @classmethod
    def adopt(cls, path: str, fd: int) -> "Journal":
        """Append to a dead run's file (recovery), under the lock it holds."""
        self = cls.__new__(cls)
        self.path, self._fd = path, fd
        return self

    def write(self, record: dict) -> None:
        record = {"time": time.time(), **record}
        line = (json.dumps(record, sort_keys=True, default=str) + "\n").encode()
        os.write(self._fd, line)
        os.fsync(self._fd)

    def fault(self, fault_id: str, action: str, fault: str, args: dict, state: dict,
              targets: list[str]) -> None:
        self.write({"event": "fault", "id": fault_id, "action": action, "fault": fault,
                    "arguments": args, "state": state, "targets": targets})

    def applied(self, fault_id: str, extra: dict | None) -> None:
        self.write({"event": "applied", "id": fault_id, "extra": extra or {}})

    def rolled_back(self, fault_id: str, note: str | None) -> None:
        self.write({"event": "rolled-back", "id": fault_id, "note": note})

    def rollback_failed(self, fault_id: str, error: str) -> None:
        self.write({"event": "rollback-failed", "id": fault_id, "error": error})

    def declare_rollbacks(self, actions: list[dict]) -> None:
        """The experiment's own rollbacks, before its method starts: a run
        killed later still says what must be undone besides its faults."""
        self.write({"event": "rollbacks-declared", "actions": actions})

    def rollbacks_run(self, by: str, failed: list[int] = ()) -> None:
        """`failed`: indexes of declared rollbacks that raised; they stay
        pending, so the next recover tries them again."""
        self.write({"event": "rollbacks-run", "by": by, "failed": list(failed)})

    def close(self, status: str | None = None) -> None:
        if self._fd is None:
            return
        if status is not None:
            self.write({"event": "run-end", "status": status})
        fcntl.flock(self._fd, fcntl.LOCK_UN)
        os.close(self._fd)
        self._fd = None


@dataclass
class PendingFault:
    id: str
    action: str
    fault: str
    state: dict
    targets: list[str]


@dataclass
class DeadRun:
    path: str
    fd: int
    run_id: str
    title: str
    pid: int | None
    faults: list[PendingFault] = field(default_factory=list)
    rollbacks: list[dict] = field(default_factory=list)


def read_records(path: str) -> list[dict]:
    """The journal's records; a torn last line (killed mid-write) is skipped."""
    out = []
    with open(path, "rb") as f:
        for raw in f:
            try:
                out.append(json.loads(raw))
            except ValueError:
                continue
    return out


def pending_faults(records: list[dict]) -> list[PendingFault]:
    """Faults journaled but not rolled back, in the order they were applied."""
    faults: dict[str, PendingFault] = {}
    for r in records:
        event, fid = r.get("event"), r.get("id")
        if event == "fault":
            faults[fid] = PendingFault(fid, r.get("action", ""), r["fault"], dict(r["state"]),
                                       r.get("targets", []))
        elif event == "applied" and fid in faults:
            faults[fid].state.update(r.get("extra") or {})
        elif event == "rolled-back":
            faults.pop(fid, None)
    return list(faults.values())


def pending_rollbacks(records: list[dict]) -> list[dict]:
    """The experiment's declared rollbacks if the run never got to run them."""
    actions: list[dict] = []
    for r in records:
        if r.get("event") == "rollbacks-declared":
            actions = list(r.get("actions") or [])
        elif r.get("event") == "rollbacks-run":
            failed = set(r.get("failed") or ())
            actions = [a for i, a in enumerate(actions) if i in failed]
    return actions


def dead_runs(directory: str) -> list[DeadRun]:
    """Runs whose process is gone and that left faults applied or their
    declared rollbacks not run. Each comes with its file locked; release it
    with release()."""
    out = []
    # glob() reads an unreadable directory as an empty one: that would be a
    # quiet "nothing to recover" while faults stay applied
    try:
        os.stat(directory)      # PermissionError where a parent cannot be searched
    except FileNotFoundError:
        return out
    if not os.access(directory, os.R_OK | os.X_OK):
        raise PermissionError(errno.EACCES, "cannot read the journal directory", directory)
    for path in sorted(glob.glob(os.path.join(directory, "*.jsonl"))):
        try:
            fd = os.open(path, os.O_WRONLY | os.O_APPEND)
        except FileNotFoundError:
            continue            # its run just ended and removed it
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)        # a live run owns it
            continue
        records = read_records(path)
        faults = pending_faults(records)
        rollbacks = pending_rollbacks(records)
        if not faults and not rollbacks:
            fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)
            continue
        start = next((r for r in records if r.get("event") == "run-start"), {})
        out.append(DeadRun(path, fd, start.get("run", os.path.basename(path)),
                           start.get("title", ""), start.get("pid"), faults, rollbacks))
    return out


def release(run: DeadRun) -> None:
    try:
        fcntl.flock(run.fd, fcntl.LOCK_UN)
    finally:
        os.close(run.fd)
