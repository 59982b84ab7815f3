"""Two rules every run of the suite follows, loaded by the root conftest.

1. Under CI (``CI=true``) a skipped test is a failure unless its reason is one
   the CI machine cannot help: no NVIDIA GPU, or an enum the C code uses only as
   constants (so it is not in the object's BTF to check). Everything else a test
   might skip for -- a tool, a package, root, a prepared VM -- the install step
   provides, so its absence is a broken install, not a hole to step around.
2. Every run ends with its time budget: wall time per tier and the slowest
   tests, so a tier that grows shows in every CI log.
"""
import os
import time
from collections import defaultdict

import pytest

# The only reasons a test may skip in CI (a prefix of the skip's reason).
CI_ALLOWED_SKIPS = ("needs an NVIDIA GPU", "enum ")
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
    """Per-tier wall time and per-test durations, from the reports."""

    def __init__(self):
        self.first = {}
        self.last = {}
        self.count = defaultdict(int)
        self.durations = defaultdict(float)
        self.skips = defaultdict(int)
        self.started = time.time()

    def pytest_runtest_logreport(self, report):
        tier = tier_of(report.nodeid)
        start = getattr(report, "start", None)
        stop = getattr(report, "stop", None)
        if start is not None and stop is not None:
            self.first[tier] = min(self.first.get(tier, start), start)
            self.last[tier] = max(self.last.get(tier, stop), stop)
        self.durations[report.nodeid] += report.duration
        if report.when == "call" or (report.when == "setup" and not report.passed):
            self.count[tier] += 1
        if report.skipped and not hasattr(report, "wasxfail"):
            reason = skip_reason(report)
            allowed = [p for p in CI_ALLOWED_SKIPS if reason.startswith(p)]
            self.skips[(allowed[0].strip() + "...") if allowed else reason[:100]] += 1

    def pytest_terminal_summary(self, terminalreporter):
        if not self.count:
            return
        tr = terminalreporter
        tr.section("time budget")
        tr.write_line(f"{'tier':<8} {'tests':>6} {'wall s':>8} {'test s':>8}")
        per_tier = defaultdict(float)
        for nodeid, seconds in self.durations.items():
            per_tier[tier_of(nodeid)] += seconds
        for tier in sorted(self.count):
            wall = self.last.get(tier, 0) - self.first.get(tier, 0)
            tr.write_line(f"{tier:<8} {self.count[tier]:>6} {wall:>8.0f} {per_tier[tier]:>8.0f}")
        tr.write_line(f"{'all':<8} {sum(self.count.values()):>6} {time.time() - self.started:>8.0f} "
                      f"{sum(per_tier.values()):>8.0f}")
        tr.write_line("")
        tr.write_line(f"{SLOWEST} slowest tests (setup + call + teardown, s):")
        slowest = sorted(self.durations.items(), key=lambda kv: -kv[1])[:SLOWEST]
        for nodeid, seconds in slowest:
            tr.write_line(f"{seconds:8.1f}  {nodeid}")
        if self.skips:
            tr.write_line("")
            tr.write_line("skipped, by reason: " + "; ".join(
                f"{n} x {reason}" for reason, n in sorted(self.skips.items(), key=lambda kv: -kv[1])))


def pytest_configure(config):
    # one Budget per run, in the process that prints (not in xdist workers)
    if not hasattr(config, "workerinput"):
        config.pluginmanager.register(Budget(), "tracehound-time-budget")
