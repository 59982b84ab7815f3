"""The XID catalog: lookups, the unknown entry, and the shape of the advice
(fatal XIDs ask for a reset or reboot, application XIDs for a restart)."""
import pytest

from tracehound.gpu import xid_catalog as cat

# XIDs an operator of a GPU fleet meets and expects an answer for
WELL_KNOWN = (8, 13, 31, 32, 38, 43, 44, 45, 48, 56, 57, 58, 61, 62, 63, 64, 68, 69, 73,
              74, 79, 92, 94, 95, 109, 119, 120, 121, 123, 140, 143, 149, 154)


@pytest.mark.parametrize("xid", WELL_KNOWN)
def test_well_known_xids_are_in_the_catalog(xid):
    info = cat.lookup(xid)
    assert info.known and info.xid == xid
    assert info.name.strip() and info.action.strip()


def test_every_entry_is_well_formed():
    seen = list(cat.entries())
    assert [i.xid for i in seen] == sorted({i.xid for i in seen})
    for info in seen:
        assert info.severity in cat.SEVERITIES, info
        assert info.name.strip() and info.action.strip(), info
        assert info.known
        assert len(info.name) <= 70, "names are short labels"


def test_unknown_xid_gets_an_error_entry():
    info = cat.lookup(9999)
    assert not info.known
    assert info.xid == 9999
    assert info.severity == cat.ERROR
    assert info.action


@pytest.mark.parametrize("xid", (48, 62, 64, 74, 79, 95, 109, 119, 120, 140, 143, 149))
def test_xids_that_need_a_reset_or_reboot_are_fatal(xid):
    assert cat.is_fatal(xid)
    action = cat.lookup(xid).action.lower()
    assert "reset" in action or "reboot" in action or "power cycle" in action


@pytest.mark.parametrize("xid", (13, 31, 43, 69))
def test_application_faults_ask_for_an_application_restart(xid):
    info = cat.lookup(xid)
    assert info.severity == cat.ERROR
    assert "application" in info.action


def test_ecc_family_is_graded():
    # contained error: the application restarts, the GPU keeps running
    assert cat.lookup(94).severity == cat.ERROR
    # uncontained: every application on the GPU is affected
    assert cat.lookup(95).severity == cat.FATAL
    # a high corrected-error rate is degradation, not a failure
    assert cat.lookup(92).severity == cat.WARNING
    # a pending remap is applied at the next reset; a failed one needs it now
    assert cat.lookup(63).severity == cat.WARNING
    assert cat.lookup(64).severity == cat.FATAL


def test_follow_up_xids_are_not_alarms():
    assert cat.lookup(45).severity == cat.INFO
    assert cat.lookup(154).severity == cat.INFO


def test_fallen_off_the_bus_asks_for_a_node_reboot():
    assert "reboot the node" in cat.lookup(79).action


def test_nvlink_errors_point_at_the_link():
    for xid in (74, 149):
        assert "NVLink" in cat.lookup(xid).action


def test_catalog_is_read_only():
    with pytest.raises(TypeError):
        cat.CATALOG[79] = cat.lookup(13)


@pytest.mark.parametrize("detail,action", [
    ("GPU recovery action changed from 0x0 (None) to 0x2 (Node Reboot Required)",
     "Node Reboot Required"),
    ("GPU recovery action changed from 0x2 (Node Reboot Required) to 0x0 (None)", "None"),
    ("GPU recovery action changed to (GPU Reset Required)", "GPU Reset Required"),
    ("something else", None),
    ("", None),
])
def test_xid154_recovery_action(detail, action):
    assert cat.xid154_recovery_action(detail) == action
