"""scripts/gpu-check and its driver (bench/gpu: __main__.py, smi.py,
faults.py, report.py), where no GPU is:
the nvidia-smi XML parser, the comparison with what the GPU collector
really exports (wired as the agent wires it, over the NVML test double),
the report, the choices made for the faults, and the script's no-GPU exit."""
from __future__ import annotations

import ctypes.util
import dataclasses
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, generate_latest

# the driver's entry, imported as a module: only `python -m bench.gpu` runs it
import bench.gpu.__main__ as gpu_check
from bench.gpu import faults as gpu_faults
from bench.gpu import report as gpu_report
from bench.gpu import smi as gpu_smi

from . import fake_nvml as fn
from .fake_nvml import FakeGpu, FakeNvml
from .gpu_helpers import make_collector

ROOT = Path(__file__).resolve().parents[2]
FIXTURE = Path(__file__).parent / "fixtures" / "nvidia-smi-q-x-h100.xml"
UUID = "GPU-8a3c2f5e-1d47-4b0e-9c61-7f2e0d9ab412"
MIB = 1 << 20


def smi():
    return gpu_smi.parse_smi(FIXTURE.read_text())


# The GPU of the fixture as NVML would give it: NVML's v1 "used" holds the
# driver's reservation (551 MiB) that nvidia-smi shows apart; the readings
# that move differ a little, within the stated tolerances.
MATCHING = FakeGpu(
    uuid=UUID, name="NVIDIA H100 80GB HBM3", pci_bus_id="00000000:18:00.0",
    temperature=33, memory_temperature=41, power_mw=79_500, power_limit_mw=700_000,
    clocks_mhz={fn.NVML_CLOCK_SM: 1965, fn.NVML_CLOCK_MEM: 2619},
    memory=(551 * MIB, 81559 * MIB),
    ecc={(fn.NVML_MEMORY_ERROR_TYPE_CORRECTED, fn.NVML_VOLATILE_ECC): 2,
         (fn.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, fn.NVML_VOLATILE_ECC): 0,
         (fn.NVML_MEMORY_ERROR_TYPE_CORRECTED, fn.NVML_AGGREGATE_ECC): 7,
         (fn.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, fn.NVML_AGGREGATE_ECC): 1})


def exported(tmp_path, gpu: FakeGpu, driver="550.54.15") -> dict:
    """What the agent's /metrics would say about `gpu`, parsed by the driver."""
    col = make_collector(FakeNvml([gpu], driver=driver), tmp_path)
    try:
        registry = CollectorRegistry(auto_describe=False)
        registry.register(col)
        return gpu_smi.parse_exposition(generate_latest(registry).decode())
    finally:
        col.close()


def verdicts(rows) -> dict:
    return {r["field"]: r["agree"] for r in rows}


def test_the_fixture_parses_into_base_units():
    s = smi()
    assert (s["driver_version"], s["cuda_version"]) == ("550.54.15", "12.4")
    g = s["gpus"][UUID]
    assert g["name"] == "NVIDIA H100 80GB HBM3"
    assert g["pci_bus_id"] == "0000:18:00.0"
    assert g["memory_total_bytes"] == 81559 * MIB
    assert (g["memory_used_bytes"], g["memory_reserved_bytes"]) == (0, 551 * MIB)
    assert (g["temperature_gpu_c"], g["temperature_memory_c"]) == (32, 41)
    assert g["power_draw_w"] == pytest.approx(71.03)        # the average, not the instant
    assert g["power_limit_w"] == 700
    # the current clocks, not the application, default or max ones
    assert (g["clock_sm_hz"], g["clock_memory_hz"]) == (1980e6, 2619e6)
    assert g["ecc_mode"] == "Enabled"
    assert (g["ecc_volatile_corrected"], g["ecc_volatile_uncorrected"]) == (2, 0)
    assert (g["ecc_aggregate_corrected"], g["ecc_aggregate_uncorrected"]) == (7, 1)


