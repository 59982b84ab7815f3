"""The files `tracehound health` reads and writes (its state file, the
textfile for node_exporter), handled as the agent handles its own: their
directories may be writable by other accounts (a textfile directory often
is), so

* a write goes to a new file made with O_CREAT|O_EXCL|O_NOFOLLOW under a
  random name beside the target, then renamed over it: a link planted at the
  name is replaced, never written through;
* a read opens without following a link and without blocking (a FIFO there
  cannot hang the check), takes a regular file owned by this uid alone (no
  other account can make one: a planted state cannot steer a verdict), and
  reads at most `limit` bytes.

Errors are OSError or FileRefused, each naming the file.
"""
from __future__ import annotations

import os
import secrets
import stat


class FileRefused(OSError):
    pass


def read_own(path: str, limit: int) -> bytes | None:
    """The bytes of `path` (None when there is no such file); FileRefused
    when it is not a regular file of this uid or is over `limit` bytes."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    except OSError as exc:      # ELOOP: a link
        raise FileRefused(f"{path}: {exc.strerror}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise FileRefused(f"{path} is not a regular file")
        if st.st_uid != os.geteuid():
            raise FileRefused(f"{path} is owned by uid {st.st_uid}, not {os.geteuid()}")
        if st.st_size > limit:
            raise FileRefused(f"{path} has {st.st_size} bytes, more than {limit}")
        return os.read(fd, limit + 1)[:limit]
    finally:
        os.close(fd)


def write_whole(path: str, data: bytes, mode: int = 0o644) -> None:
    """Replace `path` with `data` at once (see the module doc)."""
    directory = os.path.dirname(path) or "."
    tmp = os.path.join(directory, f".{os.path.basename(path)}.{secrets.token_hex(8)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, mode)
    try:
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
            os.fchmod(fd, mode)         # whatever the umask
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
