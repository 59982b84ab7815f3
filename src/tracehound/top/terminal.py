"""Single keys from a terminal, and the terminal put back however we leave.

cbreak mode delivers keys without Enter and without echo while keeping
Ctrl-C working; the saved settings are restored on return, on exceptions
and on SIGTERM/SIGHUP, which are turned into an exception so that every
`finally` on the way out runs.
"""
from __future__ import annotations

import io
import os
import select
import signal
import sys
import termios
import tty
from typing import Optional

from ..errors import TracehoundError


class Terminated(Exception):
    def __init__(self, signum: int):
        super().__init__(f"signal {signum}")
        self.signum = signum


def _raise_terminated(signum, frame):
    raise Terminated(signum)


def split_keys(data: str) -> list[str]:
    """Keys in what one read returned. Escape sequences (arrows, function
    keys) come as one key so their bytes are not taken for letters."""
    keys = []
    i = 0
    while i < len(data):
        if data[i] == "\x1b" and i + 1 < len(data) and data[i + 1] in "[O":
            j = i + 2
            while j < len(data) and not (data[j].isalpha() or data[j] == "~"):
                j += 1
            keys.append(data[i:j + 1])
            i = j + 1
        else:
            keys.append(data[i])
            i += 1
    return keys


class KeyboardTerminal:
    SIGNALS = (signal.SIGTERM, signal.SIGHUP)

    def __init__(self, fd: Optional[int] = None):
        self.fd = fd
        self.saved = None
        self.old_handlers: dict = {}

    def __enter__(self) -> "KeyboardTerminal":
        if self.fd is None:
            try:
                self.fd = sys.stdin.fileno()
            except (AttributeError, ValueError, io.UnsupportedOperation):
                self.fd = -1
        if self.fd < 0 or not os.isatty(self.fd):
            raise TracehoundError("the live view needs a terminal on stdin; "
                                  "use --once (or --once --json) in scripts")
        self.saved = termios.tcgetattr(self.fd)
        for sig in self.SIGNALS:
            self.old_handlers[sig] = signal.signal(sig, _raise_terminated)
        tty.setcbreak(self.fd, termios.TCSANOW)
        return self

    def __exit__(self, *exc) -> None:
        self.restore()

    def restore(self) -> None:
        if self.saved is not None:
            # TCSAFLUSH: drop keys typed after quitting rather than feed them to the shell
            termios.tcsetattr(self.fd, termios.TCSAFLUSH, self.saved)
            self.saved = None
        for sig, handler in self.old_handlers.items():
            signal.signal(sig, handler)
        self.old_handlers.clear()

    def read_keys(self, timeout: float, wake_fd: Optional[int] = None) -> tuple[list[str], bool]:
        """Keys typed within timeout seconds, and whether wake_fd became
        readable meanwhile (its bytes are drained)."""
        fds = [self.fd] if wake_fd is None else [self.fd, wake_fd]
        ready, _, _ = select.select(fds, [], [], max(0.0, timeout))
        woken = wake_fd is not None and wake_fd in ready
        if woken:
            os.read(wake_fd, 4096)
        if self.fd not in ready:
            return [], woken
        data = os.read(self.fd, 256)
        if not data:
            # stdin closed (the terminal went away): nothing more will come
            raise Terminated(signal.SIGHUP)
        return split_keys(data.decode(errors="ignore")), woken
