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

Restarts: the last sequence number read is saved with the boot id to
`state_file` (temp file + rename; at most once per `persist_interval_s`, and
on stop). A new watcher reads the ring from its oldest record and hands on
only records after the saved one: each line once across agent restarts while
the ring still holds it. Another boot id, or (boot id unknown) a saved number
beyond the newest record, means a reboot: the whole ring is new. After a
crash, what was read since the last save is handed on again.

Lines written to /dev/kmsg from user space (root only) count like the
kernel's own.
"""
from __future__ import annotations

import json
import logging
import os
import select
import threading
import time
from dataclasses import replace
from typing import Callable, Protocol

# the parsers live apart (pure, fuzzed); their names are this module's API too
from .kmsg_parse import (EVENT_KINDS, MALFORMED, GpuKernelEvent, KmsgRecord, normalize_pci,
                         parse_gpu_line, parse_record)

__all__ = ["EVENT_KINDS", "MALFORMED", "GpuKernelEvent", "KmsgRecord", "normalize_pci",
           "parse_gpu_line", "parse_record", "DevKmsg", "KmsgSource", "KmsgWatcher",
           "read_boot_id", "DEFAULT_PATH", "DEFAULT_STATE"]

log = logging.getLogger(__name__)

DEFAULT_PATH = "/dev/kmsg"
DEFAULT_STATE = "/var/lib/tracehound/kmsg-seq"
BOOT_ID_PATH = "/proc/sys/kernel/random/boot_id"
# The kernel refuses (EINVAL) a read buffer smaller than the next record;
# a formatted record is at most 8 KiB.
READ_SIZE = 16384


class KmsgSource(Protocol):
    """read(): one record, or None when none came within `timeout` seconds;
    BrokenPipeError when records were overwritten before being read (the
    next read returns the oldest record still held)."""
    def read(self, timeout: float) -> bytes | None: ...
    def close(self) -> None: ...


class DevKmsg:
    """/dev/kmsg opened at its oldest record, read without blocking."""

    def __init__(self, path: str = DEFAULT_PATH):
        self.fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        self._poll = select.poll()
        self._poll.register(self.fd, select.POLLIN)

    def read(self, timeout: float) -> bytes | None:
        for attempt in (0, 1):
            try:
                return os.read(self.fd, READ_SIZE)
            except BlockingIOError:
                # a reader that was overtaken wakes with POLLERR; its read says EPIPE
                if attempt or not self._poll.poll(max(0, int(timeout * 1000))):
                    return None
        return None

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


def read_boot_id(path: str = BOOT_ID_PATH) -> str | None:
    try:
        with open(path) as f:
            return f.read().strip() or None
    except OSError:
        return None


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
                 poll_s: float = 0.5, persist_interval_s: float = 1.0):
        self.path = path
        self.state_file = state_file
        self.on_event = on_event
        self.clock = clock
        self.open_source = open_source or (lambda: DevKmsg(path))
        self.boot_id = boot_id
        self.poll_s = poll_s
        self.persist_interval_s = persist_interval_s
        # counters (see the module docstring); state_writes: saves done
        self.records_read = self.gpu_events = self.malformed = 0
        self.overruns = self.records_lost = self.state_writes = 0
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
        self._logged_read_errors: set[int] = set()

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
        self._boot = self.boot_id()
        self._skip_upto = self._resume_point()
        self._saved_seq = self._skip_upto
        self.last_seq = self._skip_upto
        self._newest_skipped = None
        self._stop.clear()
        self._caught_up.clear()
        self._thread = threading.Thread(target=self._run, name="kmsg-watch", daemon=True)
        self._thread.start()
        return self

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def wait_caught_up(self, timeout: float | None = None) -> bool:
        """True once every record the ring held at start has been read."""
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
        if not self.state_file:
            return None
        try:
            with open(self.state_file) as f:
                state = json.load(f)
            seq, boot = state["seq"], state.get("boot_id")
            if not isinstance(seq, int) or isinstance(seq, bool) or seq < 0:
                raise ValueError(f"bad seq {seq!r}")
        except FileNotFoundError:
            return None
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
            log.warning("ignoring kernel log position in %s: %s", self.state_file, exc)
            return None
        self.positioned = True
        if boot and self._boot and boot != self._boot:
            return None     # rebooted: sequence numbers started again
        return seq

    def _save(self, force: bool = False) -> None:
        seq = self.last_seq
        if not self.state_file or seq is None or seq == self._saved_seq:
            return
        if self._skip_upto is not None:
            return      # still below the saved position: never move it back
        now = self.clock()
        if not force and now - self._saved_at < self.persist_interval_s:
            return
        self._saved_at = now
        tmp = f"{self.state_file}.{os.getpid()}.tmp"
        try:
            os.makedirs(os.path.dirname(self.state_file) or ".", exist_ok=True)
            with open(tmp, "w") as f:
                json.dump({"seq": seq, "boot_id": self._boot}, f)
            # no fsync: a power loss also empties the ring and changes the boot id
            os.replace(tmp, self.state_file)
        except OSError as exc:
            log.warning("cannot save kernel log position to %s: %s", self.state_file, exc)
            return
        self._saved_seq = seq
        self.state_writes += 1

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                try:
                    raw = self._source.read(self.poll_s)
                except BrokenPipeError:
                    self.overruns += 1
                    continue
                except OSError as exc:
                    if exc.errno not in self._logged_read_errors:
                        self._logged_read_errors.add(exc.errno)
                        log.warning("reading %s: %s", self.path, exc)
                    self._stop.wait(self.poll_s)
                    continue
                if raw is None:
                    self._idle()
                    continue
                try:
                    self._record(raw)
                except Exception:  # noqa: BLE001 - no record may stop the reader
                    self.malformed += 1
                    log.log(logging.WARNING if self.malformed == 1 else logging.DEBUG,
                            "kernel log record %r could not be read; skipped", raw[:200],
                            exc_info=True)
                self._save()
        except Exception:  # the thread must end with the position saved
            log.exception("kernel log watcher failed")
        finally:
            self._save(force=True)
            source, self._source = self._source, None
            if source is not None:
                source.close()

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
        self._save()

    def _rebooted(self) -> None:
        """Saved seq beyond the whole ring: a new boot whose ring is still
        short. Read it again, handing everything on."""
        log.info("kernel log position %d is beyond the newest record %d: node rebooted",
                 self._skip_upto, self._newest_skipped)
        self._source.close()
        self._source = None
        try:
            self._source = self.open_source()
        except OSError as exc:
            self.error = f"cannot read {self.path}: {exc}"
            log.warning("kernel log unavailable after reopening: %s", exc)
            self._stop.set()
            return
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
