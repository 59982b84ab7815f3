"""The agent's local channel: HTTP over a Unix socket only root can open.

    channel = LocalChannel(path, app).start()      # app: Request -> Response
    channel.close()

Local consumers whose answer can take a node out of service (`tracehound
health`) must hear the agent itself. The TCP port is no such evidence: any
user can bind it while the agent restarts, or hold its connections, so it
stays Prometheus's. The socket is:

* in a directory owned by root that nobody else can write (RUN_DIR, made
  0755 when missing; a directory of any other owner or mode is refused), so
  no user can plant, replace or pre-create the name;
* bound under a temporary name, made 0600, then renamed into place, so the
  name never points at a socket anyone else can open;
* served to peers whose SO_PEERCRED uid is 0 alone (a descriptor handed to
  another user does not let that user in either).

Clients check the same from their side (clients/local_agent.py): the socket
and its directory owned by root, and the server's own peer uid 0.
"""
from __future__ import annotations

import logging
import os
import socket
import stat
from typing import Callable, Optional

from ..clients.local_agent import root_peer, trusted_directory
from ..errors import SetupError
from .http import HTTPServer
from .messages import Request, Response

log = logging.getLogger(__name__)

# connections at once: only root's clients reach it (health, explain, top)
MAX_CONNECTIONS = 16
def bind(path: str) -> socket.socket:
    """A listening Unix socket at `path`, mode 0600; SetupError naming why not."""
    directory = os.path.dirname(path) or "."
    try:
        os.makedirs(directory, mode=0o755, exist_ok=True)
    except OSError as exc:
        raise SetupError(f"local channel {path}: cannot make {directory}: "
                         f"{exc.strerror}") from None
    why = trusted_directory(directory)
    if why:
        raise SetupError(f"local channel {path}: {why}; it must be root's alone "
                         "(give another with --local-socket)")
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        st = None
    if st is not None:
        # the instance lock is held: a socket here is a dead agent's
        if not stat.S_ISSOCK(st.st_mode):
            raise SetupError(f"local channel {path}: something other than a socket is "
                             "there; left alone")
        os.unlink(path)
    tmp = f"{path}.{os.getpid()}.tmp"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        sock.bind(tmp)
        os.chmod(tmp, 0o600)
        sock.listen(64)
        os.rename(tmp, path)
    except OSError as exc:
        sock.close()
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise SetupError(f"local channel {path}: {exc.strerror}") from None
    return sock


class LocalChannel:
    """The app served on a root-only Unix socket (see the module doc)."""

    def __init__(self, path: str, app: Callable[[Request], Response]):
        self.path = path
        self.app = app
        self._server: Optional[HTTPServer] = None
        self._inode: Optional[int] = None

    def start(self) -> "LocalChannel":
        listener = bind(self.path)
        self._inode = os.lstat(self.path).st_ino
        self._server = HTTPServer("localhost", 0, self.app, listener=listener,
                                  max_connections=MAX_CONNECTIONS, accept_check=root_peer)
        self._server.start()
        return self

    def close(self) -> None:
        if self._server is None:
            return
        self._server.close()
        self._server = None
        try:
            # only the socket this agent made: a later agent's stays
            if os.lstat(self.path).st_ino == self._inode:
                os.unlink(self.path)
        except OSError:
            pass
