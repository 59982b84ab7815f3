"""Files an operator names (a web configuration, the certificates it names,
a password file) read as regular files only: a FIFO or a device at the name
would hang start-up or be read without end. Opened without blocking, checked
on the descriptor (what is read is what was checked), read up to a bound.
Links are followed: a Kubernetes secret mounts its files as links."""
from __future__ import annotations

import os
import stat

# a configuration, a certificate chain or a password: kilobytes
MAX_CONFIG_BYTES = 1 << 20


class NotRegularFile(OSError):
    pass


def read_regular(path: str, limit: int = MAX_CONFIG_BYTES) -> bytes:
    """The bytes of PATH; NotRegularFile when it is not a regular file or is
    over LIMIT bytes, OSError when it cannot be opened."""
    fd, st = _open_regular(path)
    try:
        if st.st_size > limit:
            raise NotRegularFile(f"{path} has {st.st_size} bytes, more than {limit}")
        data = read_upto(fd, limit)
        if len(data) > limit:
            raise NotRegularFile(f"{path} grew past {limit} bytes while read")
        return data
    finally:
        os.close(fd)


def read_upto(fd: int, most: int) -> bytes:
    """What FD holds, read to its end but never more than MOST + 1 bytes:
    a longer answer says the file holds (or grew to) more than MOST."""
    chunks, size = [], 0
    while size <= most:
        chunk = os.read(fd, min(1 << 20, most + 1 - size))
        if not chunk:
            break
        chunks.append(chunk)
        size += len(chunk)
    return b"".join(chunks)


def check_regular(path: str) -> str:
    """PATH, once it is known to be a regular file (for a library that opens
    it itself, such as ssl's load_cert_chain); NotRegularFile otherwise."""
    os.close(_open_regular(path)[0])
    return path


def _open_regular(path: str) -> tuple[int, os.stat_result]:
    """PATH opened without blocking (a FIFO cannot hang it), and its status;
    NotRegularFile (the descriptor closed) when it is not a regular file."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY)
    try:
        st = os.fstat(fd)
    except OSError:
        os.close(fd)
        raise
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        raise NotRegularFile(f"{path} is not a regular file")
    return fd, st
