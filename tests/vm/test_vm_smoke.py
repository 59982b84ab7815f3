"""Proves the VM harness gives us what the host kernel cannot: fentry, kprobes
and soft-RoCE on a real Debian 6.1 kernel, plus the plumbing (exit codes,
output capture, writable results dir) the kernel-level tests rely on.
"""

import re
import shlex
import sys
from pathlib import Path

import pytest

import scenarios

from testbed import vm as harness

pytestmark = pytest.mark.vm

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
CHECKS = [
    "kernel_6_1", "bpffs", "tracefs", "debugfs", "cgroup2", "same_python",
    "fentry", "kprobe_pmu", "kprobe_attach", "rdma_rxe", "ibv_devices",
    "results_writable",
]


GUEST = scenarios.Scenario(
    "smoke", f"HOST_PYTHON={shlex.quote(sys.executable)} bash tests/vm/smoke_checks.sh {{results}}", 600)
# a command that fails, run in the same boot: its exit status and both its
# streams must come back as its own, not as the boot's
FAILING = scenarios.Scenario("failing", "echo to-stdout; echo to-stderr >&2; pwd; false; exit 42", 60)


@pytest.fixture(scope="session")
def smoke(guest_boot):
    """Every check of smoke_checks.sh; tests below only read its results."""
    result, results = guest_boot.get(GUEST)
    checks = dict(re.findall(r"^CHECK (\S+) (.*)$", result.output, re.M))
    return result, checks, results


def test_vm_boots_and_runs_all_checks(smoke):
    result, _, _ = smoke
    print(f"boot {result.boot_seconds:.1f} s, total {result.total_seconds:.1f} s, cgroup2 at {result.cgroup2}")
    assert result.returncode == 0, result.output
    assert "CHECKS DONE" in result.output, f"check script did not finish:\n{result.output}"
    assert result.kernel_release.startswith("6.1.0"), result.kernel_release
    assert result.cgroup2, "harness did not report where cgroup2 is mounted"


@pytest.mark.parametrize("name", CHECKS)
def test_vm_capability(smoke, name):
    result, checks, results = smoke
    assert name in checks, f"check {name} did not report; output:\n{result.output}"
    detail = (results / "checks.log").read_text() if (results / "checks.log").exists() else ""
    assert checks[name] == "ok", f"{name}: {checks[name]}\n--- checks.log ---\n{detail}"


def test_vm_writes_reach_host(smoke):
    _, _, results = smoke
    assert (results / "from-vm.txt").read_text().strip() == "written in the VM"


def test_vm_failing_command_reports_exit_code_and_output(guest_boot):
    result, _ = guest_boot.get(FAILING)
    assert result.returncode == 42, result.output
    lines = result.output.splitlines()
    assert "to-stdout" in lines and "to-stderr" in lines, result.output
    assert str(REPO) in lines, f"command did not start in {REPO}: {result.output}"


def test_vm_timeout_raises_boot_error():
    # Far too short to boot under emulation: must raise, never return quietly.
    with pytest.raises(harness.VmBootError, match="timed out"):
        harness.run_in_vm("true", timeout=3)