def test_an_older_driver_layout_parses_too():
    xml = """<nvidia_smi_log><driver_version>470.57.02</driver_version>
      <gpu id="00000000:3B:00.0"><product_name>Tesla V100-SXM2-32GB</product_name>
      <uuid>GPU-old</uuid><pci><pci_bus_id>00000000:3B:00.0</pci_bus_id></pci>
      <fb_memory_usage><total>32510 MiB</total><used>3 MiB</used></fb_memory_usage>
      <ecc_mode><current_ecc>Enabled</current_ecc></ecc_mode>
      <ecc_errors><volatile><single_bit><device_memory>4</device_memory><total>5</total>
      </single_bit><double_bit><total>0</total></double_bit></volatile>
      <aggregate><single_bit><total>N/A</total></single_bit><double_bit><total>N/A</total>
      </double_bit></aggregate></ecc_errors>
      <temperature><gpu_temp>40 C</gpu_temp><memory_temp>N/A</memory_temp></temperature>
      <power_readings><power_draw>43.50 W</power_draw><enforced_power_limit>300.00 W
      </enforced_power_limit></power_readings>
      <clocks><sm_clock>135 MHz</sm_clock><mem_clock>877 MHz</mem_clock></clocks>
      </gpu></nvidia_smi_log>"""
    g = gpu_smi.parse_smi(xml)["gpus"]["GPU-old"]
    assert g["pci_bus_id"] == "0000:3b:00.0"
    assert (g["power_draw_w"], g["power_limit_w"]) == (43.5, 300)
    assert (g["ecc_volatile_corrected"], g["ecc_volatile_uncorrected"]) == (5, 0)
    assert g["ecc_aggregate_corrected"] is None and g["temperature_memory_c"] is None
    assert g["memory_reserved_bytes"] == 0


def test_what_the_collector_exports_agrees_with_the_fixture(tmp_path):
    ours = exported(tmp_path, MATCHING)
    rows = gpu_smi.compare([ours, ours], smi())
    v = verdicts(rows)
    assert set(v) == {"UUID"} | {f.label for f in gpu_smi.FIELDS}
    assert [r for r in rows if r["agree"] != "yes"] == []
    part = gpu_smi.part_smi([ours, ours], smi())
    assert part.outcome == "pass" and part.summary.startswith(f"{len(rows)} agree, 0 disagree")


def test_what_disagrees_is_named_and_fails_the_part(tmp_path):
    wrong = dataclasses.replace(
        MATCHING, pci_bus_id="00000000:19:00.0", temperature=45, power_limit_mw=500_000,
        clocks_mhz={fn.NVML_CLOCK_SM: 1000, fn.NVML_CLOCK_MEM: 2619},
        memory=(20_000 * MIB, 81559 * MIB), ecc=None)      # ECC counters not answered
    ours = exported(tmp_path, wrong, driver="535.104.05")
    v = verdicts(gpu_smi.compare([ours, ours], smi()))
    assert {k for k, a in v.items() if a == "no"} == {
        "PCI bus id", "driver version", "temperature (GPU)", "power limit", "SM clock",
        "memory used", "ECC mode", "ECC corrected (volatile)", "ECC uncorrected (volatile)",
        "ECC corrected (aggregate)", "ECC uncorrected (aggregate)"}
    assert v["name"] == v["memory total"] == v["power draw"] == "yes"
    assert gpu_smi.part_smi([ours, ours], smi()).outcome == "fail"


def test_a_moving_value_agrees_within_the_span_of_two_readings():
    ref = {"driver_version": "d", "gpus": {"GPU-x": {"temperature_gpu_c": 37.0}}}
    before = {"GPU-x": {"index": "0", "temperature_gpu_c": 30.0}}
    after = {"GPU-x": {"index": "0", "temperature_gpu_c": 40.0}}
    row = next(r for r in gpu_smi.compare([before, after], ref)
               if r["field"] == "temperature (GPU)")
    assert (row["tracehound"], row["agree"]) == ("30 C .. 40 C", "yes")
    ref["gpus"]["GPU-x"]["temperature_gpu_c"] = 44.0
    row = next(r for r in gpu_smi.compare([before, after], ref)
               if r["field"] == "temperature (GPU)")
    assert row["agree"] == "no"


