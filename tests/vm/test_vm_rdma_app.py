"""The application's view (uprobes on the system's libibverbs) against the
kernel's, on a real soft-RoCE device in the Debian 6.1 VM. One boot runs the
scenario (tests/vm/rdma_app_checks.py); each check is its own outcome here.
The misuse program (verbs_misuse.c) is built on the host beforehand."""
import shutil
import subprocess
from pathlib import Path

import harness
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


@pytest.fixture(scope="session")
def app_run(tmp_path_factory):
    if not Path("/usr/include/infiniband/verbs.h").exists() or not shutil.which("gcc"):
        pytest.fail("the misuse program needs gcc and libibverbs-dev (scripts/install --dev)")
    results = tmp_path_factory.mktemp("vm-rdma-app")
    binary = results / "verbs_misuse"
    subprocess.run(["gcc", "-O1", "-Wall", "-o", str(binary), str(HERE / "verbs_misuse.c"),
                    "-libverbs"], check=True)
    return harness.run_guest_checks("rdma_app_checks.py", results, timeout=900,
                                    args=(str(binary),))


def test_scenario_ran_to_completion(app_run):
    harness.assert_completed(*app_run)


@pytest.mark.parametrize("name", CHECKS)
def test_rdma_app_check(app_run, name):
    harness.assert_check(*app_run, name)
