"""Several agents on one host, each a named instance (`tracehound run --instance`).

An instance owns, alone: a lock (RUN_DIR/<name>.lock, flock'd for the
agent's whole life, so the kernel releases it however the agent dies and a
crash never leaves a stale lock), its pinned maps (PIN_ROOT/<name>/) and its
state directory (locked too: <state>/agent.lock). The default instance keeps
the state directory agents used before instances existed, so an upgraded
node keeps its kernel log position.
"""
from __future__ import annotations

import argparse
import fcntl
import logging
import os
import re
import stat

from . import defaults
from .errors import SetupError

log = logging.getLogger(__name__)

_NAME = re.compile(r"[A-Za-z0-9_.-]{1,64}")
NAME_RULE = "1 to 64 of A-Z a-z 0-9 _ . -, not . or .."
STATE_LOCK = "agent.lock"
# /proc/locks has a line per lock on the host, and any user can take
# locks: it is read this far and no further
MAX_LOCK_LINES = 100_000


def check_name(name: str) -> str:
    """`name` if it can name an instance (it becomes a file and a directory
    name of its own), else ValueError."""
    if not isinstance(name, str) or not _NAME.fullmatch(name) or name in (".", ".."):
        raise ValueError(f"{name!r} is not an instance name: {NAME_RULE}")
    return name


def instance_name(value: str) -> str:
    """check_name for an argparse flag, which then names the flag in its error."""
    try:
        return check_name(value)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def pin_dir(name: str) -> str:
    """Where instance `name` pins its maps."""
    return os.path.join(defaults.PIN_ROOT, check_name(name))


def state_dir(name: str, given: str | None = None) -> str:
    """Where instance `name` keeps what outlives a restart: --state-dir as
    given; without it STATE_DIR itself for the default instance (the path
    agents used before instances), a directory of its own under
    STATE_DIR/instances for any other (never a name the default instance or
    the chaos journal uses in STATE_DIR)."""
    check_name(name)
    if given:
        return given
    if name == defaults.INSTANCE:
        return defaults.STATE_DIR
    return os.path.join(defaults.STATE_DIR, "instances", name)


def lock_path(name: str, run_dir: str = defaults.RUN_DIR) -> str:
    return os.path.join(run_dir, f"{check_name(name)}.lock")


class InstanceBusy(SetupError):
    """Another running agent holds this instance, or its state directory."""


class _Held(Exception):
    def __init__(self, pid: int | None):
        self.pid = pid


class _ExclusiveFile:
    """An flock on `directory`/`filename`, both of which must belong to
    `owner` (root; tests pass their own) and be writable by it alone."""

    def __init__(self, directory: str, filename: str, owner: int, dir_mode: int):
        self.directory = directory
        self.path = os.path.join(directory, filename)
        self.owner = owner
        self.dir_mode = dir_mode
        self.fd = -1

    def make_dir(self) -> None:
        try:
            os.makedirs(self.directory, self.dir_mode, exist_ok=True)
        except OSError as exc:
            raise SetupError(f"cannot create {self.directory}: {exc.strerror}") from None

    def acquire(self) -> None:
        """Raises _Held when another process holds it."""
        dir_fd = self._open_dir()
        try:
            fd = self._open_file(dir_fd)
        finally:
            os.close(dir_fd)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            pid = holder_pid(os.fstat(fd))
            os.close(fd)
            raise _Held(pid) from None
        except OSError as exc:
            os.close(fd)
            raise SetupError(f"cannot lock {self.path}: {exc.strerror}") from None
        self.fd = fd

    def release(self) -> None:
        # closing the only descriptor drops the flock; the file stays, since
        # unlinking a lock file lets two agents lock two different files
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def _open_dir(self) -> int:
        # anyone else who could write there could swap the lock file
        return open_owned_dir(self.directory, self.owner)

    def _open_file(self, dir_fd: int) -> int:
        flags = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC
        try:
            fd = os.open(os.path.basename(self.path), flags, 0o600, dir_fd=dir_fd)
        except OSError as exc:
            raise SetupError(f"cannot open the lock {self.path} ({exc.strerror}): it must be a "
                             "regular file; remove it, the agent creates it") from None
        st = os.fstat(fd)
        # readable by another user, the file could be flock'd by that user
        # and keep every agent from starting
        if (not stat.S_ISREG(st.st_mode) or st.st_uid != self.owner
                or st.st_mode & 0o077 or st.st_nlink != 1):
            os.close(fd)
            raise SetupError(f"the lock {self.path} must be a regular file of uid {self.owner}, "
                             "mode 0600, with one link: remove it, the agent creates it")
        return fd


