"""Opening a file another process names, as that process sees it.

A path read from /proc/PID/maps belongs to the process's mount namespace and
root, which any container user shapes: its symlinks are absolute in that
root, and the path may have become a FIFO, a device or a symlink to a host
file since the process mapped it. The file is opened with openat2(2) from
the process's root with RESOLVE_IN_ROOT (".." and absolute links stop at
that root), no magic links, no final symlink, first as O_PATH: nothing is
opened for reading (a device's open can have effects, a FIFO's can block)
until the descriptor is known to be a regular file on a file system the
kernel answers for; it is then reopened, without blocking, through
/proc/self/fd, which names that very inode. The lookup itself, and the
status of a file on FUSE, can still wait on a user's process: callers bound
the time (probes/rdma_app.py opens on a thread of its own).
"""
from __future__ import annotations

import ctypes
import errno
import os
import stat

SYS_OPENAT2 = 437                # the same number on every architecture (Linux 5.6+)
RESOLVE_NO_MAGICLINKS = 0x02
RESOLVE_IN_ROOT = 0x10
PATH_FLAGS = os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC
# no O_NOFOLLOW here: /proc/self/fd/N is the link to follow, to the inode checked
READ_FLAGS = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC
# a user's own daemon answers reads of these: one that never answers would stop the reader
USER_SERVED_FS = {0x65735546: "FUSE"}
OVERLAYFS = 0x794C7630


class RootedOpenError(Exception):
    """The file cannot be opened as a regular file inside the root."""


class _OpenHow(ctypes.Structure):
    _fields_ = [("flags", ctypes.c_uint64), ("mode", ctypes.c_uint64),
                ("resolve", ctypes.c_uint64)]


_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long
_libc.fstatfs.argtypes = [ctypes.c_int, ctypes.c_void_p]


def _openat2(dirfd: int, path: bytes, flags: int, resolve: int) -> int:
    how = _OpenHow(flags, 0, resolve)
    ctypes.set_errno(0)
    fd = _libc.syscall(ctypes.c_long(SYS_OPENAT2), ctypes.c_int(dirfd), ctypes.c_char_p(path),
                       ctypes.byref(how), ctypes.c_size_t(ctypes.sizeof(how)))
    if fd < 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))
    return fd


def fs_type(fd: int) -> int:
    """The file system magic number (statfs f_type) of descriptor `fd`."""
    buf = ctypes.create_string_buffer(128)   # struct statfs is 120 bytes; f_type comes first
    if _libc.fstatfs(fd, buf) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))
    return ctypes.c_long.from_buffer(buf).value


def open_regular(root: str, path: bytes) -> int:
    """A read-only descriptor of `path` resolved inside directory `root`
    (e.g. /proc/PID/root); raises RootedOpenError naming why not."""
    try:
        root_fd = os.open(root, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError as exc:
        raise RootedOpenError(f"cannot open the root {root}: {exc.strerror}") from None
    try:
        path_fd = _openat2(root_fd, path, PATH_FLAGS, RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS)
    except OSError as exc:
        if exc.errno != errno.ENOSYS:
            raise RootedOpenError(exc.strerror) from None
        if root != "/":
            raise RootedOpenError("the kernel has no openat2 (Linux 5.6+): files inside another "
                                  "root are not opened") from None
        # this host's own root: its directories are root's, a plain open resolves as well
        try:
            path_fd = os.open(path, PATH_FLAGS)
        except OSError as exc2:
            raise RootedOpenError(exc2.strerror) from None
    finally:
        os.close(root_fd)
    try:
        st = os.fstat(path_fd)
        if not stat.S_ISREG(st.st_mode):
            raise RootedOpenError(f"not a regular file ({_kind(st.st_mode)})")
        served = USER_SERVED_FS.get(fs_type(path_fd))
        if served:
            raise RootedOpenError(f"on a {served} file system, which a user's process answers")
        fd = os.open(f"/proc/self/fd/{path_fd}", READ_FLAGS)
    except OSError as exc:
        raise RootedOpenError(f"cannot read it: {exc.strerror}") from None
    finally:
        os.close(path_fd)
    return fd


def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISLNK, "a symbolic link, not followed"), (stat.S_ISFIFO, "a FIFO"),
                       (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
                       (stat.S_ISSOCK, "a socket"), (stat.S_ISDIR, "a directory")):
        if test(mode):
            return name
    return f"mode {mode:o}"
