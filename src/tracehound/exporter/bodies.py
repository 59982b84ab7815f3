"""One rendered /metrics body read by many scrapes at their own pace.

The rendering runs once, driven by whichever reader first needs a chunk
not made yet; every chunk is kept until the last reader is done, so each
scrape sees the whole body while memory holds it once, however many
clients read it and however slowly (a client that stops reading is dropped
by the server's write deadline, which frees its share).
"""
from __future__ import annotations

import threading
from typing import Callable, Iterator


class SharedBody:
    """Chunks of `source`, made once. `key` and `generation` say what it
    is (format, and the collection it renders); `dropped(body)` is called
    when its last reader leaves."""

    def __init__(self, source: Iterator[bytes], key, generation,
                 dropped: Callable[["SharedBody"], None]):
        self.key = key
        self.generation = generation
        self._source = source
        self._dropped = dropped
        self._chunks: list[bytes] = []
        self._done = False
        self._error: BaseException | None = None
        self._make = threading.Lock()       # one reader renders at a time
        self._count = threading.Lock()
        self.readers = 0

    def join(self) -> None:
        """Count a reader in; each join is followed by a reader() that is
        read to its end or closed."""
        with self._count:
            self.readers += 1

    def reader(self) -> "Reader":
        return Reader(self)

    def chunk(self, index: int):
        """Chunk `index`, rendering it if no reader has yet; None past the end."""
        if index < len(self._chunks):
            return self._chunks[index]
        with self._make:
            while index >= len(self._chunks):
                if self._error is not None:
                    raise RuntimeError(f"rendering failed: {self._error!r}") from self._error
                if self._done:
                    return None
                try:
                    made = next(self._source)
                except StopIteration:
                    self._done = True
                    self._source = None
                    return None
                except BaseException as exc:
                    self._error = exc
                    self._source = None
                    raise
                if made:
                    self._chunks.append(made)
            return self._chunks[index]

    def leave(self) -> None:
        with self._count:
            self.readers -= 1
            last = self.readers == 0
        if last:
            with self._make:
                source, self._source = self._source, None
                # gone now, not when the last Reader object is collected
                self._chunks = []
                self.generation = None
            close = getattr(source, "close", None)
            if close is not None:
                close()                      # its clean-up runs now, not at collection
            self._dropped(self)


class Reader:
    """One scrape's pass over a SharedBody: an iterator of its chunks that
    leaves the body when exhausted, failed or closed."""

    def __init__(self, body: SharedBody):
        self._body = body
        self._next = 0
        self._open = True

    def __iter__(self):
        return self

    def __next__(self) -> bytes:
        if not self._open:
            raise StopIteration
        try:
            chunk = self._body.chunk(self._next)
        except BaseException:
            self.close()
            raise
        if chunk is None:
            self.close()
            raise StopIteration
        self._next += 1
        return chunk

    def close(self) -> None:
        if self._open:
            self._open = False
            self._body.leave()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False
