"""The NVML test double against the real nvidia-ml-py binding, and `doctor`'s GPU section."""
import os

import pynvml
import pytest

from tracehound.gpu import nvml as nv
from tracehound.subsystems.gpu import GpuSubsystem

from . import fake_nvml as fn
from .fake_nvml import FakeGpu, FakeNvml


def test_fake_nvml_matches_binding():
    for name, val in fn.CONSTANTS.items():
        assert getattr(pynvml, name) == val, name
    for name in dir(FakeNvml):
        if name.startswith("nvml"):
            assert hasattr(pynvml, name), f"the binding has no {name}"
    assert issubclass(FakeNvml.NVMLError, Exception)


@pytest.mark.parametrize("mod", [pynvml, fn], ids=["pynvml", "fake"])
def test_error_semantics_are_the_same(mod):
    err = mod.NVMLError(mod.NVML_ERROR_GPU_IS_LOST)
    assert type(err) is not mod.NVMLError and isinstance(err, mod.NVMLError)
    assert err.value == mod.NVML_ERROR_GPU_IS_LOST
    assert nv.is_error(mod, err, "NVML_ERROR_GPU_IS_LOST")
    assert not nv.is_error(mod, err, "NVML_ERROR_NOT_SUPPORTED")


def test_read_policy():
    nvml = FakeNvml([FakeGpu(power_mw=None, errors={"nvmlDeviceGetName": fn.NVML_ERROR_GPU_IS_LOST})])
    h = nvml.handles[0]
    assert nv.read(nvml, "nvmlDeviceGetPowerUsage", h) is None             # not supported
    assert nv.read(nvml, "nvmlDeviceGetNoSuchThing", h) is None            # older binding
    with pytest.raises(nv.GpuLost):
        nv.read(nvml, "nvmlDeviceGetName", h)


def test_real_binding_starts_or_says_why_not():
    reason = nv.init(pynvml)
    if reason:
        assert "\n" not in reason and ("driver" in reason or "NVML" in reason)
    else:
        nv.shutdown(pynvml)
        # NVML started: the kernel has a driver for it to talk to
        assert os.path.exists("/proc/driver/nvidia/version")


def test_doctor_lists_gpus():
    gpus = [FakeGpu(uuid="GPU-aaaa"), FakeGpu(uuid="GPU-bbbb", lost=True)]
    lines = GpuSubsystem.doctor("auto", nvml=FakeNvml(gpus, driver="550.54.15")).lines
    assert lines[0] == "gpu:"
    assert "gpu 0" in lines[1] and "NVIDIA H100 80GB HBM3" in lines[1] and "GPU-aaaa" in lines[1]
    assert "driver 550.54.15" in lines[1] and "[ok]" in lines[1]
    assert "gpu 1" in lines[2] and "lost" in lines[2] and "[!!]" in lines[2]


def test_doctor_says_why_there_is_no_gpu():
    lines = GpuSubsystem.doctor(
        "auto", nvml=FakeNvml([], init_error=fn.NVML_ERROR_DRIVER_NOT_LOADED)).lines
    assert lines[:2] == ["gpu:", ("  [--] nvml           NVIDIA driver not loaded (no nvidia kernel "
                                  "module) (GPU health metrics off)")]
    # the kernel log is checked whatever NVML says: readable or not, never a problem
    (kmsg,) = lines[2:]
    assert kmsg.startswith(("  [ok] kernel log     /dev/kmsg readable",
                            "  [--] kernel log     cannot read /dev/kmsg"))
