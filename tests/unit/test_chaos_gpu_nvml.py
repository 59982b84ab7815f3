"""gpu.power_cap and gpu.clock_lock through the NVML test double: apply,
rollback to the exact prior settings, refusals before anything changes, and
`chaos recover` after a run died with the fault applied."""
import pytest

from tracehound import cli
from tracehound.chaos import detection
from tracehound.chaos import faults as catalog
from tracehound.chaos import journal as journal_mod
from tracehound.chaos.faults import FaultError, gpu_nvml

from . import fake_nvml as fn
from .fake_nvml import FakeGpu, FakeNvml


@pytest.fixture
def nvml(monkeypatch):
    fake = FakeNvml([FakeGpu(uuid="GPU-aaaa", power_limit_mw=650_000),
                     FakeGpu(uuid="GPU-bbbb", power_limit_mw=700_000)])
    monkeypatch.setattr(gpu_nvml, "load_nvml", lambda: (fake, ""))
    return fake


def planned(name, args):
    fault = catalog.get(name)
    args = fault.with_defaults(args)
    assert catalog.check_args(fault, args) == []
    return fault, fault.prepare(args, "t1")


def test_power_cap_applies_and_restores_the_exact_prior_limit(nvml):
    fault, p = planned("gpu.power_cap", {"device": 1, "watts": 350})
    assert p.targets == ["GPU 1 (GPU-bbbb)"]
    assert p.state == {"uuid": "GPU-bbbb", "prior_mw": 700_000, "target_mw": 350_000}
    assert nvml.gpus[1].power_limit_mw == 700_000          # prepare changes nothing
    fault.apply(p.state)
    assert nvml.gpus[1].power_limit_mw == 350_000
    assert nvml.gpus[0].power_limit_mw == 650_000          # the other GPU untouched
    assert fault.observe(p.state) == {"power_limit_watts": 350.0}
    fault.rollback(p.state)
    fault.rollback(p.state)                                # idempotent
    assert nvml.gpus[1].power_limit_mw == 700_000
    assert nvml.initialized == nvml.shutdowns              # every session closed


def test_power_cap_refuses_out_of_range_watts_before_anything_changes(nvml):
    fault = catalog.get("gpu.power_cap")
    with pytest.raises(FaultError, match=r"150 W is outside GPU 0's power limit range 200..700 W"):
        fault.prepare(fault.with_defaults({"watts": 150}), "t1")
    with pytest.raises(FaultError, match="no GPU 5: NVML sees 2 GPU"):
        fault.prepare(fault.with_defaults({"device": 5, "watts": 300}), "t1")
    assert catalog.check_args(fault, {"watts": 0})[0][1] == "must be at least 1, not 0"
    assert nvml.calls["nvmlDeviceSetPowerManagementLimit"] == 0


def test_a_refused_set_says_why(nvml):
    fault, p = planned("gpu.power_cap", {"watts": 300})
    nvml.gpus[0].errors["nvmlDeviceSetPowerManagementLimit"] = fn.NVML_ERROR_NO_PERMISSION
    with pytest.raises(FaultError, match="NO_PERMISSION.*needs root"):
        fault.apply(p.state)


def test_clock_lock_applies_and_rollback_unlocks(nvml):
    fault, p = planned("gpu.clock_lock", {"min_mhz": 345, "max_mhz": 1410,
                                          "memory_min_mhz": 2619, "memory_max_mhz": 2619})
    assert p.state == {"uuid": "GPU-aaaa", "graphics": [345, 1410], "memory": [2619, 2619]}
    assert nvml.gpus[0].locked_clocks == {}
    fault.apply(p.state)
    assert nvml.gpus[0].locked_clocks == {"gpu": (345, 1410), "memory": (2619, 2619)}
    assert fault.rollback(p.state) == "clocks reset to the driver default (no lock)"
    assert nvml.gpus[0].locked_clocks == {}
    assert nvml.calls["nvmlDeviceResetGpuLockedClocks"] == 1


