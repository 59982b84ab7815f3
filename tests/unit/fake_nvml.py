"""Test double of the NVML API surface the GPU collector uses.

`FakeNvml` stands in for the `pynvml` module of nvidia-ml-py: the same
function names and argument order, the same constant names and values, and
the same NVMLError semantics (NVMLError(code) builds the per-code subclass,
`.value` holds the code, an unanswerable query raises instead of returning).
It simulates nothing: every value comes from the FakeGpu a test configures,
and a value left as None answers NVML_ERROR_NOT_SUPPORTED, as a GPU without
that feature does. test_fake_nvml_matches_binding checks the names and
constants against the installed nvidia-ml-py.
"""
from __future__ import annotations

import queue
import threading
from collections import Counter
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import ClassVar

from .fake_nvml_more import MoreNvml

NVML_SUCCESS = 0
NVML_ERROR_UNINITIALIZED = 1
NVML_ERROR_INVALID_ARGUMENT = 2
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_NO_PERMISSION = 4
NVML_ERROR_NOT_FOUND = 6
NVML_ERROR_DRIVER_NOT_LOADED = 9
NVML_ERROR_TIMEOUT = 10
NVML_ERROR_LIBRARY_NOT_FOUND = 12
NVML_ERROR_FUNCTION_NOT_FOUND = 13
NVML_ERROR_GPU_IS_LOST = 15
NVML_ERROR_LIB_RM_VERSION_MISMATCH = 18
NVML_ERROR_UNKNOWN = 999

NVML_FEATURE_DISABLED = 0
NVML_FEATURE_ENABLED = 1
NVML_TEMPERATURE_GPU = 0
NVML_CLOCK_GRAPHICS = 0
NVML_CLOCK_SM = 1
NVML_CLOCK_MEM = 2
NVML_MEMORY_ERROR_TYPE_CORRECTED = 0
NVML_MEMORY_ERROR_TYPE_UNCORRECTED = 1
NVML_VOLATILE_ECC = 0
NVML_AGGREGATE_ECC = 1
NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS = 0
NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR = 1
NVML_NVLINK_MAX_LINKS = 36
NVML_NVLINK_ERROR_DL_REPLAY = 0
NVML_NVLINK_ERROR_DL_RECOVERY = 1
NVML_NVLINK_ERROR_DL_CRC_FLIT = 2
NVML_NVLINK_ERROR_DL_CRC_DATA = 3
NVML_NVLINK_ERROR_DL_ECC_DATA = 4
NVML_FI_DEV_MEMORY_TEMP = 82
NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX = 138
NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX = 139
NVML_FI_DEV_NVLINK_THROUGHPUT_RAW_TX = 140
NVML_FI_DEV_NVLINK_THROUGHPUT_RAW_RX = 141
NVML_DEVICE_MIG_DISABLE = 0
NVML_DEVICE_MIG_ENABLE = 1
NVML_VALUE_TYPE_DOUBLE = 0
NVML_VALUE_TYPE_UNSIGNED_INT = 1
NVML_VALUE_TYPE_UNSIGNED_LONG = 2
NVML_VALUE_TYPE_UNSIGNED_LONG_LONG = 3
NVML_VALUE_TYPE_SIGNED_LONG_LONG = 4
NVML_VALUE_TYPE_SIGNED_INT = 5
NVML_VALUE_TYPE_UNSIGNED_SHORT = 6

nvmlEventTypeSingleBitEccError = 0x1
nvmlEventTypeDoubleBitEccError = 0x2
nvmlEventTypePState = 0x4
nvmlEventTypeXidCriticalError = 0x8
nvmlEventTypeClock = 0x10
nvmlEventTypePowerSourceChange = 0x80

nvmlClocksEventReasonGpuIdle = 0x1
nvmlClocksEventReasonApplicationsClocksSetting = 0x2
nvmlClocksEventReasonSwPowerCap = 0x4
nvmlClocksEventReasonHwSlowdown = 0x8
nvmlClocksEventReasonSyncBoost = 0x10
nvmlClocksEventReasonSwThermalSlowdown = 0x20
nvmlClocksEventReasonHwThermalSlowdown = 0x40
nvmlClocksEventReasonHwPowerBrakeSlowdown = 0x80
nvmlClocksEventReasonDisplayClockSetting = 0x100
nvmlClocksThrottleReasonBoardLimit = 0x200
nvmlClocksThrottleReasonReliability = 0x400

