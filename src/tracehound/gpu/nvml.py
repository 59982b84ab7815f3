"""Loading NVML and calling it with the error policy the collector needs.

Every function here takes the NVML module as an argument (the `pynvml` module
of nvidia-ml-py in production, a test double in unit tests) and reaches
constants and NVMLError through it, never through a global import.
"""
from __future__ import annotations

import logging

log = logging.getLogger(__name__)

# Clock-event ("throttle") reasons: exported label -> suffix of the NVML
# bitmask constant. Newer bindings name them nvmlClocksEventReason*, older
# ones nvmlClocksThrottleReason*; both carry the same bits.
CLOCK_EVENT_REASONS = (
    ("gpu_idle", "GpuIdle"),
    ("applications_clocks_setting", "ApplicationsClocksSetting"),
    ("sw_power_cap", "SwPowerCap"),
    ("hw_slowdown", "HwSlowdown"),
    ("sync_boost", "SyncBoost"),
    ("sw_thermal_slowdown", "SwThermalSlowdown"),
    ("hw_thermal_slowdown", "HwThermalSlowdown"),
    ("hw_power_brake_slowdown", "HwPowerBrakeSlowdown"),
    ("display_clock_setting", "DisplayClockSetting"),
    ("board_limit", "BoardLimit"),
    ("reliability", "Reliability"),
)

_INIT_REASONS = {
    "NVML_ERROR_LIBRARY_NOT_FOUND": "no NVIDIA driver: libnvidia-ml.so.1 not found",
    "NVML_ERROR_DRIVER_NOT_LOADED": "NVIDIA driver not loaded (no nvidia kernel module)",
    "NVML_ERROR_NO_PERMISSION": "no permission to open the NVIDIA devices (/dev/nvidia*)",
    "NVML_ERROR_LIB_RM_VERSION_MISMATCH": "NVML library and NVIDIA kernel driver versions differ "
                                          "(driver upgraded without a reboot?)",
}


class GpuLost(Exception):
    """The GPU stopped answering (NVML_ERROR_GPU_IS_LOST): fell off the bus or needs a reset."""


def load_nvml():
    """(pynvml module, "") or (None, one-line reason)."""
    try:
        import pynvml
    except ImportError:
        return None, "pynvml is not importable: pip install nvidia-ml-py"
    return pynvml, ""


def error_code(exc: BaseException) -> int | None:
    return getattr(exc, "value", None)


def is_error(nvml, exc: BaseException, name: str) -> bool:
    code = getattr(nvml, name, None)
    return code is not None and error_code(exc) == code


def init(nvml) -> str:
    """nvmlInit; "" on success, else a one-line reason."""
    try:
        nvml.nvmlInit()
    except nvml.NVMLError as exc:
        for name, reason in _INIT_REASONS.items():
            if is_error(nvml, exc, name):
                return reason
        return f"NVML initialisation failed: {exc}"
    return ""


def shutdown(nvml) -> None:
    try:
        nvml.nvmlShutdown()
    except nvml.NVMLError as exc:
        log.debug("nvmlShutdown: %s", exc)


def read(nvml, func: str, *args):
    """Call one NVML query. A lost GPU raises GpuLost; any other NVML error
    (not supported, no permission, a binding without the function) means the
    field is absent, returned as None."""
    fn = getattr(nvml, func, None)
    if fn is None:
        return None
    try:
        return fn(*args)
    except nvml.NVMLError as exc:
        if is_error(nvml, exc, "NVML_ERROR_GPU_IS_LOST"):
            raise GpuLost(func) from None
        return None


def text(value) -> str:
    """NVML strings arrive as str or bytes depending on the binding version."""
    if isinstance(value, bytes):
        return value.decode(errors="replace").rstrip("\x00")
    return str(value)


def clock_event_reasons(nvml) -> list[tuple[str, int]]:
    out = []
    for label, suffix in CLOCK_EVENT_REASONS:
        bit = getattr(nvml, "nvmlClocksEventReason" + suffix, None)
        if bit is None:
            bit = getattr(nvml, "nvmlClocksThrottleReason" + suffix, None)
        if bit:
            out.append((label, int(bit)))
    return out


def field_value(nvml, handle, field_id_name: str):
    """One nvmlDeviceGetFieldValues entry as a number, None when unsupported."""
    field_id = getattr(nvml, field_id_name, None)
    if field_id is None:
        return None
    values = read(nvml, "nvmlDeviceGetFieldValues", handle, [field_id])
    if not values:
        return None
    v = values[0]
    if v.nvmlReturn == getattr(nvml, "NVML_ERROR_GPU_IS_LOST", None):
        raise GpuLost(field_id_name)
    if v.nvmlReturn != nvml.NVML_SUCCESS:
        return None
    member = {
        "NVML_VALUE_TYPE_DOUBLE": "dVal",
        "NVML_VALUE_TYPE_UNSIGNED_INT": "uiVal",
        "NVML_VALUE_TYPE_UNSIGNED_LONG": "ulVal",
        "NVML_VALUE_TYPE_UNSIGNED_LONG_LONG": "ullVal",
        "NVML_VALUE_TYPE_SIGNED_LONG_LONG": "sllVal",
        "NVML_VALUE_TYPE_SIGNED_INT": "siVal",
        "NVML_VALUE_TYPE_UNSIGNED_SHORT": "usVal",
    }
    for type_name, attr in member.items():
        if v.valueType == getattr(nvml, type_name, None):
            return getattr(v.value, attr)
    return None
