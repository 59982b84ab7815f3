"""Shared setup for tests that boot the Debian 6.1 kernel under virtme-ng.

Each test module names the guest programs it reads as module-level
``scenarios.Scenario`` objects. A run boots the VM once for every scenario its selected
tests need, instead of once per module: under TCG a boot and the first Python
imports over 9p cost close to a minute each time."""

import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

import scenarios  # noqa: E402

from testbed import vm as harness  # noqa: E402
from tests import suite_report  # noqa: E402

SCENARIOS = pytest.StashKey[list]()


def pytest_configure(config):
    config.addinivalue_line("markers", "vm: boots a Debian 6.1 kernel in a VM (needs scripts/vm-setup, root, ~30 s per boot)")


def pytest_collection_modifyitems(config, items):
    wanted = []
    for item in items:
        if item.get_closest_marker("vm") is None:
            continue
        for scenario in vars(item.module).values():
            if isinstance(scenario, scenarios.Scenario) and scenario not in wanted:
                wanted.append(scenario)
    # the capability checks first: a guest that lacks one fails early and plainly
    wanted.sort(key=lambda sc: sc.name not in ("smoke", "failing"))
    config.stash[SCENARIOS] = wanted
    # Where the VM is mandatory (CI), a missing setup must fail, not skip.
    if os.environ.get("TRACEHOUND_VM_REQUIRED") == "1":
        return
    reason = "VM tests run as root" if os.geteuid() != 0 else harness.is_available()
    if reason is None:
        return
    skip = pytest.mark.skip(reason=f"VM unavailable: {reason}")
    for item in items:
        # the marker, not the keyword: every item below tests/vm has "vm"
        # among its keywords, including what runs inside the guest
        if item.get_closest_marker("vm") is not None:
            item.add_marker(skip)


class GuestBoot:
    """The one boot of this run: each scenario's result and results directory."""

    def __init__(self, base: Path, wanted: list):
        self.base = base
        self.results = {}
        booted = []
        for sc in wanted:
            (base / sc.name).mkdir()
            try:
                if sc.prepare:
                    sc.prepare(base / sc.name)
            except Exception as exc:  # reported by the scenario's own tests
                self.results[sc.name] = harness.VmBootError(
                    f"scenario {sc.name} could not be prepared on the host: {exc!r}")
                continue
            booted.append(sc)
        if booted:
            self.results.update(scenarios.run_scenarios(booted, base))
        self.lines = self._timings(booted)

    def _timings(self, booted) -> list:
        """One line for the run's time budget: the boot, then each scenario."""
        whole = next((r for r in self.results.values() if isinstance(r, harness.VmResult)), None)
        parts = [f"VM, one boot: {whole.total_seconds:.0f} s in all, "
                 f"{whole.boot_seconds:.0f} s to boot" if whole else "VM: no scenario ran"]
        oops = self.base / scenarios.OOPS_NOTE
        if oops.exists():
            parts.insert(0, "first boot ended: " + oops.read_text().splitlines()[0]
                         + " (booted again)")
        lanes: dict[str, list[str]] = {}
        for sc in booted:
            seconds = (self.base / sc.name / "seconds")
            took = seconds.read_text().strip() if seconds.exists() else "?"
            lanes.setdefault(sc.lane, []).append(f"{sc.name} {took} s")
        parts += [f"lane {lane}: {', '.join(runs)}" for lane, runs in lanes.items()]
        return ["; ".join(parts)]

    def get(self, scenario):
        """(VmResult, results dir); raises what kept the scenario from running."""
        result = self.results.get(scenario.name)
        if result is None:
            raise AssertionError(f"scenario {scenario.name} was not in this run's boot")
        if isinstance(result, Exception):
            raise result
        return result, self.base / scenario.name

    def checks(self, scenario):
        """(VmResult, checks.json) of a scenario that writes checks."""
        result, results = self.get(scenario)
        return scenarios.checks_of(result, results)


@pytest.fixture(scope="session")
def guest_boot(request, tmp_path_factory):
    boot = GuestBoot(tmp_path_factory.mktemp("vm"), request.config.stash.get(SCENARIOS, []))
    # the boot is one test's setup: the budget says what it was spent on
    suite_report.budget_notes(request.config).extend(boot.lines)
    return boot