CONSTANTS = {k: v for k, v in dict(globals()).items()
             if k.startswith(("NVML_", "nvmlEventType", "nvmlClocks")) and isinstance(v, int)}


class NVMLError(Exception):
    """As in nvidia-ml-py: NVMLError(code) returns the subclass for that code."""
    _valClassMapping: ClassVar[dict] = {}

    def __new__(cls, value):
        target = NVMLError._valClassMapping.get(value, cls) if cls is NVMLError else cls
        obj = Exception.__new__(target)
        obj.value = value
        return obj

    def __init__(self, value):
        super().__init__(value)

    def __str__(self):
        names = {v: k for k, v in CONSTANTS.items() if k.startswith("NVML_ERROR_")}
        return names.get(self.value, f"NVML Error with code {self.value}")

    def __eq__(self, other):
        return isinstance(other, NVMLError) and self.value == other.value

    __hash__ = Exception.__hash__


for _name, _code in CONSTANTS.items():
    if _name.startswith("NVML_ERROR_"):
        _cls_name = "NVMLError_" + "".join(w.title() for w in _name[len("NVML_ERROR_"):].split("_"))
        NVMLError._valClassMapping[_code] = type(_cls_name, (NVMLError,), {})


@dataclass
class FakeGpu:
    uuid: str = "GPU-00000000-0000-0000-0000-000000000000"
    name: str = "NVIDIA H100 80GB HBM3"
    pci_bus_id: str = "00000000:3B:00.0"
    temperature: int | None = 40
    memory_temperature: int | None = 45
    power_mw: int | None = 120_000
    power_limit_mw: int | None = 700_000
    clocks_mhz: dict | None = field(default_factory=lambda: {NVML_CLOCK_SM: 1980, NVML_CLOCK_MEM: 2619})
    clock_reasons: int | None = 0
    utilization: tuple | None = (50, 20)            # (gpu %, memory %)
    memory: tuple | None = (4 << 30, 80 << 30)      # (used, total) bytes
    ecc: dict | None = field(default_factory=dict)  # (error type, counter type) -> count
    retired_pages: dict | None = None               # cause -> [page addresses]
    retired_pending: int | None = None
    remapped_rows: tuple | None = (0, 0, 0, 0)      # (corr, unc, pending, failure)
    pcie_replays: int | None = 0
    nvlinks: dict = field(default_factory=dict)     # link -> {counter: value}
    compute_procs: list = field(default_factory=list)   # [(pid, used bytes or None)]
    graphics_procs: list = field(default_factory=list)
    cpu_affinity: list | None = None                # words of a CPU bitmap
    supported_events: int = 0x1F
    errors: dict = field(default_factory=dict)      # function name -> NVML error code
    lost: bool = False
    nvlinks_down: set = field(default_factory=set)  # links answering NVML_FEATURE_DISABLED
    nvlink_kib: dict = field(default_factory=dict)  # (link, throughput field id) -> KiB
    mig_mode: tuple | None = None                   # (current, pending); None: no MIG
    mig: dict = field(default_factory=dict)         # slot -> FakeGpu of a MIG device
    instance_ids: tuple | None = None               # (GPU instance, compute instance) of a MIG device
    process_util: list | None = None                # [(pid, timestamp us, sm %)]; None: unsupported
    power_constraints_mw: tuple | None = (200_000, 700_000)
    locked_clocks: dict = field(default_factory=dict)   # "gpu"/"memory" -> (min, max) MHz
    supported_clocks: dict = field(default_factory=lambda: {2619: [1980, 1755, 1410, 345]})


class FakeHandle:
    def __init__(self, gpu: FakeGpu):
        self.gpu = gpu


