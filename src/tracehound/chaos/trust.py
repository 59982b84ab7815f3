"""Which files a chaos run may take orders from.

An experiment tells a root process what to break and which programs to run;
a journal tells `chaos recover` what to undo (and which declared rollbacks to
run). Either is only as trustworthy as the least trusted user who could have
written it, so, as sshd does with authorized_keys: the file and every
directory above it must belong to root or to the user running tracehound, and
none may be writable by group or others (a directory with the sticky bit, like
/tmp, is fine: others cannot replace what is in it). Files are opened without
following a final symbolic link and without blocking (a FIFO never answers),
then checked on the open descriptor, so what is checked is what is read.
"""
from __future__ import annotations

import errno
import os
import stat


class UntrustedFile(Exception):
    """A file or directory that is not safe to take orders from; says why."""


def trusted_owners() -> set[int]:
    """root, the effective user, and (for root under sudo) the user who ran
    sudo: their own experiment in their home directory is theirs to run."""
    owners = {0, os.geteuid(), os.getuid()}
    sudo_uid = os.environ.get("SUDO_UID", "")
    if os.geteuid() == 0 and sudo_uid.isascii() and sudo_uid.isdigit():
        owners.add(int(sudo_uid))
    return owners


def _describe_owner(uid: int) -> str:
    try:
        import pwd
        return f"{pwd.getpwuid(uid).pw_name} (uid {uid})"
    except (KeyError, ImportError):
        return f"uid {uid}"


def check_stat(st: os.stat_result, path: str, what: str, directory: bool = False) -> None:
    """Raise UntrustedFile unless st belongs to a trusted owner and cannot be
    changed by group or others (sticky directories excepted)."""
    if st.st_uid not in trusted_owners():
        raise UntrustedFile(f"{what} {path} belongs to {_describe_owner(st.st_uid)}, not to "
                            "root or the user running tracehound")
    writable = st.st_mode & (stat.S_IWGRP | stat.S_IWOTH)
    if writable and not (directory and st.st_mode & stat.S_ISVTX):
        who = " and ".join(w for w, bit in (("group", stat.S_IWGRP), ("others", stat.S_IWOTH))
                           if writable & bit)
        raise UntrustedFile(f"{what} {path} is writable by {who} "
                            f"(mode {stat.S_IMODE(st.st_mode):04o}): "
                            f"chmod go-w {path}")


def check_directories(directory: str, what: str) -> None:
    """Every directory from `directory` up to /, as the kernel resolves it."""
    real = os.path.realpath(directory)
    while True:
        try:
            st = os.stat(real)
        except OSError as exc:
            raise UntrustedFile(f"cannot check {real} (above the {what}): "
                                f"{exc.strerror}") from None
        check_stat(st, real, "the directory" if real == os.path.realpath(directory)
                   else f"{real}, above the {what},", directory=True)
        parent = os.path.dirname(real)
        if parent == real:
            return
        real = parent


def open_regular(path: str, flags: int = os.O_RDONLY) -> tuple[int, os.stat_result]:
    """(fd, fstat) of a regular file opened without following a final
    symbolic link and without blocking. Raises UntrustedFile for anything
    else (FIFO, directory, device, socket, symbolic link)."""
    try:
        fd = os.open(path, flags | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        if os.path.islink(path):
            raise UntrustedFile(f"{path} is a symbolic link (to {os.readlink(path)}): "
                                "give the file itself") from None
        if exc.errno in (errno.ENXIO, errno.EISDIR):   # a FIFO nobody reads; a directory
            raise UntrustedFile(f"{path} is not a regular file") from None
        raise
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        raise UntrustedFile(f"{path} is not a regular file ({_kind(st.st_mode)})")
    return fd, st


def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISDIR, "a directory"),
                       (stat.S_ISSOCK, "a socket"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device")):
        if test(mode):
            return name
    return "not a plain file"


def read_bounded(fd: int, limit: int) -> bytes:
    """At most limit + 1 bytes from fd (the caller tells "too big" by length)."""
    chunks, left = [], limit + 1
    while left > 0:
        chunk = os.read(fd, min(left, 1 << 16))
        if not chunk:
            break
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)
