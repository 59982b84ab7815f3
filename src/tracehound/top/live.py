"""The live terminal loop: a poller thread fetches, the main thread draws and
answers keys, so a slow scrape never makes `q` wait."""
from __future__ import annotations

import os
import threading
import time
from typing import Optional

from rich.console import Console
from rich.live import Live

from .source import SourceError
from .state import ViewState
from .terminal import KeyboardTerminal, Terminated
from .view import screen


class Poller:
    """Polls the source every interval on its own thread; each result is
    handed over with take(), and a byte on a pipe wakes the key loop."""

    def __init__(self, source, interval: float):
        self.source = source
        self.interval = interval
        self.lock = threading.Lock()
        self.result: Optional[tuple] = None
        self.wake_r, self.wake_w = os.pipe()
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._run, name="top-poller", daemon=True)

    def start(self) -> "Poller":
        self.thread.start()
        return self

    def _run(self) -> None:
        next_at = time.monotonic()
        while not self.stopping.is_set():
            try:
                result = (self.source.poll(), None)
            except SourceError as exc:
                result = (None, str(exc))
            except Exception as exc:   # shown on screen rather than lost with the thread
                result = (None, f"{type(exc).__name__}: {exc}")
            with self.lock:
                self.result = result
            if self.stopping.is_set():
                return
            os.write(self.wake_w, b".")
            # a fixed rate keeps the rate intervals even when scrapes are slow
            next_at = max(next_at + self.interval, time.monotonic())
            self.stopping.wait(next_at - time.monotonic())

    def take(self) -> Optional[tuple]:
        with self.lock:
            result, self.result = self.result, None
        return result

    def stop(self) -> None:
        self.stopping.set()
        # a scrape in flight ends within its timeout; the daemon thread is
        # not waited for, and its pipe is left to the process exit
        if self.thread.ident is not None:
            self.thread.join(timeout=0.2)
        if not self.thread.is_alive():
            os.close(self.wake_r)
            os.close(self.wake_w)


def run_live(source, state: ViewState, interval: float, label: str) -> int:
    """Runs until q (0) or SIGTERM/SIGHUP (128 + signal)."""
    snap = None
    poller = Poller(source, interval)
    console = Console()
    try:
        with KeyboardTerminal() as term, \
                Live(screen(state, snap, label, interval), console=console, screen=True,
                     auto_refresh=False, redirect_stdout=False, redirect_stderr=False) as view:
            poller.start()
            while True:
                keys, woken = term.read_keys(interval, wake_fd=poller.wake_r)
                dirty = bool(keys)
                result = poller.take() if woken else None
                if result is not None:
                    new, state.error = result
                    # the agent source answers None until it has two scrapes
                    snap = new or snap
                    dirty = True
                for key in keys:
                    if state.handle_key(key):
                        return 0
                if dirty:
                    view.update(screen(state, snap, label, interval, console.size.height),
                                refresh=True)
    except Terminated as exc:
        return 128 + exc.signum
    finally:
        poller.stop()
