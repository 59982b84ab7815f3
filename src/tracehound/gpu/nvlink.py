"""NVLink per-link state and traffic, beside the error counters in device.py.

Traffic comes from the field values NVML_FI_DEV_NVLINK_THROUGHPUT_* with the
link as scope id (KiB counters since driver load): the older
nvmlDeviceGetNvLinkUtilizationCounter needs a counter set up by a privileged
nvmlDeviceSetNvLinkUtilizationControl and is deprecated, so it is not used.
"""
from __future__ import annotations

from .nvml import GpuLost, read

# (direction label, traffic label, field id name)
THROUGHPUT_FIELDS = (
    ("tx", "data", "NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX"),
    ("rx", "data", "NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX"),
    ("tx", "raw", "NVML_FI_DEV_NVLINK_THROUGHPUT_RAW_TX"),
    ("rx", "raw", "NVML_FI_DEV_NVLINK_THROUGHPUT_RAW_RX"),
)


def link_states(nvml, handle, links: list[int]) -> dict[int, bool] | None:
    """link -> active; None when NVML answers for none of the links."""
    enabled = getattr(nvml, "NVML_FEATURE_ENABLED", 1)
    out = {}
    for link in links:
        state = read(nvml, "nvmlDeviceGetNvLinkState", handle, link)
        if state is not None:
            out[link] = state == enabled
    return out or None


def link_traffic(nvml, handle, links: list[int]) -> dict[tuple[int, str, str], int]:
    """(link, direction, traffic) -> bytes since driver load, in one
    nvmlDeviceGetFieldValues call for every link and field."""
    wanted = [(link, d, t, getattr(nvml, name)) for link in links
              for d, t, name in THROUGHPUT_FIELDS if getattr(nvml, name, None) is not None]
    if not wanted:
        return {}
    values = read(nvml, "nvmlDeviceGetFieldValues", handle,
                  [(fid, link) for link, _, _, fid in wanted])
    out = {}
    lost = getattr(nvml, "NVML_ERROR_GPU_IS_LOST", None)
    for (link, d, t, _), v in zip(wanted, values or ()):
        if v.nvmlReturn == lost:
            raise GpuLost("NVLink throughput")
        if v.nvmlReturn == nvml.NVML_SUCCESS:
            out[(link, d, t)] = int(v.value.ullVal) * 1024
    return out
