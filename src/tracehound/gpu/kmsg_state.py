"""The kernel-log watcher's saved position: `<seq> <boot id>` in one small file.

The agent runs as root and the file lives in a directory (--state-dir) that
an operator chose, so everything here assumes another user may have planted
something at the path:

  - the directory must be owned by the agent's user and writable by no one
    else (no group or other write bit, sticky or not): anyone who can write
    there can forge a position (hide lines, or replay the whole ring as
    news) or plant links. Such a directory is refused: no position is read
    or written, and the watcher runs as if it had none.
  - the file is opened without following a link, only as a regular file,
    and read up to MAX_BYTES: a link, a FIFO, a 300 MB file or a file of a
    million '[' is refused, never read whole or parsed recursively.
  - the format is two ASCII fields, checked by one anchored pattern; the
    JSON form older versions wrote is accepted by a pattern as strict.
  - a write goes to a new temp file created with O_CREAT|O_EXCL|O_NOFOLLOW,
    mode 0600, then renamed over the name: a planted link is never written
    through, and a rename replaces a link at the name itself.

Every operation is relative to a descriptor of the checked directory, so the
directory cannot be swapped between the check and the use.

Interface::

    position = StateFile("/var/lib/tracehound/kmsg-seq")
    position.refused()                 # None, or why the directory is refused
    position.load()                    # (seq, boot_id or None) | None; raises StateError
    position.save(seq, boot_id)        # raises StateError or OSError
"""
from __future__ import annotations

import os
import re
import secrets
import stat

# "<seq> <boot id>\n": a u64 and the kernel's boot id (a UUID), "-" when unknown
MAX_BYTES = 4096
_LINE = re.compile(rb"([0-9]{1,20}) ([0-9A-Za-z_-]{1,64})\n?", re.A)
# what older versions wrote with json.dump, and nothing looser
_LEGACY = re.compile(rb'\{"seq": ([0-9]{1,20}), '
                     rb'"boot_id": (?:"([0-9A-Za-z_-]{1,64})"|null)\}\n?', re.A)
_BOOT_ID = re.compile(r"[0-9A-Za-z_-]{1,64}", re.A)


class StateError(Exception):
    """The saved position cannot be used; the message says why."""


class StateFile:
    def __init__(self, path: str):
        self.path = path
        self.directory = os.path.dirname(path) or "."
        self.name = os.path.basename(path)

    def _open_directory(self, create: bool) -> int:
        """A descriptor of the checked directory; StateError if refused."""
        if create:
            os.makedirs(self.directory, mode=0o700, exist_ok=True)
        fd = os.open(self.directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            problem = _unsafe(os.fstat(fd))
        except BaseException:
            os.close(fd)
            raise
        if problem:
            os.close(fd)
            raise StateError(f"{self.directory} {problem}")
        return fd

    def refused(self) -> str | None:
        """Why the directory cannot hold the position, or None (also when it
        does not exist yet: it is created, mode 0700, at the first save)."""
        try:
            os.close(self._open_directory(create=False))
        except FileNotFoundError:
            return None
        except (StateError, OSError) as exc:
            return str(exc)
        return None

    def load(self) -> tuple[int, str | None] | None:
        """(seq, boot id) saved; None when there is no file. StateError when
        there is one that cannot be used."""
        try:
            dfd = self._open_directory(create=False)
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise StateError(str(exc)) from None
        try:
            return self._load(dfd)
        finally:
            os.close(dfd)

    def _load(self, dfd: int) -> tuple[int, str | None] | None:
        try:
            # O_NONBLOCK: a FIFO planted at the name must not hang the open
            fd = os.open(self.name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC,
                         dir_fd=dfd)
        except FileNotFoundError:
            return None
        except OSError as exc:      # ELOOP: a symbolic link
            raise StateError(f"cannot open {self.path}: {exc.strerror}") from None
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                raise StateError(f"{self.path} is not a regular file")
            if st.st_size > MAX_BYTES:
                raise StateError(f"{self.path} has {st.st_size} bytes, more than a position "
                                 f"({MAX_BYTES} at most)")
            data = os.read(fd, MAX_BYTES + 1)
        except OSError as exc:
            raise StateError(f"cannot read {self.path}: {exc.strerror}") from None
        finally:
            os.close(fd)
        return parse_position(data)

    def save(self, seq: int, boot_id: str | None) -> None:
        text = format_position(seq, boot_id)
        dfd = self._open_directory(create=True)
        try:
            tmp = f"{self.name}.{secrets.token_hex(8)}.tmp"
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                         0o600, dir_fd=dfd)
            try:
                try:
                    os.write(fd, text)
                finally:
                    os.close(fd)
                # no fsync: a power loss also empties the ring and changes the boot id
                os.replace(tmp, self.name, src_dir_fd=dfd, dst_dir_fd=dfd)
            except BaseException:
                try:
                    os.unlink(tmp, dir_fd=dfd)
                except OSError:
                    pass
                raise
        finally:
            os.close(dfd)


def _unsafe(st: os.stat_result) -> str | None:
    if st.st_uid != os.geteuid():
        return f"is owned by uid {st.st_uid}, not by the agent's uid {os.geteuid()}"
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return f"is writable by other users (mode {stat.S_IMODE(st.st_mode):04o})"
    return None


def format_position(seq: int, boot_id: str | None) -> bytes:
    boot = boot_id if boot_id and _BOOT_ID.fullmatch(boot_id) else "-"
    return f"{int(seq)} {boot}\n".encode()


def parse_position(data: bytes) -> tuple[int, str | None]:
    """The position in a file's bytes; StateError for anything else."""
    m = _LINE.fullmatch(data) or _LEGACY.fullmatch(data)
    if m is None:
        raise StateError(f"not a kernel log position: {data[:40]!r}")
    boot = m.group(2)
    boot_id = boot.decode() if boot and boot != b"-" else None
    return int(m.group(1)), boot_id
