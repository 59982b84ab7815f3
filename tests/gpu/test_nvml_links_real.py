"""On a real NVIDIA GPU: NVLink state and traffic, MIG mode, per-process SM
utilization under a burn, and gpu.power_cap / gpu.clock_lock applied and
rolled back (root). Each check says why it skips where the GPU, the driver
or the rights do not allow it."""
from __future__ import annotations

import os
import shutil
import subprocess
import threading
import time

import pytest

from tracehound.chaos import faults as catalog
from tracehound.chaos.faults import FaultError

from .test_nvml_real import _burner, scrape, value

pytestmark = pytest.mark.gpu


def smi_query(field: str) -> dict[str, str]:
    """uuid -> `nvidia-smi --query-gpu=<field>` value."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        pytest.skip("nvidia-smi is not on PATH")
    out = subprocess.run([exe, f"--query-gpu=uuid,{field}", "--format=csv,noheader,nounits"],
                         capture_output=True, text=True, timeout=60, check=True)
    return dict(line.split(", ", 1) for line in out.stdout.strip().splitlines())


def test_nvlink_state_matches_nvidia_smi(collector):
    f = scrape(collector)
    if not f["tracehound_gpu_nvlink_up"]:
        pytest.skip("no GPU here has NVLink (or the driver reports no link state)")
    for gpu in collector.gpus:
        out = subprocess.run(["nvidia-smi", "nvlink", "-s", "-i", str(gpu.index)],
                             capture_output=True, text=True, timeout=60, check=True).stdout
        for line in out.splitlines():
            line = line.strip()
            if line.startswith("Link ") and ":" in line:
                link = int(line.split()[1].rstrip(":"))
                want = 0 if "inactive" in line.lower() else 1
                assert value(f, "tracehound_gpu_nvlink_up", gpu=gpu.index, link=link) == want


def test_nvlink_traffic_counters_only_grow(collector):
    first = scrape(collector)["tracehound_gpu_nvlink_bytes"]
    if not first:
        pytest.skip("no NVLink throughput fields on this GPU/driver")
    # every scrape after another: no counter ever goes back
    before = {tuple(sorted(lbl.items())): v for _, lbl, v in first}
    for _ in range(5):
        again = {tuple(sorted(lbl.items())): v for _, lbl, v in
                 scrape(collector)["tracehound_gpu_nvlink_bytes"]}
        for key, v in before.items():
            assert again[key] >= v, key
        before = again


def test_mig_mode_matches_nvidia_smi(collector):
    f = scrape(collector)
    modes = smi_query("mig.mode.current")
    if not f["tracehound_gpu_mig_mode"]:
        assert all(m.strip() in ("[N/A]", "N/A") for m in modes.values()), modes
        pytest.skip("no MIG-capable GPU here")
    for _, lbl, v in f["tracehound_gpu_mig_mode"]:
        assert v == int(modes[lbl["uuid"]].strip() == "Enabled")
    listed = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True,
                            timeout=60, check=True).stdout
    assert len(f["tracehound_gpu_mig_memory_total_bytes"]) == listed.count("MIG-")


def test_process_sm_utilization_sees_a_burn(collector):
    found = _burner()
    if found is None:
        pytest.skip("neither PyTorch with CUDA nor CuPy is importable: no way to load the GPU")
    stop, ready = threading.Event(), threading.Event()
    worker = threading.Thread(target=found[1], args=(stop, ready), daemon=True)
    worker.start()
    try:
        assert ready.wait(120), "the burn did not start"
        best = None
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            time.sleep(1)
            rows = [v for _, lbl, v in
                    scrape(collector)["tracehound_gpu_process_sm_utilization_ratio"]
                    if lbl["pid"] == str(os.getpid())]
            if rows:
                best = max(rows + [best or 0])
                if best > 0.5:
                    break
    finally:
        stop.set()
        worker.join(60)
    if best is None:
        pytest.skip("NVML gives no per-process utilization for our pid here "
                    "(not supported, or a container's pid namespace)")
    assert best > 0.5, f"our burn's SM utilization read {best}"


def _need_root():
    if os.geteuid() != 0:
        pytest.skip("changing power limits and clocks needs root")


def _limit(collector, index):
    return value(scrape(collector), "tracehound_gpu_power_limit_watts", gpu=index)


def test_power_cap_applies_and_rolls_back(collector):
    _need_root()
    import pynvml
    fault = catalog.get("gpu.power_cap")
    h = pynvml.nvmlDeviceGetHandleByIndex(0)
    low, high = pynvml.nvmlDeviceGetPowerManagementLimitConstraints(h)
    prior_w = _limit(collector, 0)
    watts = max(low / 1000, round(prior_w * 0.8))
    with pytest.raises(FaultError, match="outside"):
        fault.prepare(fault.with_defaults({"watts": high / 1000 + 100}), "real-refuse")
    p = fault.prepare(fault.with_defaults({"watts": watts}), "real-cap")
    try:
        fault.apply(p.state)
        assert _limit(collector, 0) == pytest.approx(watts, abs=1)
        assert float(smi_query("power.limit")[p.state["uuid"]]) == pytest.approx(watts, abs=1)
    finally:
        fault.rollback(p.state)
    assert _limit(collector, 0) == pytest.approx(prior_w, abs=0.01)


def test_clock_lock_holds_the_sm_clock_under_load_and_rolls_back(collector):
    _need_root()
    import pynvml
    h = pynvml.nvmlDeviceGetHandleByIndex(0)
    graphics = sorted({c for m in pynvml.nvmlDeviceGetSupportedMemoryClocks(h)
                       for c in pynvml.nvmlDeviceGetSupportedGraphicsClocks(h, m)})
    low, top = graphics[0], graphics[len(graphics) // 2]
    fault = catalog.get("gpu.clock_lock")
    p = fault.prepare(fault.with_defaults({"min_mhz": low, "max_mhz": top}), "real-lock")
    found = _burner()
    stop, ready = threading.Event(), threading.Event()
    worker = None
    try:
        fault.apply(p.state)
        if found is not None:
            worker = threading.Thread(target=found[1], args=(stop, ready), daemon=True)
            worker.start()
            assert ready.wait(120)
            # read the clock once the load shows in the GPU's utilization
            deadline = time.monotonic() + 60
            while value(scrape(collector), "tracehound_gpu_utilization_ratio", gpu=0,
                        engine="gpu") < 0.5:
                assert time.monotonic() < deadline, "the load never showed in utilization"
                time.sleep(0.2)
            sm = value(scrape(collector), "tracehound_gpu_clock_hertz", gpu=0, clock="sm")
            assert sm <= top * 1e6 + 15e6, f"SM clock {sm / 1e6:.0f} MHz above the {top} MHz lock"
    finally:
        stop.set()
        if worker is not None:
            worker.join(60)
        note = fault.rollback(p.state)
    assert "reset" in note
    if found is None:
        pytest.skip("locked and reset, but no PyTorch/CuPy load to see the lock hold")