class FakeNvml(MoreNvml):
    NVMLError = NVMLError

    def __init__(self, gpus=(), init_error: int | None = None, driver: str = "550.54.15",
                 event_set_error: int | None = None):
        self.gpus = list(gpus)
        self.handles = [FakeHandle(g) for g in self.gpus]
        self.init_error = init_error
        self.event_set_error = event_set_error
        self.driver = driver
        self.calls: Counter = Counter()
        self.initialized = 0
        self.shutdowns = 0
        self.registered: dict[int, int] = {}   # gpu index -> event mask
        self.freed_sets = 0
        self.wait_errors: list[int] = []       # codes nvmlEventSetWait_v2 raises next
        self._events: queue.Queue = queue.Queue()
        self._lock = threading.Lock()

    # -- test controls -------------------------------------------------------

    def queue_event(self, index: int, event_type: int, data: int = 0) -> bool:
        """Deliver an event the way the driver would: only if registered."""
        if not self.registered.get(index, 0) & event_type:
            return False
        self._events.put(SimpleNamespace(device=self.handles[index], eventType=event_type,
                                         eventData=data, gpuInstanceId=0, computeInstanceId=0))
        return True

    def pending_events(self) -> int:
        return self._events.qsize()

    def _dev(self, func: str, handle: FakeHandle) -> FakeGpu:
        with self._lock:
            self.calls[func] += 1
        gpu = handle.gpu
        if gpu.lost:
            raise NVMLError(NVML_ERROR_GPU_IS_LOST)
        if func in gpu.errors:
            raise NVMLError(gpu.errors[func])
        return gpu

    @staticmethod
    def _have(value):
        if value is None:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        return value

    # -- library ---------------------------------------------------------------

    def nvmlInit(self):
        if self.init_error is not None:
            raise NVMLError(self.init_error)
        self.initialized += 1

    def nvmlShutdown(self):
        if self.initialized <= self.shutdowns:
            raise NVMLError(NVML_ERROR_UNINITIALIZED)
        self.shutdowns += 1

    def nvmlSystemGetDriverVersion(self):
        return self.driver

    def nvmlDeviceGetCount(self):
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index):
        if not 0 <= index < len(self.gpus):
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        return self.handles[index]

    # -- identity and topology ---------------------------------------------

    def nvmlDeviceGetUUID(self, h):
        return self._dev("nvmlDeviceGetUUID", h).uuid

    def nvmlDeviceGetName(self, h):
        return self._dev("nvmlDeviceGetName", h).name

    def nvmlDeviceGetPciInfo(self, h):
        gpu = self._dev("nvmlDeviceGetPciInfo", h)
        # the real structure's busId is a char array: bytes, not str
        return SimpleNamespace(busId=gpu.pci_bus_id.encode(), busIdLegacy=gpu.pci_bus_id.encode())

    def nvmlDeviceGetCpuAffinity(self, h, cpu_set_size):
        words = self._have(self._dev("nvmlDeviceGetCpuAffinity", h).cpu_affinity)
        return (list(words) + [0] * cpu_set_size)[:cpu_set_size]

    # -- health fields -----------------------------------------------------

    def nvmlDeviceGetTemperature(self, h, sensor):
        if sensor != NVML_TEMPERATURE_GPU:
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        return self._have(self._dev("nvmlDeviceGetTemperature", h).temperature)

    def nvmlDeviceGetFieldValues(self, h, field_ids):
        gpu = self._dev("nvmlDeviceGetFieldValues", h)
        out = []
        for fid in field_ids:
            # as in the binding: an id, or (id, scope id), the scope being a link
            fid, scope = fid if isinstance(fid, tuple) else (fid, 0)
            if fid == NVML_FI_DEV_MEMORY_TEMP:
                v, vtype = gpu.memory_temperature, NVML_VALUE_TYPE_UNSIGNED_INT
            else:
                v, vtype = gpu.nvlink_kib.get((scope, fid)), NVML_VALUE_TYPE_UNSIGNED_LONG_LONG
            out.append(SimpleNamespace(
                fieldId=fid, scopeId=scope, timestamp=0, latencyUsec=0, valueType=vtype,
                nvmlReturn=NVML_SUCCESS if v is not None else NVML_ERROR_NOT_SUPPORTED,
                value=SimpleNamespace(uiVal=v or 0, ullVal=v or 0, dVal=float(v or 0))))
        return out

    def nvmlDeviceGetPowerUsage(self, h):
        return self._have(self._dev("nvmlDeviceGetPowerUsage", h).power_mw)

    def nvmlDeviceGetEnforcedPowerLimit(self, h):
        return self._have(self._dev("nvmlDeviceGetEnforcedPowerLimit", h).power_limit_mw)

    def nvmlDeviceGetClockInfo(self, h, clock_type):
        clocks = self._have(self._dev("nvmlDeviceGetClockInfo", h).clocks_mhz)
        return self._have(clocks.get(clock_type))

    def nvmlDeviceGetCurrentClocksEventReasons(self, h):
        return self._have(self._dev("nvmlDeviceGetCurrentClocksEventReasons", h).clock_reasons)

    def nvmlDeviceGetCurrentClocksThrottleReasons(self, h):
        return self._have(self._dev("nvmlDeviceGetCurrentClocksThrottleReasons", h).clock_reasons)

    def nvmlDeviceGetUtilizationRates(self, h):
        gpu_pct, mem_pct = self._have(self._dev("nvmlDeviceGetUtilizationRates", h).utilization)
        return SimpleNamespace(gpu=gpu_pct, memory=mem_pct)

    def nvmlDeviceGetMemoryInfo(self, h, version=None):
        used, total = self._have(self._dev("nvmlDeviceGetMemoryInfo", h).memory)
        return SimpleNamespace(total=total, used=used, free=total - used)

    def nvmlDeviceGetTotalEccErrors(self, h, error_type, counter_type):
        ecc = self._have(self._dev("nvmlDeviceGetTotalEccErrors", h).ecc)
        return self._have(ecc.get((error_type, counter_type)))

    def nvmlDeviceGetRetiredPages(self, h, cause):
        pages = self._have(self._dev("nvmlDeviceGetRetiredPages", h).retired_pages)
        return list(pages.get(cause, []))

    def nvmlDeviceGetRetiredPagesPendingStatus(self, h):
        return self._have(self._dev("nvmlDeviceGetRetiredPagesPendingStatus", h).retired_pending)

    def nvmlDeviceGetRemappedRows(self, h):
        return self._have(self._dev("nvmlDeviceGetRemappedRows", h).remapped_rows)

    def nvmlDeviceGetPcieReplayCounter(self, h):
        return self._have(self._dev("nvmlDeviceGetPcieReplayCounter", h).pcie_replays)

    def nvmlDeviceGetNvLinkState(self, h, link):
        gpu = self._dev("nvmlDeviceGetNvLinkState", h)
        if not gpu.nvlinks:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        if link not in gpu.nvlinks:
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        return NVML_FEATURE_DISABLED if link in gpu.nvlinks_down else NVML_FEATURE_ENABLED

    def nvmlDeviceGetNvLinkErrorCounter(self, h, link, counter):
        gpu = self._dev("nvmlDeviceGetNvLinkErrorCounter", h)
        if link not in gpu.nvlinks:
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        return self._have(gpu.nvlinks[link].get(counter))

    def _procs(self, procs):
        return [SimpleNamespace(pid=pid, usedGpuMemory=used, gpuInstanceId=0xFFFFFFFF,
                                computeInstanceId=0xFFFFFFFF) for pid, used in procs]

    def nvmlDeviceGetComputeRunningProcesses(self, h):
        return self._procs(self._dev("nvmlDeviceGetComputeRunningProcesses", h).compute_procs)

    def nvmlDeviceGetGraphicsRunningProcesses(self, h):
        return self._procs(self._dev("nvmlDeviceGetGraphicsRunningProcesses", h).graphics_procs)

    # -- events ------------------------------------------------------------

    def nvmlEventSetCreate(self):
        if self.event_set_error is not None:
            raise NVMLError(self.event_set_error)
        return object()

    def nvmlDeviceGetSupportedEventTypes(self, h):
        return self._dev("nvmlDeviceGetSupportedEventTypes", h).supported_events

    def nvmlDeviceRegisterEvents(self, h, event_types, event_set):
        gpu = self._dev("nvmlDeviceRegisterEvents", h)
        if event_types & ~gpu.supported_events:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        index = self.handles.index(h)
        self.registered[index] = self.registered.get(index, 0) | event_types

    def nvmlEventSetWait_v2(self, event_set, timeoutms):
        with self._lock:
            self.calls["nvmlEventSetWait_v2"] += 1
            if self.wait_errors:
                raise NVMLError(self.wait_errors.pop(0))
        try:
            return self._events.get(timeout=timeoutms / 1000.0)
        except queue.Empty:
            raise NVMLError(NVML_ERROR_TIMEOUT) from None

    def nvmlEventSetFree(self, event_set):
        self.freed_sets += 1


for _name, _value in CONSTANTS.items():
    setattr(FakeNvml, _name, _value)
