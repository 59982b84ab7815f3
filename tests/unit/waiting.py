"""Waiting on a condition in tests, instead of sleeping for a guessed time.

The deadline is generous on purpose: it only decides how long a broken test
takes to fail on a loaded machine, never whether a working one passes."""
import time

DEADLINE_S = 30.0


def wait_for(cond, timeout: float = DEADLINE_S, interval: float = 0.01) -> bool:
    """Poll cond() until it is true; its last value once `timeout` s pass."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if cond():
            return True
        time.sleep(interval)
    return bool(cond())


def wait_until(cond, what: str, timeout: float = DEADLINE_S) -> None:
    """wait_for, failing the test with `what` (what never happened)."""
    if not wait_for(cond, timeout):
        raise AssertionError(f"still waiting after {timeout:g} s for {what}")
