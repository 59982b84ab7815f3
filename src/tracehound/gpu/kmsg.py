"""NVIDIA GPU errors read from the kernel log (/dev/kmsg).

The driver logs XIDs, NVSwitch SXids, "fallen off the bus" and adapter init
failures there even when NVML cannot load or the GPU no longer answers.

Interface::

    watcher = KmsgWatcher(on_event=handle).start()   # reader thread running
    if watcher.error:                                # /dev/kmsg unreadable
        log.info("kernel-log GPU errors off: %s", watcher.error)
    ...
    watcher.stop()                                   # joins, saves position

    def handle(event: GpuKernelEvent) -> None: ...   # called on the thread

Events (GpuKernelEvent), one per recognised driver line:
  kind      "xid" | "sxid" | "fallen_off_bus" | "init_failed"
  pci       "0000:3b:00.0" (NVML's bus id form), None when the line has none
  number    the XID or SXid number (None for the other kinds)
  pid, process   the process the driver names on an XID line, else None
  device    "nvidia-nvswitch3" for an SXid, "nvidia<minor>" for an init
            failure naming a device minor, else None
  fatal     True/False from an SXid's "Fatal"/"Non-fatal", else None
  gpu_instance   the MIG GPU instance an XID names ("GPU-I:05"), else None
  detail    the driver's text after the fields above
  message   the whole line; seq/usec: the kernel record it came from
  replayed  True for a record the ring held when the watcher started
  history   replayed without a saved position to resume from (first start:
            the ring's history; after a restart or a reboot it is False)

Counters (plain int attributes, monotonic for the watcher's life):
  records_read   kernel records read (all of them, not only GPU lines)
  gpu_events     events handed to on_event
  malformed      lines that start like an XID/SXid report but do not parse
  overruns       reads that failed with EPIPE (the ring overtook the reader)
  records_lost   records overwritten before being read, while running or
                 while the agent was down (gaps in sequence numbers)
  restarts       times the reader failed (a read error, an end of file, an
                 exception outside one record's handling) and was reopened
`up` is True while the source is open and reading, False while a failed
reader waits to be reopened (1 s, doubling to 60 s; logged each time).

Agent restarts: the last sequence number read is saved with the boot id to
`state_file` (gpu/kmsg_state.py: a directory only the agent can write, a
fresh temp file + rename; at most once per `persist_interval_s`, and on
stop). A new watcher reads the ring from its oldest record and hands on
only records after the saved one: each line once across agent restarts while
the ring still holds it. Another boot id, or (boot id unknown) a saved number
beyond the newest record, means a reboot: the whole ring is new. After a
crash, what was read since the last save is handed on again.

Lines written to /dev/kmsg from user space (root only) count like the
kernel's own.
"""
from __future__ import annotations

import logging
import threading
import time
from dataclasses import replace
from typing import Callable

# the parsers (pure, fuzzed) and the source live apart; their names are this module's API too
from .kmsg_parse import (EVENT_KINDS, MALFORMED, GpuKernelEvent, KmsgRecord, normalize_pci,
                         parse_gpu_line, parse_record)
from .kmsg_source import DEFAULT_PATH, DevKmsg, KmsgSource, read_boot_id
from .kmsg_state import StateError, StateFile

__all__ = ["EVENT_KINDS", "MALFORMED", "GpuKernelEvent", "KmsgRecord", "normalize_pci",
           "parse_gpu_line", "parse_record", "DevKmsg", "KmsgSource", "KmsgWatcher",
           "read_boot_id", "DEFAULT_PATH", "DEFAULT_STATE"]

log = logging.getLogger(__name__)

DEFAULT_STATE = "/var/lib/tracehound/kmsg-seq"
# a reader that fails is reopened after 1 s, then 2, 4 ... at most 60 s apart
BACKOFF_MIN_S, BACKOFF_MAX_S = 1.0, 60.0

EventCallback = Callable[[GpuKernelEvent], None]


