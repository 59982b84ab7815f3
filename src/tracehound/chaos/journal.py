"""The fault journal: one JSON-lines file per run, each line fsync'd before
the step it describes happens, so a run killed at any point leaves a record
of exactly what to undo.

Lines: run-start, fault (intent, with the state rollback needs: written
BEFORE apply), applied (facts learned while applying), rolled-back,
rollback-failed, run-end. A live run holds an exclusive flock on its file;
recovery only touches files nobody holds, i.e. runs that died.

A journal tells root what to undo and which declared rollbacks (programs) to
run, so it is trusted only as far as trust.py allows: the directory must be
root's (or the user's) and writable by nobody else; a journal is opened only
as a regular file (never a symbolic link, FIFO or directory), read up to
MAX_JOURNAL_BYTES and parsed record by record. One that fails is moved into
quarantine/ and reported; it never stops the recovery of the others.
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

from . import trust

DEFAULT_DIR = "/var/lib/tracehound/chaos"
QUARANTINE = "quarantine"
# a fault record is a few hundred bytes, declared rollbacks at most an
# experiment (1 MiB): a journal past this was not written by a run
MAX_JOURNAL_BYTES = 8 << 20


class BadJournal(Exception):
    """A journal that cannot be trusted or understood; says why."""


def check_directory(directory: str) -> None:
    """Raise trust.UntrustedFile if others could plant or change journals."""
    trust.check_directories(directory, "journal directory")


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
        check_directory(directory)
        self.path = os.path.join(directory, f"{run_id}.jsonl")
        # a new file of our own: never an existing one, never through a link
        self._fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND
                           | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        _fsync_dir(directory)
        self.write({"event": "run-start", "run": run_id, "pid": os.getpid(),
                    "host": socket.gethostname(), "title": title, "source": source})

    @classmethod
    def adopt(cls, path: str, fd: int) -> "Journal":
        """Append to a dead run's file (recovery), under the lock it holds."""
        self = cls.__new__(cls)
        self.path, self._fd = path, fd
        # a line torn by the kill must not swallow the first record added now
        end = os.lseek(fd, 0, os.SEEK_END)
        if end and os.pread(fd, 1, end - 1) != b"\n":
            os.write(fd, b"\n")
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
    """The journal's records (see parse_records). Raises BadJournal."""
    try:
        fd, _ = trust.open_regular(path)
    except trust.UntrustedFile as exc:
        raise BadJournal(str(exc)) from None
    try:
        return parse_records(read_open(fd, path))
    finally:
        os.close(fd)


def read_open(fd: int, path: str) -> bytes:
    raw = trust.read_bounded(fd, MAX_JOURNAL_BYTES)
    if len(raw) > MAX_JOURNAL_BYTES:
        raise BadJournal(f"{path} is larger than {MAX_JOURNAL_BYTES} bytes")
    return raw


# fields recovery reads, with the types it needs, by event; fault records
# must have _REQUIRED, the rest may be absent or null
_FIELDS = {
    "run-start": {"run": str, "title": str, "pid": int},
    "fault": {"id": str, "action": str, "fault": str, "state": dict, "targets": list},
    "applied": {"id": str, "extra": dict},
    "rolled-back": {"id": str},
    "rollbacks-declared": {"actions": list},
    "rollbacks-run": {"failed": list},
}
_REQUIRED = {"fault": ("fault", "state")}