class InstanceLock:
    """The exclusive hold of one instance (RUN_DIR/<name>.lock) and, with
    `state`, of its state directory (<state>/agent.lock): two agents given
    one --state-dir would overwrite each other's kernel log position."""

    def __init__(self, name: str, run_dir: str = defaults.RUN_DIR, owner: int = 0,
                 state: str | None = None):
        self.name = check_name(name)
        self.instance = _ExclusiveFile(run_dir, f"{name}.lock", owner, 0o755)
        self.path = self.instance.path
        self.state = _ExclusiveFile(state, STATE_LOCK, owner, 0o700) if state else None

    def acquire(self) -> "InstanceLock":
        self.instance.make_dir()
        try:
            self.instance.acquire()
        except _Held as held:
            raise InstanceBusy(busy_message(self.name, held.pid, self.path)) from None
        try:
            self._acquire_state()
        except BaseException:
            self.release()
            raise
        return self

    def _acquire_state(self) -> None:
        if self.state is None:
            return
        try:
            self.state.make_dir()
        except SetupError as exc:
            # nothing can be kept there, so nothing can be shared
            log.warning("%s: the kernel log position will not outlive a restart", exc)
            return
        try:
            self.state.acquire()
        except _Held as held:
            who = f"pid {held.pid}" if held.pid else "its pid is not visible from here"
            raise InstanceBusy(f"state directory {self.state.directory} is in use by another "
                               f"agent ({who}; lock {self.state.path}); give each instance its "
                               "own --state-dir, or leave it out: each instance then has its "
                               "own") from None

    def release(self) -> None:
        if self.state is not None:
            self.state.release()
        self.instance.release()

    def __enter__(self) -> "InstanceLock":
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()


def open_owned_dir(path: str, owner: int = 0) -> int:
    """A descriptor of directory `path`, itself no symbolic link, belonging
    to `owner` and writable by it alone; SetupError naming it otherwise."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as exc:
        raise SetupError(f"{path} must be a directory, not a symbolic link or a "
                         f"file ({exc.strerror})") from None
    st = os.fstat(fd)
    if st.st_uid != owner or st.st_mode & 0o022:
        os.close(fd)
        raise SetupError(f"{path} must belong to uid {owner} and be writable "
                         f"by it alone (uid {st.st_uid}, mode {stat.S_IMODE(st.st_mode):04o})")
    return fd


def busy_message(name: str, pid: int | None, path: str) -> str:
    who = f"pid {pid}" if pid else "its pid is not visible from here"
    return (f"instance {name!r} is already running ({who}; lock {path}); "
            "to run another agent on this host, give it a name of its own with "
            "--instance NAME (and its own --listen)")


def holder_pid(st: os.stat_result, locks: str = "/proc/locks") -> int | None:
    """The pid of the process holding an exclusive flock on the file `st`
    describes, as the kernel lists it, or None if none is visible."""
    want = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"
    try:
        with open(locks, encoding="ascii", errors="replace") as f:
            for n, line in enumerate(f):
                if n >= MAX_LOCK_LINES:
                    break
                # "1: FLOCK  ADVISORY  WRITE 1234 08:01:5678 0 EOF"; waiters are "1: -> FLOCK ..."
                fields = line.split()
                if (len(fields) >= 6 and fields[1] == "FLOCK" and fields[3] == "WRITE"
                        and fields[5] == want and fields[4].isascii() and fields[4].isdigit()):
                    return int(fields[4]) or None
    except OSError:
        pass
    return None


def holder(name: str, run_dir: str = defaults.RUN_DIR) -> tuple[str, int | None]:
    """(the lock's path, the pid of the agent holding instance `name`, or
    None): for `doctor`, which must never take the lock itself, even for a
    moment, or an agent starting then would be refused. OSError when the
    lock cannot be looked at (run_dir is root's alone)."""
    path = lock_path(name, run_dir)
    try:
        st = os.stat(path, follow_symlinks=False)
    except FileNotFoundError:
        return path, None
    return path, holder_pid(st) if stat.S_ISREG(st.st_mode) else None
