"""GPUs as NVML enumerates them, and one read of a GPU's health fields."""
from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass, field

from ..host.topology import Topology, cpus_from_mask_words, normalize_pci_bus_id
from .mig import MigDevice, mig_devices, mig_enabled
from .nvml import GpuLost, error_code, field_value, is_error, read, text
from .nvlink import link_states, link_traffic

log = logging.getLogger(__name__)

# (type label, NVML memory error type, scope label, NVML ECC counter type)
ECC_KINDS = tuple(
    (etype, econst, scope, sconst)
    for etype, econst in (("corrected", "NVML_MEMORY_ERROR_TYPE_CORRECTED"),
                          ("uncorrected", "NVML_MEMORY_ERROR_TYPE_UNCORRECTED"))
    for scope, sconst in (("volatile", "NVML_VOLATILE_ECC"), ("aggregate", "NVML_AGGREGATE_ECC"))
)
RETIREMENT_CAUSES = (
    ("single_bit_ecc", "NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS"),
    ("double_bit_ecc", "NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR"),
)
NVLINK_COUNTERS = (
    ("replay", "NVML_NVLINK_ERROR_DL_REPLAY"),
    ("recovery", "NVML_NVLINK_ERROR_DL_RECOVERY"),
    ("crc_flit", "NVML_NVLINK_ERROR_DL_CRC_FLIT"),
    ("crc_data", "NVML_NVLINK_ERROR_DL_CRC_DATA"),
    ("ecc_data", "NVML_NVLINK_ERROR_DL_ECC_DATA"),
)
CLOCKS = (("sm", "NVML_CLOCK_SM"), ("memory", "NVML_CLOCK_MEM"))
# per-process SM utilization is the mean of NVML's samples this recent; a
# fixed window (not "since my last read") lets a scrape and the detector read
# the same GPU without taking each other's samples
PROCESS_UTIL_WINDOW_S = 10.0


@dataclass
class Gpu:
    """A GPU's identity, fixed for the collector's lifetime."""
    index: int
    handle: object
    uuid: str
    model: str
    pci_bus_id: str = ""
    numa_node: int | None = None
    nvlinks: list[int] | None = None    # link numbers, found on the first read

    @property
    def labels(self) -> dict[str, str]:
        return {"gpu": str(self.index), "uuid": self.uuid, "model": self.model}


@dataclass
class GpuSample:
    """Everything one scrape read from one GPU; a field NVML refused stays empty."""
    temperature_c: dict[str, float] = field(default_factory=dict)       # sensor ->
    power_w: float | None = None
    power_limit_w: float | None = None
    clocks_hz: dict[str, float] = field(default_factory=dict)           # clock ->
    clock_reasons: int | None = None                                    # NVML bitmask
    utilization: dict[str, float] = field(default_factory=dict)         # engine -> ratio
    memory_used_bytes: int | None = None
    memory_total_bytes: int | None = None
    ecc: dict[tuple[str, str], int] = field(default_factory=dict)       # (type, scope) ->
    retired_pages: dict[str, int] = field(default_factory=dict)         # cause ->
    retired_pages_pending: int | None = None
    remapped_rows: dict[str, int] = field(default_factory=dict)         # type ->
    row_remap_pending: int | None = None
    row_remap_failure: int | None = None
    pcie_replays: int | None = None
    nvlink_errors: dict[tuple[int, str], int] = field(default_factory=dict)   # (link, type) ->
    processes: dict[int, int | None] = field(default_factory=dict)     # pid -> used bytes
    # link -> active; a link NVML did not answer for is absent (unknown, not
    # down); None: no NVLink, or no link answered
    nvlink_up: dict[int, bool] | None = None
    nvlink_bytes: dict[tuple[int, str, str], int] = field(default_factory=dict)  # (link, dir, traffic)
    mig_enabled: bool | None = None
    mig_devices: list[MigDevice] = field(default_factory=list)
    # pid -> SM busy ratio; None: NVML gives no per-process utilization here
    process_sm: dict[int, float] | None = None

    def uncorrected_ecc(self) -> int | None:
        """Volatile count where the GPU keeps one (it moves first), else aggregate."""
        for scope in ("volatile", "aggregate"):
            v = self.ecc.get(("uncorrected", scope))
            if v is not None:
                return v
        return None


