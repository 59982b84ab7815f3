"""NVML event set consumed on a background thread.

XIDs and ECC/PState/clock events are edge-triggered by the driver: polling
at scrape time would miss every event between two scrapes, so one thread
waits on the event set with a short timeout (so stop() returns promptly) and
hands each event to a callback that only increments counters.
"""
from __future__ import annotations

import ctypes
import logging
import threading
from typing import Callable

from .device import Gpu
from .nvml import GpuLost, error_code, is_error, read

log = logging.getLogger(__name__)

# exported label -> NVML event type constant
EVENT_TYPES = (
    ("xid", "nvmlEventTypeXidCriticalError"),
    ("single_bit_ecc", "nvmlEventTypeSingleBitEccError"),
    ("double_bit_ecc", "nvmlEventTypeDoubleBitEccError"),
    ("pstate", "nvmlEventTypePState"),
    ("clock", "nvmlEventTypeClock"),
)

# on_event(gpu or None when the handle is unknown, event type label, event data)
EventCallback = Callable[["Gpu | None", str, int], None]


def handle_key(handle) -> int:
    """Identity of an NVML device handle. Event data carries a fresh ctypes
    pointer to the same device, so compare addresses, not Python objects."""
    if isinstance(handle, ctypes._Pointer):
        return ctypes.cast(handle, ctypes.c_void_p).value or 0
    return id(handle)


class EventWatcher:
    def __init__(self, nvml, gpus: list[Gpu], on_event: EventCallback, wait_ms: int = 500):
        self.nvml = nvml
        self.gpus = gpus
        self.on_event = on_event
        self.wait_ms = wait_ms
        self.registered: dict[int, list[str]] = {}     # gpu index -> event type labels
        self._types = [(label, int(getattr(nvml, const)))
                       for label, const in EVENT_TYPES if getattr(nvml, const, None)]
        self._by_handle = {handle_key(g.handle): g for g in gpus if g.handle is not None}
        self._set = None
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._logged_errors: set[int | None] = set()

    def _register(self, gpu: Gpu) -> list[str]:
        nvml = self.nvml
        try:
            supported = read(nvml, "nvmlDeviceGetSupportedEventTypes", gpu.handle)
        except GpuLost:
            return []
        wanted = [(label, bit) for label, bit in self._types
                  if supported is None or supported & bit]
        mask = 0
        for _, bit in wanted:
            mask |= bit
        if not mask:
            return []
        try:
            nvml.nvmlDeviceRegisterEvents(gpu.handle, mask, self._set)
            return [label for label, _ in wanted]
        except nvml.NVMLError:
            pass
        # One refused type refuses the whole mask: fall back to one at a time.
        labels = []
        for label, bit in wanted:
            try:
                nvml.nvmlDeviceRegisterEvents(gpu.handle, bit, self._set)
                labels.append(label)
            except nvml.NVMLError as exc:
                log.info("GPU %d: %s events not available: %s", gpu.index, label, exc)
        return labels

    def start(self) -> EventWatcher:
        if self._thread is not None:
            return self
        try:
            self._set = self.nvml.nvmlEventSetCreate()
        except self.nvml.NVMLError as exc:
            log.warning("NVML events unavailable, XIDs will not be counted: %s", exc)
            return self
        for gpu in self.gpus:
            if gpu.handle is not None:
                self.registered[gpu.index] = self._register(gpu)
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="nvml-events", daemon=True)
        self._thread.start()
        return self

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def _run(self) -> None:
        nvml = self.nvml
        while not self._stop.is_set():
            try:
                data = nvml.nvmlEventSetWait_v2(self._set, self.wait_ms)
            except nvml.NVMLError as exc:
                if is_error(nvml, exc, "NVML_ERROR_TIMEOUT"):
                    continue
                code = error_code(exc)
                if code not in self._logged_errors:
                    self._logged_errors.add(code)
                    log.warning("waiting for NVML events: %s", exc)
                # back off so a persistent error (a lost GPU) never spins a CPU
                self._stop.wait(self.wait_ms / 1000.0)
                continue
            try:
                self._dispatch(data)
            except Exception:  # a bad event must not end event collection
                log.exception("handling NVML event")

    def _dispatch(self, data) -> None:
        gpu = self._by_handle.get(handle_key(data.device))
        for label, bit in self._types:
            if data.eventType & bit:
                self.on_event(gpu, label, int(data.eventData))

    def stop(self) -> bool:
        """Stop and join the thread; False if it is stuck inside NVML."""
        self._stop.set()
        thread, self._thread = self._thread, None
        if thread is not None:
            thread.join(timeout=self.wait_ms / 1000.0 * 4 + 2)
            if thread.is_alive():
                # still inside nvmlEventSetWait: freeing the set under it would
                # crash the driver library; leaking it is harmless at exit
                log.warning("NVML event thread did not stop; event set not freed")
                return False
        if self._set is not None:
            try:
                self.nvml.nvmlEventSetFree(self._set)
            except self.nvml.NVMLError as exc:
                log.debug("nvmlEventSetFree: %s", exc)
            self._set = None
        return True
