"""Two rules every run of the suite follows, loaded by the root conftest.

1. Under CI (``CI=true``) a skipped test is a failure unless its reason is one
   the CI machine cannot help: no NVIDIA GPU. Everything else a test
   might skip for -- a tool, a package, root, a prepared VM -- the install step
   provides, so its absence is a broken install, not a hole to step around.
2. Every run ends with its time budget: wall time per tier and the slowest
   tests, so a tier that grows shows in every CI log.
"""
import json
import os
import sys
import time
from collections import defaultdict

import pytest

# The only reasons a test may skip in CI (a prefix of the skip's reason).
CI_ALLOWED_SKIPS = ("needs an NVIDIA GPU",)
SLOWEST = 25


def in_ci() -> bool:
    return os.environ.get("CI", "").lower() in ("true", "1", "yes")


def tier_of(nodeid: str) -> str:
    parts = nodeid.split("/")
    return parts[1] if len(parts) > 2 and parts[0] == "tests" else "other"


def skip_reason(report) -> str:
    longrepr = report.longrepr
    if isinstance(longrepr, tuple) and len(longrepr) == 3:
        return str(longrepr[2]).removeprefix("Skipped: ")
    return str(longrepr)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if not (report.skipped and in_ci()) or hasattr(report, "wasxfail"):
        return
    reason = skip_reason(report)
    if reason.startswith(CI_ALLOWED_SKIPS):
        return
    report.outcome = "failed"
    report.longrepr = (f"skipped in CI, where the install step provides what it needs: {reason}\n"
                       f"(only {', '.join(repr(p) for p in CI_ALLOWED_SKIPS)} may skip in CI)")


class Budget:
    """Per-tier wall time, per-test durations and outcomes, from the reports.
    ``--budget-json FILE`` saves them, so that runs made side by side (the VM
    tier beside the host tiers) can be printed as one: ``python -m
    tests.suite_report FILE...``."""

    def __init__(self, save_to: str = "", notes: list | None = None):
        self.save_to = save_to
        self.notes = notes if notes is not None else []
        self.first, self.last = {}, {}
        self.count = defaultdict(int)
        self.durations = defaultdict(float)
        self.skips = defaultdict(int)
        self.outcomes = defaultdict(int)
        self.started = time.time()

    def pytest_runtest_logreport(self, report):
        tier = tier_of(report.nodeid)
        start, stop = getattr(report, "start", None), getattr(report, "stop", None)
        if start is not None and stop is not None:
            self.first[tier] = min(self.first.get(tier, start), start)
            self.last[tier] = max(self.last.get(tier, stop), stop)
        self.durations[report.nodeid] += report.duration
        if report.when == "call" or (report.when == "setup" and not report.passed):
            self.count[tier] += 1
            self.outcomes["skipped" if report.skipped else report.outcome] += 1
        elif report.when == "teardown" and report.failed:
            self.outcomes["error"] += 1
        if report.skipped and not hasattr(report, "wasxfail"):
            reason = skip_reason(report)
            allowed = [p for p in CI_ALLOWED_SKIPS if reason.startswith(p)]
            self.skips[(allowed[0].strip() + "...") if allowed else reason[:100]] += 1

    def record(self) -> dict:
        return {"tiers": {t: {"tests": self.count[t],
                              "wall_s": self.last.get(t, 0) - self.first.get(t, 0)}
                          for t in self.count},
                "wall_s": time.time() - self.started, "durations": dict(self.durations),
                "skips": dict(self.skips), "outcomes": dict(self.outcomes),
                "notes": list(self.notes)}

    def pytest_terminal_summary(self, terminalreporter):
        if not self.count:
            return
        record = self.record()
        terminalreporter.section("time budget")
        for line in budget_lines([record]):
            terminalreporter.write_line(line)
        if self.save_to:
            with open(self.save_to, "w") as f:
                json.dump(record, f)


def budget_lines(records: list[dict], wall_s: float | None = None) -> list[str]:
    """The per-tier table, the slowest tests and the skips of one or more runs."""
    tiers, durations, skips = {}, {}, defaultdict(int)
    for rec in records:
        for tier, t in rec["tiers"].items():
            seen = tiers.setdefault(tier, {"tests": 0, "wall_s": 0.0})
            seen["tests"] += t["tests"]
            seen["wall_s"] += t["wall_s"]
        durations.update(rec["durations"])
        for reason, n in rec["skips"].items():
            skips[reason] += n
    per_tier = defaultdict(float)
    for nodeid, seconds in durations.items():
        per_tier[tier_of(nodeid)] += seconds
    lines = [f"{'tier':<8} {'tests':>6} {'wall s':>8} {'test s':>8}"]
    for tier in sorted(tiers):
        lines.append(f"{tier:<8} {tiers[tier]['tests']:>6} {tiers[tier]['wall_s']:>8.0f} "
                     f"{per_tier[tier]:>8.0f}")
    wall = wall_s if wall_s is not None else max(rec["wall_s"] for rec in records)
    lines += [f"{'all':<8} {sum(t['tests'] for t in tiers.values()):>6} {wall:>8.0f} "
              f"{sum(per_tier.values()):>8.0f}", "",
              f"{SLOWEST} slowest tests (setup + call + teardown, s):"]
    for nodeid, seconds in sorted(durations.items(), key=lambda kv: -kv[1])[:SLOWEST]:
        lines.append(f"{seconds:8.1f}  {nodeid}")
    notes = [note for rec in records for note in rec.get("notes", [])]
    if notes:
        lines += [""] + notes
    if skips:
        lines += ["", "skipped, by reason: " + "; ".join(
            f"{n} x {reason}" for reason, n in sorted(skips.items(), key=lambda kv: -kv[1]))]
    return lines


NOTES = pytest.StashKey[list]()


def budget_notes(config) -> list:
    """Lines a tier adds to the run's budget (the VM tier: its one boot's scenarios)."""
    return config.stash.setdefault(NOTES, [])


def pytest_addoption(parser):
    parser.addoption("--budget-json", default="",
                     help="save this run's time budget (tiers, durations, skips) as JSON")


def pytest_configure(config):
    # one Budget per run, in the process that prints (not in xdist workers)
    if not hasattr(config, "workerinput"):
        config.pluginmanager.register(Budget(config.getoption("budget_json"),
                                             budget_notes(config)),
                                      "tracehound-time-budget")


def main(argv: list[str]) -> int:
    """Print runs made side by side as one budget; the last line sums their outcomes."""
    wall = None
    if argv[:1] == ["--wall"]:
        wall, argv = float(argv[1]), argv[2:]
    records = []
    for path in argv:
        with open(path) as f:
            records.append(json.load(f))
    print("=" * 30 + " time budget of the whole run " + "=" * 30)
    for line in budget_lines(records, wall) if records else ["no run left its budget"]:
        print(line)
    outcomes = defaultdict(int)
    for rec in records:
        for outcome, n in rec["outcomes"].items():
            outcomes[outcome] += n
    print(", ".join(f"{outcomes[o]} {o}" for o in ("passed", "failed", "error", "skipped")
                    if outcomes[o]) + f" in {wall if wall is not None else 0:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
