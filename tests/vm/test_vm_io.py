"""The host-kernel I/O suite, run inside a Debian 6.1 kernel in every hook
mode: fentry and kprobe are only provable there. One boot runs all three modes;
each mode's junit report comes back as its own test outcome here."""
import json
import shlex
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

import scenarios

pytestmark = pytest.mark.vm

REPO = Path(__file__).resolve().parents[2]
MODES = ("fentry", "kprobe", "tracepoint")
# What each hook mode runs in the guest. The subject is the I/O probe in a
# mode the host cannot load (fentry, kprobe) and Debian 6.1's verifier:
# - fentry and kprobe: the I/O probe's own tests, and the --latency options,
#   which change which programs load and how latency pairs entry with exit.
# What is the same code in every mode stays with the host, which proves it
# in tracepoint mode: the other options (histograms per mount, which only
# sums in userspace; pseudo file systems, a full map, the agent's own mount
# namespace) and attribution, which reads cgroup ids alike in every mode.
# The guest's pure v2 tree (the host's is hybrid) is attribution's there
# too: the RDMA application view (test_vm_rdma_app.py, fentry mode) labels
# a Slurm v2 job's events and verb errors by its job, and the NFS scenario
# counts each cgroup's exact bytes in every mode.
# - tracepoint: the host proves this mode on its own kernel, so the guest
#   runs what loads every program on 6.1 (the probe modes) and the workloads
#   the three modes must count alike (the parity test below). io_uring is
#   counted by the same raw tracepoints in every mode: fentry and kprobe run
#   its cases on 6.1.
# The rest of tests/kernel (cgroup churn, chaos, fleet, live view) exercises
# userspace on top of the probe and stays on the host; so does Slurm's v1
# layout on a hybrid host (test_cgroup_v1.py); a pure v1 host is
# test_vm_cgroup_v1.py.
# - the --latency variants split between the two: fentry times fsync alone
#   (entry programs for it, none for reads and writes), kprobe times nothing;
#   each agent start costs a minute or more in the guest.
# - the async engines' matrix runs in fentry mode; kprobe mode keeps libaio on
#   one file system (io_uring is the same raw tracepoints in every mode, and
#   the engines' bytes reach the same hooks the sync cases prove in kprobe).
IO_SUITE = ("tests/kernel/test_io_accuracy.py", "tests/kernel/test_io_async.py")
LATENCY_OFF = "tests/kernel/test_agent_options.py::test_latency_off_keeps_counters_exact"
ASYNC = "tests/kernel/test_io_async.py"
SUITES = {
    "fentry": (*IO_SUITE, f"{LATENCY_OFF}[io.fsync]"),
    "kprobe": ("tests/kernel/test_io_accuracy.py",
               f"{ASYNC}::test_async_engines_count_exact_bytes[tmpfs-libaio]",
               f"{ASYNC}::test_copies_count_the_source_read_and_the_target_write",
               f"{ASYNC}::test_sendfile_to_a_device_counts_only_the_file",
               f"{ASYNC}::test_a_copy_between_two_mounts_reads_on_one_and_writes_on_the_other",
               f"{ASYNC}::test_a_cold_read_fills_the_page_cache_with_the_file",
               f"{LATENCY_OFF}[off]"),
    "tracepoint": ("tests/kernel/test_io_accuracy.py::test_python_worker_bytes_exact",
                   "tests/kernel/test_io_accuracy.py::test_probe_modes_reported"),
}
# the guest's own pytest, one report per mode. Without hypothesis's plugin:
# its end-of-session summary imports hypothesis whole, close to a minute under
# the guest's emulation, and nothing run in the guest uses hypothesis.
_PYTEST = "{python} -m pytest -p no:cacheprovider -p no:hypothesispytest -q"
_MODE_RUN = (_PYTEST + " {suite} --hook-mode {mode} "
             "--junitxml={{results}}/{mode}.xml >{{results}}/{mode}.log 2>&1; echo \"MODE {mode} rc=$?\"")
GUEST = scenarios.Scenario("io", "\n".join(
    ["export TRACEHOUND_PARITY_DIR={results} TRACEHOUND_TEST_DISK_DIR={results}",
     "mountpoint -q /sys/kernel/tracing || mount -t tracefs nodev /sys/kernel/tracing"]
    + [_MODE_RUN.format(python=sys.executable, suite=" ".join(map(shlex.quote, SUITES[m])), mode=m) for m in MODES]
    + [_PYTEST.format(python=sys.executable) + " tests/vm/deliberate_failure.py "
       "--junitxml={results}/deliberate.xml >{results}/deliberate.log 2>&1",
       # that run fails by design: its report, read above, is what counts
       "exit 0"]),
    # the I/O suite in two modes and a subset in the third, under TCG: it
    # has run past 25 min on a slow 2-CPU host with other work running
    3000, lane="files")


@pytest.fixture(scope="session")
def vm_run(guest_boot):
    return guest_boot.get(GUEST)


def _tail(path: Path, n: int = 60) -> str:
    if not path.exists():
        return f"({path.name} missing)"
    return "\n".join(path.read_text(errors="replace").splitlines()[-n:])


def junit_problems(report: Path) -> tuple[int, list[str], list[str]]:
    """(tests run, failures/errors/unexpected skips, expected failures) of a
    junit report written inside the guest."""
    suite = ET.parse(report).getroot()
    suite = suite if suite.tag == "testsuite" else suite.find("testsuite")
    bad = [f"{tc.get('classname')}::{tc.get('name')}: {el.tag}: {(el.get('message') or '')[:300]}"
           for tc in suite.iter("testcase") for el in tc
           if el.tag in ("failure", "error")
           or (el.tag == "skipped" and el.get("type") != "pytest.xfail")]
    known = [tc.get("name") for tc in suite.iter("testcase") for el in tc
             if el.tag == "skipped" and el.get("type") == "pytest.xfail"]
    return int(suite.get("tests")), bad, known


@pytest.mark.parametrize("mode", MODES)
def test_kernel_suite_passes_in_vm(vm_run, mode):
    result, results = vm_run
    report = results / f"{mode}.xml"
    assert report.exists(), (f"no junit report for {mode}; guest output:\n{result.output[-3000:]}"
                             f"\n--- {mode}.log\n{_tail(results / f'{mode}.log')}")
    tests, bad, known = junit_problems(report)
    if known:
        print(f"{mode}: known failures (xfail): {known}")
    assert tests >= (3 if mode == "tracepoint" else 10)
    # Inside the VM everything is available: a skip is a hole in coverage.
    assert not bad, f"{mode} mode in the VM:\n" + "\n".join(bad) + \
        f"\n--- {mode}.log\n{_tail(results / f'{mode}.log')}"


def test_failure_inside_vm_reaches_pytest(vm_run):
    """The same path that reports the suites above turns a probe that cannot
    load in the guest into a failure naming the program, hook and reason."""
    result, results = vm_run
    report = results / "deliberate.xml"
    assert report.exists(), f"no junit report; guest output:\n{result.output[-3000:]}"
    tests, bad, _ = junit_problems(report)
    assert tests == 1 and len(bad) == 1, bad
    assert "test_fentry_on_a_missing_function: failure" in bad[0]
    assert "program fe_vfs_read on fentry/tracehound_no_such_function" in bad[0], bad[0]
    assert "no such function in the kernel's BTF" in bad[0], bad[0]


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