def _const(nvml, name: str):
    return getattr(nvml, name, None)


def _gpu_numa_node(nvml, handle, bus_id: str, topo: Topology) -> int | None:
    node = topo.pci_numa_node(bus_id) if bus_id else None
    if node is not None:
        return node
    # sysfs says nothing (numa_node -1, or a container without /sys/bus/pci):
    # NVML's ideal CPU set names the node when it lies on exactly one.
    n_cpus = max(topo.cpu_nodes(), default=(os.cpu_count() or 1) - 1) + 1
    words = read(nvml, "nvmlDeviceGetCpuAffinity", handle, (n_cpus + 63) // 64)
    if words is None:
        return None
    nodes = topo.numa_nodes_of_cpus(cpus_from_mask_words(words))
    return nodes.pop() if len(nodes) == 1 else None


def enumerate_gpus(nvml, topo: Topology) -> tuple[list[Gpu], list[Gpu]]:
    """(GPUs answering, GPUs already lost at start-up)."""
    gpus, lost = [], []
    for index in range(nvml.nvmlDeviceGetCount()):
        try:
            handle = nvml.nvmlDeviceGetHandleByIndex(index)
        except nvml.NVMLError as exc:
            if is_error(nvml, exc, "NVML_ERROR_GPU_IS_LOST"):
                lost.append(Gpu(index, None, "unknown", "unknown"))
            else:
                # e.g. a device the agent's cgroup may not open: not ours to watch
                log.warning("GPU %d skipped: %s", index, exc)
            continue
        try:
            uuid = text(read(nvml, "nvmlDeviceGetUUID", handle) or "unknown")
            model = text(read(nvml, "nvmlDeviceGetName", handle) or "unknown")
            pci = read(nvml, "nvmlDeviceGetPciInfo", handle)
            bus_id = normalize_pci_bus_id(pci.busId) if pci is not None else ""
            node = _gpu_numa_node(nvml, handle, bus_id, topo)
        except GpuLost:
            lost.append(Gpu(index, handle, "unknown", "unknown"))
            continue
        gpus.append(Gpu(index, handle, uuid, model, bus_id, node))
    return gpus, lost


def _discover_nvlinks(nvml, handle) -> list[int]:
    links = []
    for link in range(int(getattr(nvml, "NVML_NVLINK_MAX_LINKS", 0))):
        # links are numbered densely: the first that does not answer ends the list
        if read(nvml, "nvmlDeviceGetNvLinkState", handle, link) is None:
            break
        links.append(link)
    return links


def running_processes(nvml, handle) -> dict[int, int | None]:
    out: dict[int, int | None] = {}
    for func in ("nvmlDeviceGetComputeRunningProcesses", "nvmlDeviceGetGraphicsRunningProcesses"):
        for p in read(nvml, func, handle) or ():
            used = getattr(p, "usedGpuMemory", None)
            prev = out.get(p.pid)
            out[p.pid] = used if prev is None else max(prev, used or 0)
    return out


def process_sm_utilization(nvml, handle, now: float | None = None) -> dict[int, float] | None:
    """pid -> mean SM utilization (0..1) over the last PROCESS_UTIL_WINDOW_S;
    {} when no process ran a kernel in it (NOT_FOUND), None when the GPU or
    the binding has no per-process utilization."""
    fn = getattr(nvml, "nvmlDeviceGetProcessUtilization", None)
    if fn is None:
        return None
    since = int(((time.time() if now is None else now) - PROCESS_UTIL_WINDOW_S) * 1e6)
    try:
        samples = fn(handle, since)
    except nvml.NVMLError as exc:
        if is_error(nvml, exc, "NVML_ERROR_GPU_IS_LOST"):
            raise GpuLost("nvmlDeviceGetProcessUtilization") from None
        # NOT_FOUND: no sample newer than `since`; the binding raises
        # NVML_SUCCESS itself when the first call finds nothing to size
        if is_error(nvml, exc, "NVML_ERROR_NOT_FOUND") or error_code(exc) == 0:
            return {}
        return None
    per_pid: dict[int, list[int]] = {}
    for sample in samples:
        if sample.timeStamp >= since:
            per_pid.setdefault(int(sample.pid), []).append(int(sample.smUtil))
    return {pid: sum(v) / len(v) / 100.0 for pid, v in per_pid.items()}


def read_sample(nvml, gpu: Gpu) -> GpuSample:
    """Read every health field of one GPU. Raises GpuLost; the caller drops
    the partial sample so a vanishing GPU never exports half a scrape."""
    h = gpu.handle
    if h is None:
        raise GpuLost("no handle")
    s = GpuSample()

    t = read(nvml, "nvmlDeviceGetTemperature", h, _const(nvml, "NVML_TEMPERATURE_GPU"))
    if t is None:
        # bindings for CUDA 14 drop the unversioned call
        t = read(nvml, "nvmlDeviceGetTemperatureV", h, _const(nvml, "NVML_TEMPERATURE_GPU"))
    if t is not None:
        s.temperature_c["gpu"] = float(t)
    t = field_value(nvml, h, "NVML_FI_DEV_MEMORY_TEMP")
    if t is not None:
        s.temperature_c["memory"] = float(t)

    mw = read(nvml, "nvmlDeviceGetPowerUsage", h)
    s.power_w = mw / 1000.0 if mw is not None else None
    mw = read(nvml, "nvmlDeviceGetEnforcedPowerLimit", h)
    s.power_limit_w = mw / 1000.0 if mw is not None else None

    for label, const in CLOCKS:
        mhz = read(nvml, "nvmlDeviceGetClockInfo", h, _const(nvml, const))
        if mhz is not None:
            s.clocks_hz[label] = mhz * 1e6
    s.clock_reasons = read(nvml, "nvmlDeviceGetCurrentClocksEventReasons", h)
    if s.clock_reasons is None:
        s.clock_reasons = read(nvml, "nvmlDeviceGetCurrentClocksThrottleReasons", h)

    util = read(nvml, "nvmlDeviceGetUtilizationRates", h)
    if util is not None:
        s.utilization = {"gpu": util.gpu / 100.0, "memory": util.memory / 100.0}
    mem = read(nvml, "nvmlDeviceGetMemoryInfo", h)
    if mem is not None:
        s.memory_used_bytes, s.memory_total_bytes = int(mem.used), int(mem.total)

    for etype, econst, scope, sconst in ECC_KINDS:
        v = read(nvml, "nvmlDeviceGetTotalEccErrors", h, _const(nvml, econst), _const(nvml, sconst))
        if v is not None:
            s.ecc[(etype, scope)] = int(v)
    for cause, const in RETIREMENT_CAUSES:
        pages = read(nvml, "nvmlDeviceGetRetiredPages", h, _const(nvml, const))
        if pages is not None:
            s.retired_pages[cause] = len(pages)
    pending = read(nvml, "nvmlDeviceGetRetiredPagesPendingStatus", h)
    s.retired_pages_pending = None if pending is None else int(bool(pending))
    rows = read(nvml, "nvmlDeviceGetRemappedRows", h)
    if rows is not None:
        corr, unc, pending, failure = rows
        s.remapped_rows = {"correctable": int(corr), "uncorrectable": int(unc)}
        s.row_remap_pending, s.row_remap_failure = int(bool(pending)), int(bool(failure))

    s.pcie_replays = read(nvml, "nvmlDeviceGetPcieReplayCounter", h)
    if gpu.nvlinks is None:
        gpu.nvlinks = _discover_nvlinks(nvml, h)
    for link in gpu.nvlinks:
        for label, const in NVLINK_COUNTERS:
            counter = _const(nvml, const)
            if counter is None:
                continue
            v = read(nvml, "nvmlDeviceGetNvLinkErrorCounter", h, link, counter)
            if v is not None:
                s.nvlink_errors[(link, label)] = int(v)
    if gpu.nvlinks:
        s.nvlink_up = link_states(nvml, h, gpu.nvlinks)
        s.nvlink_bytes = link_traffic(nvml, h, gpu.nvlinks)

    s.mig_enabled = mig_enabled(nvml, h)
    if s.mig_enabled:
        s.mig_devices = mig_devices(nvml, h)
    s.processes = running_processes(nvml, h)
    s.process_sm = process_sm_utilization(nvml, h)
    return s
