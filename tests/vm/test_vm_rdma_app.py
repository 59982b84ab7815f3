"""The application's view (uprobes on the system's libibverbs) against the
kernel's, on a real soft-RoCE device in the Debian 6.1 VM. One boot runs the
scenario (tests/vm/rdma_app_checks.py); each check is its own outcome here.
The misuse program (verbs_misuse.c) is built on the host beforehand."""
import shutil
import subprocess
from pathlib import Path

import scenarios
import pytest

pytestmark = pytest.mark.vm

HERE = Path(__file__).resolve().parent
CHECKS = [
    "app_view_attached",
    "app_view_matches_kernel",
    "rdma_show_app_column",
    "pyverbs_no_view_anomaly",
    "pingpong_no_view_anomaly",
    "perftest_no_view_anomaly",
    "refused_destroy_flagged",
    "app_verb_error_has_its_owner",
    "rdma_show_says_released",
    "app_view_has_the_kernels_errno",
    "killed_mid_setup_leaves_nothing",
    "own_library_attached",
    "agent_stops_cleanly",
]


def build_misuse_program(results: Path) -> None:
    """Built on the host: gcc under TCG would cost the boot seconds."""
    if not Path("/usr/include/infiniband/verbs.h").exists() or not shutil.which("gcc"):
        raise RuntimeError("the misuse program needs gcc and libibverbs-dev (scripts/install --dev)")
    subprocess.run(["gcc", "-O1", "-Wall", "-o", str(results / "verbs_misuse"),
                    str(HERE / "verbs_misuse.c"), "-libverbs"], check=True)


GUEST = scenarios.guest_script("rdma_app_checks.py", "{results}/verbs_misuse", timeout=1200,
                             name="rdma_app", prepare=build_misuse_program)


@pytest.fixture(scope="session")
def app_run(guest_boot):
    return guest_boot.checks(GUEST)


def test_scenario_ran_to_completion(app_run):
    scenarios.assert_completed(*app_run)


@pytest.mark.parametrize("name", CHECKS)
def test_rdma_app_check(app_run, name):
    scenarios.assert_check(*app_run, name)
