"""The agent's log lines reach standard error without ever holding the agent.

Every detector's event is also a log line, and a kernel log full of GPU
errors replays hundreds of them at start. When standard error is a pipe that
no one reads (a supervisor that stopped draining it, a test harness done
with start-up), a plain StreamHandler blocks the thread that logs once the
pipe is full, holding the handler's lock: then every other thread that logs,
the main thread handling SIGTERM included, waits on it, and the agent stops.

So records go into a bounded queue (never blocking: past the bound a record
is dropped and counted) and one daemon thread writes them with os.write on
its own copy of the descriptor. A full pipe blocks only that thread; the
agent exits past it, as the thread is a daemon and holds no lock that
logging's shutdown or anything else takes. When lines were dropped, the
writer says how many before the next line it writes.
"""
from __future__ import annotations

import atexit
import datetime
import json
import logging
import logging.handlers
import os
import queue
import threading
import time

# the logger every detector's event goes through (exporter/events.py keeps them)
EVENTS_LOGGER = "tracehound.events"
QUEUED_RECORDS = 2000       # a few hundred KB of lines at most
EXIT_DRAIN_S = 2.0          # how long a command's exit waits for its last lines


class DroppingQueueHandler(logging.handlers.QueueHandler):
    """A QueueHandler whose full queue drops the record instead of raising
    (QueueHandler would call handleError, which writes to sys.stderr: the
    very stream that is blocked)."""

    def __init__(self, q: queue.Queue):
        super().__init__(q)
        self.dropped = 0
        self._count_guard = threading.Lock()

    def enqueue(self, record: logging.LogRecord) -> None:
        try:
            self.queue.put_nowait(record)
        except queue.Full:
            with self._count_guard:
                self.dropped += 1

    def take_dropped(self) -> int:
        with self._count_guard:
            n, self.dropped = self.dropped, 0
        return n


class DescriptorWriter:
    """The one thread that writes the queued records to a descriptor
    (standard error for log lines, standard output for status lines)."""

    def __init__(self, handler: DroppingQueueHandler, formatter: logging.Formatter, fd: int):
        self.handler = handler
        self.formatter = formatter
        self.fd = os.dup(fd)
        self.thread = threading.Thread(target=self._run, name="log-writer", daemon=True)

    def start(self) -> "DescriptorWriter":
        self.thread.start()
        return self

    def _run(self) -> None:
        while True:
            record = self.handler.queue.get()
            dropped = self.handler.take_dropped()
            text = ""
            if dropped:
                text = f"tracehound: WARNING: {dropped} log lines dropped (the output was not read)\n"
            try:
                text += self.formatter.format(record) + "\n"
            except Exception:  # a record that cannot be formatted is one line lost
                text += "tracehound: WARNING: a log line could not be formatted\n"
            self._write(text.encode("utf-8", "replace"))
            self.handler.queue.task_done()

    def drain(self, timeout: float) -> bool:
        """Wait until every queued line is written, or timeout seconds: a
        command's last lines reach the terminal before it exits, and an
        unread pipe delays the exit by at most that long."""
        q = self.handler.queue
        deadline = time.monotonic() + timeout
        with q.all_tasks_done:
            while q.unfinished_tasks:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                q.all_tasks_done.wait(left)
        return True

    def _write(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            try:
                view = view[os.write(self.fd, view):]
            except InterruptedError:
                continue
            except OSError:     # the descriptor closed: nothing more to say
                return


class JsonFormatter(logging.Formatter):
    """One JSON object per line, for log pipelines (Loki, Elasticsearch,
    journald's JSON export): time, level, logger and message; a detector's
    event (logged as its JSON) is kept as the object it is, under "event"."""

    def __init__(self, events_logger: str = EVENTS_LOGGER):
        super().__init__()
        self.events_logger = events_logger

    def format(self, record: logging.LogRecord) -> str:
        when = datetime.datetime.fromtimestamp(record.created, datetime.timezone.utc)
        out = {"time": when.isoformat(timespec="milliseconds"),
               "level": record.levelname.lower(), "logger": record.name}
        message = record.getMessage()
        if record.name == self.events_logger:
            try:
                out["event"] = json.loads(message)
            except ValueError:
                out["message"] = message
        else:
            out["message"] = message
        if record.exc_info:
            out["error"] = self.formatException(record.exc_info)
        # one line whatever the message holds: json.dumps escapes newlines
        return json.dumps(out, default=str)


def _queued_writer(fd: int, fmt: str | logging.Formatter,
                   capacity: int) -> DroppingQueueHandler:
    """A queue handler and the writer thread that empties it into fd; the
    interpreter's exit waits a little for the lines still queued."""
    handler = DroppingQueueHandler(queue.Queue(capacity))
    formatter = fmt if isinstance(fmt, logging.Formatter) else logging.Formatter(fmt)
    writer = DescriptorWriter(handler, formatter, fd).start()
    atexit.register(writer.drain, EXIT_DRAIN_S)
    return handler


def line_printer(fd: int = 1, capacity: int = QUEUED_RECORDS):
    """A print() for the agent's status lines (start-up, stop) through a
    queue and writer of their own: a full standard output can no more hold
    the agent's stop than its log lines can."""
    handler = _queued_writer(fd, "%(message)s", capacity)

    def out(text: str) -> None:
        handler.enqueue(logging.makeLogRecord({"msg": text, "args": None}))
    return out


def log_to_stderr(level: int, fmt: str | logging.Formatter, fd: int = 2,
                  capacity: int = QUEUED_RECORDS) -> DroppingQueueHandler | None:
    """Configure the root logger as logging.basicConfig would (only where it
    has no handler yet), through the queue and the writer thread."""
    root = logging.getLogger()
    if root.handlers:
        return None
    handler = _queued_writer(fd, fmt, capacity)
    root.addHandler(handler)
    root.setLevel(level)
    return handler
