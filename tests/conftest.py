import os

from testbed.cli import tracehound_cmd  # noqa: F401  (tests import it from here)

# CI skip policy and the per-tier time budget printed at the end of every run
pytest_plugins = ["tests.suite_report"]

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def pytest_addoption(parser):
    parser.addoption("--hook-mode", default="auto",
                     help="hook mode the kernel-tier agent is forced into (auto, fentry, kprobe, tracepoint)")