def test_a_gpu_only_one_side_lists_disagrees(tmp_path):
    ours = exported(tmp_path, dataclasses.replace(MATCHING, uuid="GPU-other"))
    rows = gpu_smi.compare([ours], smi())
    listed = {r["uuid"]: (r["tracehound"], r["nvidia_smi"], r["agree"]) for r in rows
              if r["field"] == "listed"}
    assert listed == {UUID: ("no", "yes", "no"), "GPU-other": ("yes", "no", "no")}


def test_junit_outcomes():
    xml = """<testsuites><testsuite name="pytest">
      <testcase classname="tests.gpu.test_nvml_real" name="test_a" time="1.5"/>
      <testcase classname="tests.gpu.test_nvml_real" name="test_b" time="0.1">
        <failure message="assert 3 == 4">long traceback</failure></testcase>
      <testcase classname="tests.gpu.test_nvml_links_real" name="test_c" time="0">
        <skipped message="no GPU here has NVLink"/></testcase>
    </testsuite></testsuites>"""
    assert [(r["test"], r["outcome"], r["detail"]) for r in gpu_report.parse_junit(xml)] == [
        ("test_nvml_real::test_a", "passed", ""),
        ("test_nvml_real::test_b", "failed", "assert 3 == 4"),
        ("test_nvml_links_real::test_c", "skipped", "no GPU here has NVLink")]


def junit_of(*cases: str) -> str:
    return '<testsuites><testsuite name="pytest">' + "".join(cases) + "</testsuite></testsuites>"


PASSED = '<testcase classname="tests.gpu.test_nvml_real" name="test_a" time="1.5"/>'
NO_NVLINK = ('<testcase classname="tests.gpu.test_nvml_links_real" name="test_links" time="0">'
             '<skipped message="no GPU here has NVLink (or the driver reports no link state)"/>'
             '</testcase>')
NO_TORCH = ('<testcase classname="tests.gpu.test_nvml_real" name="test_burn" time="0">'
            '<skipped message="neither PyTorch with CUDA nor CuPy is importable"/></testcase>')


@pytest.mark.parametrize("cases, outcome", [((PASSED, NO_NVLINK), "pass"),
                                            ((PASSED, NO_NVLINK, NO_TORCH), "fail")])
def test_a_skip_for_what_the_image_has_fails_the_tests_part_and_a_missing_nvlink_does_not(
        tmp_path, monkeypatch, cases, outcome):
    def pytest_run(cmd, **_kw):         # pytest exits 0 when tests only skip
        junit = next(a for a in cmd if a.startswith("--junitxml=")).split("=", 1)[1]
        Path(junit).write_text(junit_of(*cases))
        return subprocess.CompletedProcess(cmd, 0, "", "")
    monkeypatch.setattr(gpu_check.subprocess, "run", pytest_run)
    part = gpu_check.part_tests(str(tmp_path), {})
    assert part.outcome == outcome
    said = [n for n in part.notes if "skipped on a machine with a GPU" in n]
    assert said == ([] if outcome == "pass" else [said[0]])
    assert all("test_burn" in n and "test_links" not in n for n in said)


def test_the_report_has_the_stamp_a_table_per_part_and_the_outcome(tmp_path):
    stamp = {"date": "2024-11-26 14:00 UTC", "commit": "5bbd28239742", "took_s": 301.0,
             "gpus": "1 x NVIDIA H100 80GB HBM3", "driver": "550.54.15 (CUDA 12.4)",
             "kernel": "6.8.0-45-generic", "cpus": "16", "python": "/usr/bin/python3 3.12.3",
             "agent": "tracehound run"}
    Part = gpu_report.Part
    parts = [Part(1, "GPU test tier", header=("test", "outcome"), rows=[("t::a", "passed")],
                  outcome="pass", summary="1 passed"),
             Part(2, "GPU faults", header=("fault", "MTTD"), rows=[("gpu.burn", "a|b")],
                  outcome="fail", summary="0/1", notes=["why"]),
             Part(3, "nvidia-smi", outcome="pass")]
    path = tmp_path / "report" / "gpu.md"
    gpu_report.write_report(str(path), gpu_report.markdown(
        stamp, parts, {"chaos run gpu-burn.yaml": "boom"}))
    text = path.read_text()
    for line in ("- commit: 5bbd28239742", "- GPU: 1 x NVIDIA H100 80GB HBM3",
                 "- driver: 550.54.15 (CUDA 12.4)", "- kernel: 6.8.0-45-generic", "- CPUs: 16",
                 "**Outcome: FAIL** (part 2 failed)", "| 2. GPU faults | fail | 0/1 |",
                 "## 1. GPU test tier: pass", "| t::a | passed |", "| gpu.burn | a\\|b |",
                 "- why", "### chaos run gpu-burn.yaml"):
        assert line in text.splitlines(), line
    gpu_report.write_report(str(path), gpu_report.markdown(stamp, [parts[0], parts[2]]))
    assert "**Outcome: PASS**" in path.read_text()


