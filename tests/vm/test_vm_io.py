"""The host-kernel I/O suite, run inside a Debian 6.1 kernel in every hook
mode: fentry and kprobe are only provable there. One boot runs all three modes;
each mode's junit report comes back as its own test outcome here."""
import json
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

import harness

pytestmark = pytest.mark.vm

REPO = Path(__file__).resolve().parents[2]
MODES = ("fentry", "kprobe", "tracepoint")

GUEST_SCRIPT = """
set -u
RESULTS={results}
export TRACEHOUND_PARITY_DIR=$RESULTS TRACEHOUND_TEST_DISK_DIR=$RESULTS
mountpoint -q /sys/kernel/tracing || mount -t tracefs nodev /sys/kernel/tracing
for mode in {modes}; do
    {python} -m pytest -p no:cacheprovider -q tests/kernel --hook-mode "$mode" \\
        --junitxml="$RESULTS/$mode.xml" >"$RESULTS/$mode.log" 2>&1
    echo "MODE $mode rc=$?"
done
"""


@pytest.fixture(scope="session")
def vm_run(tmp_path_factory):
    results = tmp_path_factory.mktemp("vm-io")
    script = GUEST_SCRIPT.format(results=results, modes=" ".join(MODES), python=sys.executable)
    result = harness.run_in_vm(script, timeout=1200, cwd=REPO, writable=[results])
    return result, results


def _tail(path: Path, n: int = 60) -> str:
    if not path.exists():
        return f"({path.name} missing)"
    return "\n".join(path.read_text(errors="replace").splitlines()[-n:])


@pytest.mark.parametrize("mode", MODES)
def test_kernel_suite_passes_in_vm(vm_run, mode):
    result, results = vm_run
    report = results / f"{mode}.xml"
    assert report.exists(), (f"no junit report for {mode}; guest output:\n{result.output[-3000:]}"
                             f"\n--- {mode}.log\n{_tail(results / f'{mode}.log')}")
    suite = ET.parse(report).getroot()
    suite = suite if suite.tag == "testsuite" else suite.find("testsuite")
    bad = [f"{tc.get('classname')}::{tc.get('name')}: {el.tag}: {(el.get('message') or '')[:300]}"
           for tc in suite.iter("testcase") for el in tc
           if el.tag in ("failure", "error")
           or (el.tag == "skipped" and el.get("type") != "pytest.xfail")]
    known = [tc.get("name") for tc in suite.iter("testcase") for el in tc
             if el.tag == "skipped" and el.get("type") == "pytest.xfail"]
    if known:
        print(f"{mode}: known failures (xfail): {known}")
    assert int(suite.get("tests")) >= 10
    # Inside the VM everything is available: a skip is a hole in coverage.
    assert not bad, f"{mode} mode in the VM:\n" + "\n".join(bad) + \
        f"\n--- {mode}.log\n{_tail(results / f'{mode}.log')}"


@pytest.mark.parametrize("workload", ["worker-tmpfs", "worker-disk"])
def test_all_modes_count_the_same_bytes(vm_run, workload):
    _, results = vm_run
    seen = {}
    for mode in MODES:
        p = results / f"{mode}-{workload}.json"
        assert p.exists(), f"{mode} run recorded no counters for {workload}"
        seen[mode] = json.loads(p.read_text())
    keys = ("tracehound_io_read_bytes_total", "tracehound_io_write_bytes_total",
            "tracehound_io_read_requests_total", "tracehound_io_write_requests_total")
    for k in keys:
        values = {mode: seen[mode].get(k) for mode in MODES}
        assert len(set(values.values())) == 1 and None not in values.values(), (k, values)
