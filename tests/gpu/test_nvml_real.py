"""The GPU collector on a real NVIDIA GPU: values agree with nvidia-smi, the
event thread runs and stops, and a matmul burn shows up in power or heat."""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import threading
import time
import xml.etree.ElementTree as ET

import pytest

from tests.unit.gpu_helpers import kmsg_hub, open_collector
from tracehound.collectors.gpu import gpu_inventory
from tracehound.gpu.health import gpu_key

pytestmark = pytest.mark.gpu
MIB = 1 << 20


def scrape(col) -> dict:
    return {f.name: [(s.name, s.labels, s.value) for s in f.samples] for f in col.collect()}


def value(fams, family, **labels):
    hits = [v for _, lbl, v in fams.get(family, ())
            if all(lbl.get(k) == str(w) for k, w in labels.items())]
    return hits[0] if hits else None


def number(el) -> float | None:
    """'34 C', '72.31 W', '81559 MiB', '0' -> float; 'N/A', missing -> None."""
    if el is None or el.text is None:
        return None
    m = re.match(r"\s*(-?[0-9.]+)", el.text)
    return float(m.group(1)) if m else None


def first(el, *paths):
    for p in paths:
        found = el.find(p)
        if found is not None and number(found) is not None:
            return found
    return None


def smi() -> dict:
    """uuid -> <gpu> element of `nvidia-smi -q -x`."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        pytest.skip("nvidia-smi is not on PATH")
    out = subprocess.run([exe, "-q", "-x"], capture_output=True, text=True, timeout=60, check=True)
    return {g.findtext("uuid").strip(): g for g in ET.fromstring(out.stdout).findall("gpu")}


def smi_ecc(gpu_el, scope: str):
    """(corrected, uncorrected) for 'volatile' or 'aggregate'; None where N/A.

    Drivers before ~R520 report single_bit/double_bit totals; later ones split
    by SRAM/DRAM, and R550+ splits SRAM uncorrectable into parity and SEC-DED.
    """
    node = gpu_el.find(f"ecc_errors/{scope}")
    if node is None:
        return None
    if node.find("single_bit/total") is not None:
        return number(node.find("single_bit/total")), number(node.find("double_bit/total"))
    vals = {c.tag: number(c) for c in node}
    if not vals or any(v is None for v in vals.values()):
        return None
    corrected = sum(v for t, v in vals.items() if t.endswith("_correctable"))
    uncorrected = 0.0
    for mem in ("sram", "dram"):
        if f"{mem}_uncorrectable" in vals:
            uncorrected += vals[f"{mem}_uncorrectable"]
        else:
            uncorrected += sum(v for t, v in vals.items() if t.startswith(f"{mem}_uncorrectable_"))
    return corrected, uncorrected


def test_inventory_matches_nvidia_smi():
    gpus, reason = gpu_inventory()
    assert gpus, reason
    by_uuid = smi()
    assert {g["uuid"] for g in gpus} == set(by_uuid)
    for g in gpus:
        el = by_uuid[g["uuid"]]
        assert g["model"] == el.findtext("product_name").strip()
        assert not g["lost"]


def test_collector_matches_nvidia_smi(collector):
    f = scrape(collector)
    by_uuid = smi()
    gpus = [lbl for _, lbl, _ in f["tracehound_gpu"]]
    assert gpus and {g["uuid"] for g in gpus} == set(by_uuid)
    for g in gpus:
        el, sel = by_uuid[g["uuid"]], {"gpu": g["gpu"], "uuid": g["uuid"]}
        assert value(f, "tracehound_gpu_lost", **sel) == 0

        temp = value(f, "tracehound_gpu_temperature_celsius", sensor="gpu", **sel)
        assert temp == pytest.approx(number(el.find("temperature/gpu_temp")), abs=3)
        mem_temp = number(el.find("temperature/memory_temp"))
        if mem_temp is not None:
            got = value(f, "tracehound_gpu_temperature_celsius", sensor="memory", **sel)
            assert got == pytest.approx(mem_temp, abs=3)

        draw = first(el, "gpu_power_readings/power_draw", "gpu_power_readings/instant_power_draw",
                     "power_readings/power_draw")
        if draw is not None:
            watts = number(draw)
            assert value(f, "tracehound_gpu_power_watts", **sel) == pytest.approx(
                watts, abs=max(25.0, 0.15 * watts))
        limit = first(el, "gpu_power_readings/current_power_limit",
                      "power_readings/enforced_power_limit", "power_readings/power_limit")
        if limit is not None:
            assert value(f, "tracehound_gpu_power_limit_watts", **sel) == pytest.approx(
                number(limit), abs=1.0)

        total_mib = number(el.find("fb_memory_usage/total"))
        used_mib = number(el.find("fb_memory_usage/used"))
        reserved_mib = number(el.find("fb_memory_usage/reserved")) or 0.0
        total = value(f, "tracehound_gpu_memory_total_bytes", **sel)
        used = value(f, "tracehound_gpu_memory_used_bytes", **sel)
        assert total / MIB == pytest.approx(total_mib, abs=1)
        # NVML's v1 "used" counts the driver's reservation, nvidia-smi shows it apart
        assert used / MIB == pytest.approx(used_mib, abs=reserved_mib + 64)

        ecc_on = (el.findtext("ecc_mode/current_ecc") or el.findtext("ecc_mode/current")
                  or "").strip() == "Enabled"
        for scope in ("volatile", "aggregate"):
            expected = smi_ecc(el, scope)
            got = [value(f, "tracehound_gpu_ecc_errors", type=t, scope=scope, **sel)
                   for t in ("corrected", "uncorrected")]
            if ecc_on and expected is not None:
                assert got == [pytest.approx(expected[0]), pytest.approx(expected[1])], scope

        corr = number(el.find("remapped_rows/remapped_row_corr"))
        if corr is not None:
            assert value(f, "tracehound_gpu_remapped_rows", type="correctable", **sel) == corr
            unc = number(el.find("remapped_rows/remapped_row_unc"))
            assert value(f, "tracehound_gpu_remapped_rows", type="uncorrectable", **sel) == unc

        reasons = {lbl["reason"] for _, lbl, _ in f["tracehound_gpu_clock_event_active"]
                   if lbl["uuid"] == g["uuid"]}
        assert {"sw_power_cap", "hw_slowdown", "sw_thermal_slowdown"} <= reasons
        assert value(f, "tracehound_gpu_numa_node", **sel) is not None


def test_event_thread_registers_and_stops(monkeypatch):
    import pynvml
    waits = []
    real_wait = pynvml.nvmlEventSetWait_v2

    def counted_wait(*args):
        waits.append(1)
        return real_wait(*args)

    # the event thread looks the function up on the module at each wait
    monkeypatch.setattr(pynvml, "nvmlEventSetWait_v2", counted_wait)
    col, reason = open_collector(event_wait_ms=200)     # wired as the gpu subsystem wires it
    assert col is not None, reason
    try:
        assert col.events.running
        hub = kmsg_hub(col)
        for gpu in col.gpus:
            # every datacenter GPU since Kepler reports XIDs through NVML events
            assert "xid" in col.events.registered[gpu.index]
            assert hub.identity(gpu_key(gpu))["uuid"] == gpu.uuid
        # an XID as the event thread hands it on (XID 14: reserved for tests)
        # is counted once by the kernel-log hub, under the real GPU
        gpu = next(g for g in col.gpus if g.handle is not None)
        col.events.on_event(gpu, "xid", 14)
        assert hub.snapshot().xids == {(gpu_key(gpu), 14): 1}
        # a few waits end (timeouts, with no event) without ending the thread
        seen, deadline = len(waits), time.monotonic() + 30
        while len(waits) < seen + 3:
            assert time.monotonic() < deadline, f"the event thread stopped waiting: {len(waits)}"
            time.sleep(0.05)
        assert col.events.running
        thread = col.events._thread
    finally:
        col.close()
    assert not thread.is_alive()


def _burner():
    """(name, burn(stop_event)) for the first importable GPU array library, or None.

    The burn checks one product against the CPU first: a GPU that computes
    wrong results must fail here rather than look busy.
    """
    try:
        import torch
        if torch.cuda.is_available():
            def burn(stop, ready):
                a = torch.randn(256, 256, dtype=torch.float64)
                b = torch.randn(256, 256, dtype=torch.float64)
                assert torch.allclose((a.cuda() @ b.cuda()).cpu(), a @ b, rtol=1e-9, atol=1e-9)
                x = torch.randn(8192, 8192, device="cuda", dtype=torch.float16)
                y = torch.randn(8192, 8192, device="cuda", dtype=torch.float16)
                ready.set()
                while not stop.is_set():
                    for _ in range(20):
                        x @ y
                    torch.cuda.synchronize()
            return "torch", burn
    except ImportError:
        pass
    try:
        import cupy
        import numpy

        def burn(stop, ready):
            a = numpy.random.rand(256, 256)
            b = numpy.random.rand(256, 256)
            assert numpy.allclose(cupy.asnumpy(cupy.asarray(a) @ cupy.asarray(b)), a @ b)
            x = cupy.random.rand(8192, 8192, dtype=cupy.float32).astype(cupy.float16)
            y = cupy.random.rand(8192, 8192, dtype=cupy.float32).astype(cupy.float16)
            ready.set()
            while not stop.is_set():
                for _ in range(20):
                    x @ y
                cupy.cuda.Device().synchronize()
        return "cupy", burn
    except ImportError:
        return None


def _readings(col) -> tuple[dict, dict]:
    """({gpu index: {"power": W, "temp": C}}, all families)"""
    f = scrape(col)
    out = {}
    for _, lbl, v in f["tracehound_gpu_power_watts"]:
        out.setdefault(lbl["gpu"], {})["power"] = v
    for _, lbl, v in f["tracehound_gpu_temperature_celsius"]:
        if lbl["sensor"] == "gpu":
            out.setdefault(lbl["gpu"], {})["temp"] = v
    return out, f


def test_matmul_burn_raises_power_or_temperature(collector):
    found = _burner()
    if found is None:
        pytest.skip("neither PyTorch with CUDA nor CuPy is importable: no way to load the GPU")
    _, burn = found
    # the idle baseline: the highest of readings taken until NVML has
    # refreshed the power reading once (it samples about every 100 ms)
    base, _ = _readings(collector)
    readings, deadline = [base], time.monotonic() + 10
    while all(r == base for r in readings) and time.monotonic() < deadline:
        time.sleep(0.05)
        readings.append(_readings(collector)[0])
    baseline = {g: {k: max(r[g].get(k, 0) for r in readings) for k in ("power", "temp")}
                for g in base}

    stop, ready, errors = threading.Event(), threading.Event(), []

    def run():
        try:
            burn(stop, ready)
        except (AssertionError, RuntimeError, MemoryError, OSError) as exc:   # failed below
            errors.append(exc)
            ready.set()

    worker = threading.Thread(target=run, daemon=True)
    worker.start()
    assert ready.wait(120), "the burn did not start"
    rises, ours, f = {}, None, {}
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not errors:
            time.sleep(0.5)
            now, f = _readings(collector)
            for g, r in now.items():
                rises[g] = (max(rises.get(g, (0, 0))[0], r.get("power", 0) - baseline[g]["power"]),
                            max(rises.get(g, (0, 0))[1], r.get("temp", 0) - baseline[g]["temp"]))
            mine = [lbl for _, lbl, _ in f["tracehound_gpu_process_info"]
                    if lbl["pid"] == str(os.getpid())]
            if mine:
                ours = mine[0]
            g = ours["gpu"] if ours else None
            if g is not None and (rises[g][0] >= 50 or rises[g][1] >= 2):
                break
    finally:
        stop.set()
        worker.join(60)
    assert not errors, errors[0]
    if ours is None:
        # NVML lists host pids; from inside a container ours is not among them
        g = max(rises, key=lambda k: rises[k][0])
    else:
        g = ours["gpu"]
        with open("/proc/self/cgroup") as fh:
            own = next((line[3:].strip() or "/" for line in fh if line.startswith("0::")), "unknown")
        assert ours["cgroup"] == own
    power_rise, temp_rise = rises.get(g, (0.0, 0.0))
    assert power_rise >= 50 or temp_rise >= 2, (
        f"GPU {g}: power +{power_rise:.0f} W, temperature +{temp_rise:.0f} C under a matmul burn")
