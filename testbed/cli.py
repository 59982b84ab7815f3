"""The tracehound command line the tests and benchmarks run."""
import os
import shutil
import sys

import pytest


def tracehound_cmd() -> list[str]:
    """The installed CLI next to the interpreter running the tests."""
    exe = os.path.join(os.path.dirname(sys.executable), "tracehound")
    if os.path.exists(exe):
        return [exe]
    found = shutil.which("tracehound")
    if not found:
        pytest.fail("tracehound is not installed in this environment: run scripts/install --dev")
    return [found]
