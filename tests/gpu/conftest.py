"""GPU tier: the collector against a real NVIDIA GPU, driver and nvidia-smi."""
import os

import pytest

from tests.unit.gpu_helpers import open_collector

_GPU_DIR = os.path.join("tests", "gpu")
_reason = None


def gpu_unavailable_reason() -> str:
    """"" when NVML opens and lists at least one GPU (or nvidia-ml-py is
    missing: a failure, not a skip), else why not."""
    global _reason
    if _reason is None:
        try:
            import pynvml
        except ImportError:
            # a core dependency: without it the install is broken, which the
            # tests then say (they fail importing it), never "no GPU"
            _reason = ""
            return _reason
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError as exc:
            _reason = f"no usable NVIDIA driver: NVML says {exc}"
            return _reason
        try:
            count = pynvml.nvmlDeviceGetCount()
        finally:
            pynvml.nvmlShutdown()
        _reason = "" if count else "NVML found no NVIDIA GPU"
    return _reason


def pytest_collection_modifyitems(config, items):
    for item in items:
        if _GPU_DIR in str(item.fspath):
            item.add_marker(pytest.mark.gpu)
            reason = gpu_unavailable_reason()
            if reason:
                item.add_marker(pytest.mark.skip(reason=f"needs an NVIDIA GPU: {reason}"))


@pytest.fixture
def collector():
    col, reason = open_collector()      # wired as the gpu subsystem wires it
    if col is None:
        pytest.fail(f"NVML opened in conftest but the collector did not: {reason}")
    try:
        yield col
    finally:
        col.close()
