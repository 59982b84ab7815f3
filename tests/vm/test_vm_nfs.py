"""Exact read and write bytes on a loopback NFSv4 mount in the Debian 6.1 VM,
in every hook mode, beside the same job on a tmpfs and an ext4. One boot runs
the whole scenario (tests/vm/nfs_guest_checks.py); each mode and file system
comes back as its own test outcome here."""
import scenarios
import pytest

from nfs_guest_checks import FILESYSTEMS, MODES, SIZE

pytestmark = pytest.mark.vm


GUEST = scenarios.guest_script("nfs_guest_checks.py", timeout=1200, name="nfs", lane="files")


@pytest.fixture(scope="session")
def nfs_run(guest_boot):
    return guest_boot.checks(GUEST)


def guest_tail(result, n: int = 40) -> str:
    return "\n--- guest output (tail) ---\n" + "\n".join(result.output.splitlines()[-n:])


def failed(result, data: dict, names: list[str]) -> list[str]:
    """The named checks that failed or never ran, each with its detail."""
    out = []
    for name in names:
        check = data["checks"].get(name)
        if check is None:
            out.append(f"{name}: never ran")
        elif not check["ok"]:
            out.append(f"{name}: {check['detail']}")
    return out


def test_scenario_ran_to_completion(nfs_run):
    scenarios.assert_completed(*nfs_run)


@pytest.mark.parametrize("name", ["nfs_mounted", "local_mounted"])
def test_file_systems_mounted(nfs_run, name):
    result, data = nfs_run
    bad = failed(result, data, [name])
    assert not bad, "\n".join(bad) + guest_tail(result)


@pytest.mark.parametrize("mode", MODES)
def test_agent_runs_in_mode(nfs_run, mode):
    """A mode the guest kernel cannot hook fails here; it is never skipped."""
    result, data = nfs_run
    bad = failed(result, data, [f"{mode}_agent_started", f"{mode}_mode_attached",
                                f"{mode}_agent_stopped"])
    assert not bad, f"{mode} mode:\n" + "\n".join(bad) + guest_tail(result)


@pytest.mark.parametrize("fs", FILESYSTEMS)
@pytest.mark.parametrize("mode", MODES)
def test_exact_bytes(nfs_run, mode, fs):
    result, data = nfs_run
    names = [f"{mode}_{fs}_workload", f"{mode}_{fs}_write_bytes", f"{mode}_{fs}_read_bytes",
             f"{mode}_{fs}_no_bytes_elsewhere"]
    if fs == "nfs4":
        names.append(f"{mode}_{fs}_over_the_wire")
    bad = failed(result, data, names)
    got = data.get("measured", {}).get(f"{mode}/{fs}")
    assert not bad, (f"{mode} mode, {fs}: expected {SIZE} bytes written and read, "
                     f"counted {got}:\n" + "\n".join(bad) + guest_tail(result))
