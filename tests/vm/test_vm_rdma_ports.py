"""RDMA port counters and link flaps on a real soft-RoCE device (rdma_rxe) in
the Debian 6.1 VM. One boot runs the whole scenario
(tests/vm/rdma_ports_checks.py); each of its checks comes back as its own
test outcome here."""
import scenarios
import pytest

pytestmark = pytest.mark.vm

CHECKS = [
    "rxe_sysfs_layout",
    "reader_sees_rxe_port",
    "pingpong_ran",
    "reader_matches_sysfs",
    "collector_matches_sysfs",
    "packet_counters_grew",
    "no_read_errors",
    "link_flap_fired_once",
    "link_restored_fired_once",
    "link_flap_fired_again",
    "flap_events_in_order",
]


GUEST = scenarios.guest_script("rdma_ports_checks.py", timeout=600, name="rdma_ports")


@pytest.fixture(scope="session")
def ports_run(guest_boot):
    return guest_boot.checks(GUEST)


def test_scenario_ran_to_completion(ports_run):
    scenarios.assert_completed(*ports_run)


@pytest.mark.parametrize("name", CHECKS)
def test_rdma_ports_check(ports_run, name):
    scenarios.assert_check(*ports_run, name)
