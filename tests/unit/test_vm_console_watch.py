"""The VM tier's watch on the guest console: an oops ends a boot at once and
the boot is made again, once (testbed/console_watch.py, scenarios.run_scenarios)."""
import sys
from pathlib import Path

import pytest

from testbed import vm as harness
from testbed.console_watch import ConsoleWatch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "vm"))
import scenarios  # noqa: E402

OOPS = b"[  136.956944] BUG: kernel NULL pointer dereference, address: 0000000000000000\n"


def test_an_oops_is_seen_once_its_line_is_whole(tmp_path):
    console = tmp_path / "console.log"
    console.write_bytes(b"[  48.7] virtme-ng-init: starting script\n"
                        b"[ 160.5] watchdog: BUG: soft lockup - CPU#0 stuck for 22s!\n"
                        + OOPS[:20])
    watch = ConsoleWatch(console)
    assert watch.oops() is None             # a slow CPU is no oops; half a line is not read
    with open(console, "ab") as f:
        f.write(OOPS[20:])
    assert watch.oops() == OOPS.decode().strip()
    assert watch.oops() is None             # each line once


def test_a_missing_console_is_no_oops(tmp_path):
    assert ConsoleWatch(tmp_path / "nothing").oops() is None


def test_a_boot_that_oopsed_is_made_again_once_with_fresh_results(tmp_path, monkeypatch):
    sc = scenarios.Scenario("smoke", "true", 60, None, "rdma")
    (tmp_path / "smoke").mkdir()
    boots = []

    def fake_run_in_vm(script, **kw):
        boots.append(script)
        if len(boots) == 1:
            (tmp_path / "smoke" / "rc").write_text("1\n")     # what the first boot left
            raise harness.VmGuestOops("the guest kernel oopsed after 136 s: Oops: 0010")
        (tmp_path / "smoke" / "rc").write_text("0\n")
        return harness.VmResult(0, "", "", 30.0, 90.0, "6.1", "/sys/fs/cgroup")
    monkeypatch.setattr(harness, "run_in_vm", fake_run_in_vm)
    out = scenarios.run_scenarios([sc], tmp_path)
    assert len(boots) == 2 and out["smoke"].returncode == 0
    assert "oopsed after 136 s" in (tmp_path / scenarios.OOPS_NOTE).read_text()


def test_a_second_oops_fails_the_boot(tmp_path, monkeypatch):
    sc = scenarios.Scenario("smoke", "true", 60, None, "rdma")
    (tmp_path / "smoke").mkdir()

    def oopses(script, **kw):
        raise harness.VmGuestOops("the guest kernel oopsed after 99 s: Oops: 0010")
    monkeypatch.setattr(harness, "run_in_vm", oopses)
    out = scenarios.run_scenarios([sc], tmp_path)
    with pytest.raises(harness.VmGuestOops, match="after 99 s"):
        raise out["smoke"]