class KmsgWatcher:
    """Reads the kernel log on a thread and hands GPU events to `on_event`.

    on_event runs on the watcher's thread: it must be quick and thread-safe.
    `open_source` replaces /dev/kmsg (tests); `boot_id` returns the current
    boot's id or None; `clock` paces the state file writes."""

    def __init__(self, path: str = DEFAULT_PATH, state_file: str | None = DEFAULT_STATE,
                 on_event: EventCallback | None = None,
                 clock: Callable[[], float] = time.monotonic, *,
                 open_source: Callable[[], KmsgSource] | None = None,
                 boot_id: Callable[[], str | None] = read_boot_id,
                 poll_s: float = 0.5, persist_interval_s: float = 1.0,
                 backoff_s: tuple[float, float] = (BACKOFF_MIN_S, BACKOFF_MAX_S)):
        self.path = path
        self.state_file = state_file
        self._position = StateFile(state_file) if state_file else None
        self._state: StateFile | None = None    # the position, when its directory is safe
        self.state_error: str | None = None     # why no position is kept, if none is
        self.on_event = on_event
        self.clock = clock
        self.open_source = open_source or (lambda: DevKmsg(path))
        self.boot_id = boot_id
        self.poll_s = poll_s
        self.persist_interval_s = persist_interval_s
        self.backoff_s = backoff_s
        # counters (see the module docstring); state_writes: saves done
        self.records_read = self.gpu_events = self.malformed = 0
        self.overruns = self.records_lost = self.state_writes = self.restarts = 0
        self.up = False                         # the source is open and reads
        self.last_seq: int | None = None
        self.error: str | None = None
        self._source: KmsgSource | None = None
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._caught_up = threading.Event()
        self._boot: str | None = None
        self._skip_upto: int | None = None      # records up to this seq were read before
        self.positioned = False                 # a saved position was found at start
        self._newest_skipped: int | None = None
        self._saved_seq: int | None = None
        self._saved_at = float("-inf")
        self._save_error: str | None = None

    def start(self) -> KmsgWatcher:
        if self._thread is not None:
            return self
        try:
            self._source = self.open_source()
        except OSError as exc:
            self.error = f"cannot read {self.path}: {exc}"
            log.warning("kernel log unavailable, GPU errors it reports will not be seen: %s", exc)
            return self
        self.error = None
        self.up = True
        self._boot = self.boot_id()
        self._check_state_dir()
        self._skip_upto = self._resume_point()
        self._saved_seq = self._skip_upto
        self.last_seq = self._skip_upto
        self._newest_skipped = None
        self._stop.clear()
        self._caught_up.clear()
        self._thread = threading.Thread(target=self._run, name="kmsg-watch", daemon=True)
        self._thread.start()
        return self

    def _check_state_dir(self) -> None:
        self._state = self._position
        if self._state is None:
            return
        self.state_error = self._state.refused()
        if self.state_error:
            log.warning("kernel log position not kept: %s (the directory must be the agent's "
                        "own, writable by no other user); every start reads the ring as new",
                        self.state_error)
            self._state = None

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def wait_caught_up(self, timeout: float | None = None) -> bool:
        """True once every record the ring held at start has been read;
        False at once when no reader was started (the log is unreadable)."""
        if self._thread is None:
            return False
        return self._caught_up.wait(timeout)

    def stop(self) -> bool:
        """Stop, join and save the position; False if the thread hung."""
        self._stop.set()
        thread, self._thread = self._thread, None
        if thread is None:
            return True
        thread.join(timeout=self.poll_s * 4 + 2)
        return not thread.is_alive()

    def _resume_point(self) -> int | None:
        """The seq to skip up to, or None to hand on the whole ring."""
        self.positioned = False
        if self._state is None:
            return None
        try:
            saved = self._state.load()
        except StateError as exc:
            log.warning("ignoring kernel log position in %s: %s", self.state_file, exc)
            return None
        if saved is None:
            return None
        seq, boot = saved
        self.positioned = True
        if boot and self._boot and boot != self._boot:
            return None     # rebooted: sequence numbers started again
        return seq

    def _save(self, force: bool = False) -> None:
        seq = self.last_seq
        if self._state is None or seq is None or seq == self._saved_seq:
            return
        if self._skip_upto is not None:
            return      # still below the saved position: never move it back
        now = self.clock()
        if not force and now - self._saved_at < self.persist_interval_s:
            return
        self._saved_at = now
        try:
            self._state.save(seq, self._boot)
        except (OSError, StateError) as exc:
            if str(exc) != self._save_error:
                self._save_error = str(exc)
                log.warning("cannot save kernel log position to %s: %s", self.state_file, exc)
            return
        self._save_error = None
        self._saved_seq = seq
        self.state_writes += 1

    def _run(self) -> None:
        """Read until stopped; a reader that fails is reopened after a pause
        that doubles from backoff_s[0] to backoff_s[1], and halves back only
        after it read for backoff_s[1] without failing."""
        delay = self.backoff_s[0]
        try:
            while True:
                opened = time.monotonic()
                try:
                    failure = self._read_until_failure()
                except Exception as exc:  # noqa: BLE001 - the reader restarts, never dies
                    log.exception("kernel log reader failed")
                    failure = f"{type(exc).__name__}: {exc}"
                self.up = False
                if failure is None or self._stop.is_set():
                    return
                if time.monotonic() - opened >= self.backoff_s[1]:
                    delay = self.backoff_s[0]
                self._close_source()
                self.restarts += 1
                log.warning("kernel log reader stopped (%s); reopening %s in %g s (restart %d)",
                            failure, self.path, delay, self.restarts)
                if self._stop.wait(delay):
                    return
                delay = min(delay * 2, self.backoff_s[1])
                try:
                    self._reopen()
                except OSError as exc:
                    self.error = f"cannot read {self.path}: {exc}"
                    continue    # counted as the next restart's cause
        finally:
            self.up = False
            self._save(force=True)
            self._close_source()

    def _read_until_failure(self) -> str | None:
        """None once stopped; else why reading cannot go on."""
        if self._source is None:
            return self.error or "no source"
        self.up = True
        self.error = None
        while not self._stop.is_set():
            try:
                raw = self._source.read(self.poll_s)
            except BrokenPipeError:
                self.overruns += 1
                continue
            except OSError as exc:
                return f"read error: {exc}"
            if raw is None:
                self._idle()
                continue
            if not raw:
                return "end of file"     # /dev/kmsg never ends: not the kernel log
            try:
                self._record(raw)
            except Exception:  # noqa: BLE001 - no record may stop the reader
                self.malformed += 1
                log.log(logging.WARNING if self.malformed == 1 else logging.DEBUG,
                        "kernel log record %r could not be read; skipped", raw[:200],
                        exc_info=True)
            self._save()
        return None

    def _reopen(self) -> None:
        """A new source, read from its oldest record: what was handed on
        before is skipped as at a start with a saved position."""
        self._source = self.open_source()
        seqs = [s for s in (self._skip_upto, self.last_seq) if s is not None]
        self._skip_upto = max(seqs) if seqs else None
        self._newest_skipped = None

    def _close_source(self) -> None:
        source, self._source = self._source, None
        if source is not None:
            try:
                source.close()
            except OSError:
                pass

    def _idle(self) -> None:
        if not self._caught_up.is_set():
            newest = self._newest_skipped
            if self._skip_upto is not None and newest is not None and newest < self._skip_upto:
                self._rebooted()
                return
            self._skip_upto = None
            self._caught_up.set()
            if not self.positioned:
                log.info("read the kernel log's %d records from before the agent started (no "
                         "saved position): GPU errors among them are counted, not raised as "
                         "events", self.records_read)
        elif self._skip_upto is not None and self._newest_skipped is not None \
                and self._newest_skipped >= self._skip_upto:
            self._skip_upto = None   # reopened after a failure: back where it was
        self._save()

    def _rebooted(self) -> None:
        """Saved seq beyond the whole ring: a new boot whose ring is still
        short. Read it again, handing everything on (an open that fails
        raises: the reader restarts)."""
        log.info("kernel log position %d is beyond the newest record %d: node rebooted",
                 self._skip_upto, self._newest_skipped)
        self._close_source()
        self._source = self.open_source()
        self._skip_upto = None
        self._newest_skipped = None
        self.last_seq = None

    def _record(self, raw: bytes) -> None:
        rec = parse_record(raw)
        if rec is None:
            return
        self.records_read += 1
        prev = self.last_seq
        if prev is not None and rec.seq > prev + 1:
            self.records_lost += rec.seq - prev - 1
        self.last_seq = rec.seq
        if self._skip_upto is not None:
            if rec.seq <= self._skip_upto:
                self._newest_skipped = rec.seq
                return
            self._skip_upto = None  # past the saved point: same boot, go on
        event = parse_gpu_line(rec.message)
        if event is None:
            return
        if event.kind == MALFORMED:
            self.malformed += 1
            log.log(logging.INFO if self.malformed == 1 else logging.DEBUG,
                    "unparsed NVIDIA driver line: %s", event.message)
            return
        self.gpu_events += 1
        if self.on_event is not None:
            try:
                replayed = not self._caught_up.is_set()
                self.on_event(replace(event, seq=rec.seq, usec=rec.usec, replayed=replayed,
                                      history=replayed and not self.positioned))
            except Exception:  # a bad handler must not end the watcher
                log.exception("handling kernel GPU event")