@pytest.mark.parametrize("args, fragment", [
    ({"min_mhz": 100, "max_mhz": 1410}, "100 MHz is outside GPU 0's supported graphics clocks 345..1980"),
    ({"min_mhz": 345, "max_mhz": 3000}, "3000 MHz is outside"),
    ({"min_mhz": 345, "max_mhz": 1410, "memory_min_mhz": 1000, "memory_max_mhz": 2619},
     "1000 MHz is outside GPU 0's supported memory clocks 2619..2619"),
])
def test_clock_lock_refuses_unsupported_clocks(nvml, args, fragment):
    fault = catalog.get("gpu.clock_lock")
    with pytest.raises(FaultError, match=fragment):
        fault.prepare(fault.with_defaults(args), "t1")
    assert nvml.calls["nvmlDeviceSetGpuLockedClocks"] == 0


def test_clock_lock_argument_problems():
    fault = catalog.get("gpu.clock_lock")
    assert [p for _, p in catalog.check_args(fault, {"min_mhz": 1500, "max_mhz": 1000})] \
        == ["min_mhz 1500 is above max_mhz 1000"]
    assert [p for _, p in catalog.check_args(fault, {"min_mhz": 1, "max_mhz": 2,
                                                      "memory_min_mhz": 5})] \
        == ["give both memory_min_mhz and memory_max_mhz, or neither"]


def test_recover_restores_the_limit_after_a_crash(nvml, tmp_path, capsys):
    fault, p = planned("gpu.power_cap", {"watts": 250})
    j = journal_mod.Journal(str(tmp_path), "r1", "power cap", "f")
    j.fault("r1-1", "cap", "gpu.power_cap", {"watts": 250}, p.state, p.targets)
    fault.apply(p.state)
    j.applied("r1-1", None)
    j.close()                      # as a SIGKILL would leave it
    assert nvml.gpus[0].power_limit_mw == 250_000
    assert cli.main(["chaos", "recover", "--journal", str(tmp_path)]) == 0
    assert "rolled back gpu.power_cap (cap) on GPU 0 (GPU-aaaa)" in capsys.readouterr().out
    assert nvml.gpus[0].power_limit_mw == 650_000


def test_recover_unlocks_the_clocks_after_a_crash(nvml, tmp_path, capsys):
    fault, p = planned("gpu.clock_lock", {"device": 1, "min_mhz": 345, "max_mhz": 1410})
    j = journal_mod.Journal(str(tmp_path), "r2", "clock lock", "f")
    j.fault("r2-1", "lock", "gpu.clock_lock", {}, p.state, p.targets)
    fault.apply(p.state)
    j.applied("r2-1", None)
    j.close()
    assert nvml.gpus[1].locked_clocks == {"gpu": (345, 1410)}
    assert cli.main(["chaos", "recover", "--journal", str(tmp_path)]) == 0
    assert "clocks reset to the driver default" in capsys.readouterr().out
    assert nvml.gpus[1].locked_clocks == {} and nvml.gpus[0].locked_clocks == {}


def test_no_driver_is_not_available(monkeypatch):
    fake = FakeNvml([], init_error=fn.NVML_ERROR_DRIVER_NOT_LOADED)
    monkeypatch.setattr(gpu_nvml, "load_nvml", lambda: (fake, ""))
    for name in ("gpu.power_cap", "gpu.clock_lock"):
        avail = catalog.get(name).availability()
        assert not avail.ok and "driver not loaded" in avail.reason


def test_detection_names_the_signal():
    d = catalog.get("gpu.power_cap").detection({"device": 1, "watts": 300})
    assert d.query == 'tracehound_gpu_power_limit_watts{gpu="1"}' and d.predicate == "<= 300"
    d = catalog.get("gpu.clock_lock").detection({"min_mhz": 345, "max_mhz": 1410})
    assert d.query == 'tracehound_gpu_clock_hertz{gpu="0",clock="sm"}'
    assert d.predicate == "<= 1410e6"
    assert detection.parse_predicate(d.predicate) == ("<=", 1410e6)


@pytest.mark.parametrize("name", ["gpu.power_cap", "gpu.clock_lock", "gpu.dcgm_inject"])
def test_detection_with_placeholder_arguments(name):
    """`chaos list` asks every fault's detection with "<arg>" strings in
    place of the required arguments."""
    fault = catalog.get(name)
    det = fault.detection({**{k: f"<{k}>" for k in fault.args}, **fault.with_defaults({})})
    assert det.note