def parse_records(raw: bytes) -> list[dict]:
    """Records, one JSON object per line. A line that is not JSON is a write
    torn by a kill and skipped; a JSON value that is not a record, or a
    record whose fields recovery reads are of the wrong type, makes the whole
    journal bad (BadJournal): no run writes one."""
    out, torn = [], 0
    for number, line in enumerate(raw.split(b"\n"), 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except ValueError:
            torn += 1
            continue
        except RecursionError:      # nesting no run writes
            raise BadJournal(f"line {number} is nested too deep") from None
        if not isinstance(record, dict):
            raise BadJournal(f"line {number} is a JSON {type(record).__name__}, not a record")
        event = record.get("event")
        if not isinstance(event, (str, type(None))):
            raise BadJournal(f"line {number}: the event must be a string")
        for key in _REQUIRED.get(event, ()):
            if record.get(key) is None:
                raise BadJournal(f"line {number}: a {event} record needs '{key}'")
        for key, kind in _FIELDS.get(event, {}).items():
            value = record.get(key)
            if value is not None and (not isinstance(value, kind) or isinstance(value, bool)):
                raise BadJournal(f"line {number}: '{key}' of a {event} record must be "
                                 f"{kind.__name__}, not {type(value).__name__}")
        _check_nested(record, number)
        out.append(record)
    if torn and not out:
        raise BadJournal("no line is a journal record")
    return out


def _check_nested(record: dict, number: int) -> None:
    event = record.get("event")
    if event == "fault" and not all(isinstance(t, str) for t in record.get("targets") or []):
        raise BadJournal(f"line {number}: fault targets must be strings")
    if event == "rollbacks-declared" and not all(
            isinstance(a, dict) and isinstance(a.get("provider", {}), dict)
            for a in record.get("actions") or []):
        raise BadJournal(f"line {number}: declared rollbacks must be activities")
    if event == "rollbacks-run" and not all(isinstance(i, int) and not isinstance(i, bool)
                                            for i in record.get("failed") or []):
        raise BadJournal(f"line {number}: failed rollbacks must be indexes")


def pending_faults(records: list[dict]) -> list[PendingFault]:
    """Faults journaled but not rolled back, in the order they were applied."""
    faults: dict[str, PendingFault] = {}
    for r in records:
        event, fid = r.get("event"), r.get("id")
        if event == "fault":
            faults[fid] = PendingFault(fid, r.get("action") or "", r["fault"], dict(r["state"]),
                                       r.get("targets") or [])
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


@dataclass
class Quarantined:
    path: str                 # where the journal was
    reason: str
    moved_to: str | None      # None: it could not be moved aside


class _Alive(Exception):
    pass


def dead_runs(directory: str, quarantined: list[Quarantined] | None = None,
              alive: list[str] | None = None) -> list[DeadRun]:
    """Runs whose process is gone and that left faults applied or their
    declared rollbacks not run. Each comes with its file locked; release it
    with release(). A bad journal is moved into quarantine/ and added to
    `quarantined`; the others are read all the same. The journals a live run
    still holds are added to `alive`: not recovered, and not nothing."""
    out: list[DeadRun] = []
    # glob() reads an unreadable directory as an empty one: that would be a
    # quiet "nothing to recover" while faults stay applied
    try:
        os.stat(directory)      # PermissionError where a parent cannot be searched
    except FileNotFoundError:
        return out
    if not os.access(directory, os.R_OK | os.X_OK):
        raise PermissionError(errno.EACCES, "cannot read the journal directory", directory)
    check_directory(directory)
    for path in sorted(glob.glob(os.path.join(glob.escape(directory), "*.jsonl"))):
        try:
            run = _dead_run(path)
        except FileNotFoundError:
            continue            # its run just ended and removed it
        except _Alive:
            if alive is not None:
                alive.append(path)
            continue
        except BadJournal as exc:
            moved = quarantine(directory, path, str(exc))
            if quarantined is not None:
                quarantined.append(moved)
            continue
        if run is not None:
            out.append(run)
    return out


def _dead_run(path: str) -> DeadRun | None:
    try:
        fd, st = trust.open_regular(path, os.O_RDWR | os.O_APPEND)
    except trust.UntrustedFile as exc:
        raise BadJournal(str(exc)) from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)            # a live run owns it
        raise _Alive(path) from None
    try:
        trust.check_stat(st, path, "the journal")
        records = parse_records(read_open(fd, path))
    except (BadJournal, trust.UntrustedFile, OSError) as exc:
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)
        if isinstance(exc, OSError):
            raise
        raise BadJournal(str(exc)) from None
    faults = pending_faults(records)
    rollbacks = pending_rollbacks(records)
    if not faults and not rollbacks:
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)
        return None
    start = next((r for r in records if r.get("event") == "run-start"), {})
    return DeadRun(path, fd, start.get("run") or os.path.basename(path),
                   start.get("title") or "", start.get("pid"), faults, rollbacks)


def quarantine(directory: str, path: str, reason: str) -> Quarantined:
    """Move a bad journal (whatever it is: file, FIFO, link, directory) into
    quarantine/ under a name not taken yet, so it is kept for a human and no
    longer read."""
    qdir = os.path.join(directory, QUARANTINE)
    try:
        try:
            os.mkdir(qdir, 0o700)
        except FileExistsError:
            pass
        st = os.lstat(qdir)
        if not os.path.isdir(qdir) or os.path.islink(qdir) or st.st_uid != os.geteuid():
            raise OSError(errno.ENOTDIR, f"{qdir} is not a directory of this user's")
        base = os.path.basename(path)
        target, n = os.path.join(qdir, base), 0
        while os.path.lexists(target):
            n += 1
            target = os.path.join(qdir, f"{base}.{n}")
        os.rename(path, target)
    except OSError as exc:
        return Quarantined(path, f"{reason}; it could not be moved aside: "
                                 f"{exc.strerror or exc}", None)
    return Quarantined(path, reason, target)


def release(run: DeadRun) -> None:
    try:
        fcntl.flock(run.fd, fcntl.LOCK_UN)
    finally:
        os.close(run.fd)
