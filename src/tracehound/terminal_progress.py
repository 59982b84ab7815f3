"""Progress for long work (benchmarks, chaos runs, report generation).

On a terminal: a rich progress bar with elapsed and remaining time. Piped
or in CI: one plain line per step, so logs still show how far it got.
"""
from __future__ import annotations

import sys
import time
from contextlib import contextmanager
from typing import Callable, Iterator, TextIO


class Steps:
    """advance(description) marks one step done; `done` counts them."""

    def __init__(self, total: int, advance: Callable[[str], None]):
        self.total = total
        self.done = 0
        self._advance = advance

    def advance(self, description: str = "") -> None:
        self.done += 1
        self._advance(description)


@contextmanager
def steps(total: int, title: str, stream: TextIO | None = None) -> Iterator[Steps]:
    stream = stream or sys.stderr
    if stream.isatty():
        try:
            from rich.console import Console
            from rich.progress import (BarColumn, MofNCompleteColumn, Progress, TextColumn,
                                       TimeElapsedColumn, TimeRemainingColumn)
        except ImportError:
            pass
        else:
            with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                          TimeElapsedColumn(), TimeRemainingColumn(),
                          console=Console(file=stream), transient=False) as bar:
                task = bar.add_task(title, total=total)

                def advance(description: str) -> None:
                    bar.update(task, advance=1,
                               description=f"{title}: {description}" if description else title)
                yield Steps(total, advance)
            return
    started = time.monotonic()
    counter = Steps(total, lambda d: None)

    def plain(description: str) -> None:
        elapsed = time.monotonic() - started
        left = elapsed / counter.done * (total - counter.done) if counter.done else 0.0
        print(f"{title}: [{counter.done}/{total}] {description} "
              f"({elapsed:.0f} s elapsed, ~{left:.0f} s left)", file=stream, flush=True)
    counter._advance = plain
    yield counter
