import os
import shutil
import sys

import pytest

# CI skip policy and the per-tier time budget printed at the end of every run
pytest_plugins = ["tests.suite_report"]

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def pytest_addoption(parser):
    parser.addoption("--hook-mode", default="auto",
                     help="hook mode the kernel-tier agent is forced into (auto, fentry, kprobe, tracepoint)")


def tracehound_cmd() -> list[str]:
    """The installed CLI next to the interpreter running the tests."""
    exe = os.path.join(os.path.dirname(sys.executable), "tracehound")
    if os.path.exists(exe):
        return [exe]
    found = shutil.which("tracehound")
    if not found:
        pytest.fail("tracehound is not installed in this environment: run scripts/install --dev")
    return [found]
