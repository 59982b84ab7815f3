"""Shared setup for tests that boot the Debian 6.1 kernel under virtme-ng."""

import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

import harness  # noqa: E402


def pytest_configure(config):
    config.addinivalue_line("markers", "vm: boots a Debian 6.1 kernel in a VM (needs scripts/vm-setup, root, ~30 s per boot)")


def pytest_collection_modifyitems(config, items):
    # Where the VM is mandatory (CI), a missing setup must fail, not skip.
    if os.environ.get("TRACEHOUND_VM_REQUIRED") == "1":
        return
    reason = None
    if os.geteuid() != 0:
        reason = "VM tests run as root"
    else:
        reason = harness.is_available()
    if reason is None:
        return
    skip = pytest.mark.skip(reason=f"VM unavailable: {reason}")
    for item in items:
        # the marker, not the keyword: every item below tests/vm has "vm"
        # among its keywords, including what runs inside the guest
        if item.get_closest_marker("vm") is not None:
            item.add_marker(skip)
