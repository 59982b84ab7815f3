"""A pure cgroup v1 host, which this host (hybrid) cannot be: in the Debian
6.1 guest, in a mount namespace with cgroup2 unmounted and only a v1 freezer
hierarchy, the agent starts, counts a Slurm v1 job by its freezer cgroup
with exact bytes, and says so (tests/vm/cgroup_v1_guest.py)."""
import shlex
import sys

import scenarios
import pytest

pytestmark = pytest.mark.vm

# unshare: the guest's other scenarios keep their v2 tree
GUEST = scenarios.Scenario(
    "cgroup_v1",
    f"unshare -m {shlex.quote(sys.executable)} tests/vm/cgroup_v1_guest.py {{results}}", 600,
    lane="files")


@pytest.fixture(scope="session")
def v1_run(guest_boot):
    return guest_boot.checks(GUEST)


def test_scenario_ran_to_completion(v1_run):
    scenarios.assert_completed(*v1_run)


@pytest.mark.parametrize("check", ["pure_v1", "agent_starts", "job_io", "job_bytes_exact",
                                   "key_metric"])
def test_pure_v1_host(v1_run, check):
    scenarios.assert_check(*v1_run, check)
