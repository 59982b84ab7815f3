"""RDMA state tracking on a real soft-RoCE device (rdma_rxe) in the Debian 6.1
VM. One boot runs the whole scenario (tests/vm/rdma_guest_checks.py); each of
its checks comes back as its own test outcome here."""
import scenarios
import pytest

pytestmark = pytest.mark.vm

CHECKS = [
    "fentry_mode_attached",
    "mirror_matches_kernel_at_start",
    "app_created_objects",
    "objects_match_kernel",
    "verb_calls_counted",
    "qp_transitions_counted",
    "rdma_show_cli",
    "objects_released_on_exit",
    "objects_released_on_kill",
    "reg_mr_enomem_counted",
    "reg_mr_anomaly_raised",
    "anomaly_event_logged",
    "rdmacg_eagain_counted",
    "port_error_event_counted",
    "port_active_event_counted",
    "detector_looked",
    "no_leak_flagged",
    "no_mirror_mismatch",
    "injected_leak_flagged",
    "injected_mismatch_flagged",
    "instances_pin_apart",
    "agent_stops_cleanly",
    "stopped_instance_unpinned",
    "kprobe_mode_attached",
    "kprobe_app_created_objects",
    "kprobe_objects_match_kernel",
    "kprobe_objects_released_on_exit",
    "kprobe_objects_released_on_kill",
    "kprobe_reg_mr_enomem_counted",
    "nothing_pinned_after_stop",
]


GUEST = scenarios.guest_script("rdma_guest_checks.py", timeout=1500, name="rdma")


@pytest.fixture(scope="session")
def rdma_run(guest_boot):
    return guest_boot.checks(GUEST)


def test_scenario_ran_to_completion(rdma_run):
    scenarios.assert_completed(*rdma_run)


@pytest.mark.parametrize("name", CHECKS)
def test_rdma_check(rdma_run, name):
    scenarios.assert_check(*rdma_run, name)