def test_fault_settings_fit_the_gpu():
    assert gpu_faults.pick_power_cap(700_000, 200_000, 700_000)[0] == 560
    watts, note = gpu_faults.pick_power_cap(200_000, 200_000, 700_000)
    assert watts == 200 and "cannot lower" in note
    assert gpu_faults.pick_clock_lock([1980, 1965, 1095, 210]) == (210, 1095)
    assert gpu_faults.pick_clock_lock([]) is None


def test_the_pack_fetches_what_the_image_lacks():
    pyproject = (ROOT / "pyproject.toml").read_text()
    assert gpu_check.missing_dependencies(pyproject) == ["bcrypt>=4", "pyelftools>=0.29",
                                                         "google-re2>=1.1"]


def _bin(tmp_path, nvidia_smi: str | None) -> str:
    """A PATH with what the script needs, and nvidia-smi only if given."""
    d = tmp_path / "bin"
    d.mkdir()
    for tool in ("dirname", "grep", "head", "tail", "sed", "id"):
        found = shutil.which(tool)
        assert found, tool
        (d / tool).symlink_to(found)
    # an interpreter itself, not a wrapper that looks for others on PATH
    (d / "python3").symlink_to(os.path.realpath(sys.executable))
    if nvidia_smi is not None:
        (d / "nvidia-smi").write_text("#!/bin/sh\n" + nvidia_smi)
        (d / "nvidia-smi").chmod(0o755)
    return str(d)


@pytest.mark.parametrize("nvidia_smi, why", [
    (None, "nvidia-smi not found"),
    ('[ "$1" = -L ] && exit 0\nexit 1\n', "nvidia-smi lists no GPU"),
    ("echo 'NVIDIA-SMI has failed because it could not communicate with the NVIDIA driver.'"
     "\nexit 9\n", "nvidia-smi failed: NVIDIA-SMI has failed because it could not "
                   "communicate with the NVIDIA driver."),
    ("echo 'GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-x)'\n", "libnvidia-ml.so.1 does not load"),
])
def test_without_a_gpu_the_script_says_why_in_one_line_and_writes_nothing(
        tmp_path, nvidia_smi, why):
    if why.startswith("libnvidia-ml") and ctypes.util.find_library("nvidia-ml"):
        pytest.skip("an NVIDIA driver library is installed here")
    report = ROOT / "bench" / "report" / "gpu.md"
    before = report.stat().st_mtime_ns if report.exists() else None
    site = Path("/tmp/tracehound-site")
    site_before = site.exists()
    res = subprocess.run(["/bin/bash", str(ROOT / "scripts" / "gpu-check")], capture_output=True,
                         text=True, timeout=30,
                         env={"PATH": _bin(tmp_path, nvidia_smi), "HOME": str(tmp_path)})
    assert res.returncode == 0, res.stderr
    assert res.stderr == ""
    lines = res.stdout.splitlines()
    assert len(lines) == 1
    assert lines[0].startswith(f"gpu-check: no NVIDIA GPU here ({why}")
    assert lines[0].endswith("): nothing to check")
    assert (report.stat().st_mtime_ns if report.exists() else None) == before
    assert site.exists() == site_before
