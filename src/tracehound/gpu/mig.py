"""MIG devices of a GPU in MIG mode: which GPU / compute instances exist and
what NVML tells about each.

NVML gives a MIG device its memory (used/total), but no utilization
(nvmlDeviceGetUtilizationRates answers NOT_SUPPORTED on MIG handles on every
driver seen so far); it is exported where a driver does answer. Per-instance
engine activity is a DCGM profiling field (DCGM_FI_PROF_GR_ENGINE_ACTIVE),
not an NVML one.
"""
from __future__ import annotations

from dataclasses import dataclass

from .nvml import read, text


@dataclass
class MigDevice:
    gpu_instance: int
    compute_instance: int
    uuid: str
    memory_used_bytes: int | None = None
    memory_total_bytes: int | None = None
    utilization: float | None = None

    @property
    def labels(self) -> dict[str, str]:
        return {"gpu_instance": str(self.gpu_instance),
                "compute_instance": str(self.compute_instance), "mig_uuid": self.uuid}


def mig_enabled(nvml, handle) -> bool | None:
    """Current MIG mode; None on GPUs without MIG."""
    mode = read(nvml, "nvmlDeviceGetMigMode", handle)
    if mode is None:
        return None
    return mode[0] == getattr(nvml, "NVML_DEVICE_MIG_ENABLE", 1)


def mig_devices(nvml, handle) -> list[MigDevice]:
    """Every MIG device that exists now (slots without one are skipped); the
    count is bounded by nvmlDeviceGetMaxMigDeviceCount (7 on an H100)."""
    out = []
    for i in range(read(nvml, "nvmlDeviceGetMaxMigDeviceCount", handle) or 0):
        mh = read(nvml, "nvmlDeviceGetMigDeviceHandleByIndex", handle, i)
        if mh is None:
            continue    # NOT_FOUND: no MIG device in this slot
        gi = read(nvml, "nvmlDeviceGetGpuInstanceId", mh)
        ci = read(nvml, "nvmlDeviceGetComputeInstanceId", mh)
        if gi is None or ci is None:
            continue
        dev = MigDevice(int(gi), int(ci), text(read(nvml, "nvmlDeviceGetUUID", mh) or "unknown"))
        mem = read(nvml, "nvmlDeviceGetMemoryInfo", mh)
        if mem is not None:
            dev.memory_used_bytes, dev.memory_total_bytes = int(mem.used), int(mem.total)
        util = read(nvml, "nvmlDeviceGetUtilizationRates", mh)
        if util is not None:
            dev.utilization = util.gpu / 100.0
        out.append(dev)
    return out
