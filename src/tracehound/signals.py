"""SIGINT and SIGTERM held from the first moment the command line runs.

Building the parser imports every command (about 80 ms on a small node);
until a command says what a stop signal means, one that arrives is only
remembered. `tracehound run` then treats it as a stop request before
anything is loaded; every other command gets Python's defaults back and the
signal delivered again, so Ctrl-C behaves exactly as it would have.
"""
from __future__ import annotations

import signal
import threading
from typing import Callable, Optional

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


class HeldSignals:
    def __init__(self):
        self.received: Optional[int] = None
        self._previous: dict = {}
        if threading.current_thread() is not threading.main_thread():
            return          # only the main thread may set handlers (main() called as a library)
        self._previous = {s: signal.signal(s, self._remember) for s in STOP_SIGNALS}

    def _remember(self, signum, _frame) -> None:
        if self.received is None:
            self.received = signum

    def hand_over(self, handler: Callable[[int], None]) -> None:
        """`handler(signum)` from now on, called at once for a signal already held."""
        for s in self._previous:
            signal.signal(s, lambda signum, _frame: handler(signum))
        if self.received is not None:
            handler(self.received)

    def release(self) -> None:
        """The handlers in place before, and a held signal delivered again."""
        for s, previous in self._previous.items():
            signal.signal(s, previous)
        if self.received is not None:
            signal.raise_signal(self.received)
