"""cgroup v2 controller files the faults write (io.max, rdma.max), with the
bookkeeping that makes each write exactly reversible.

A keyed file such as io.max holds one line per key ("254:0 rbps=max
wbps=1048576 ..."): rollback writes back the line that was there, or the
"unlimited" line that makes the kernel drop it. A controller is only
usable in a cgroup when every ancestor lists it in cgroup.subtree_control;
the ancestors where this fault had to add it are remembered and cleared
again on rollback, deepest first.
"""
from __future__ import annotations

import errno
import os

from . import FaultError

SUBTREE_CONTROL = "cgroup.subtree_control"


def _names(directory: str, filename: str) -> set[str]:
    try:
        with open(os.path.join(directory, filename)) as f:
            return set(f.read().split())
    except OSError:
        return set()


def controllers(directory: str) -> set[str]:
    """Controllers available to children of this cgroup."""
    return _names(directory, "cgroup.controllers")


def ancestors_to_enable(root: str, target: str, controller: str) -> list[str]:
    """Directories from the root down to target's parent that lack the
    controller in cgroup.subtree_control (top first)."""
    root = os.path.normpath(root)
    target = os.path.normpath(target)
    rel = os.path.relpath(target, root)
    if rel.startswith(".."):
        raise FaultError(f"{target} is not below the cgroup root {root}")
    if controller not in controllers(root):
        raise FaultError(f"the {controller} controller is not available in the cgroup v2 "
                         f"hierarchy at {root} (bound to a v1 hierarchy, or not built in)")
    chain = [root]
    for part in rel.split(os.sep)[:-1] if rel != "." else []:
        chain.append(os.path.join(chain[-1], part))
    return [d for d in chain if controller not in _names(d, SUBTREE_CONTROL)]


def enable(directories: list[str], controller: str) -> None:
    for d in directories:
        write_line(os.path.join(d, SUBTREE_CONTROL), f"+{controller}")


def disable(directories: list[str], controller: str) -> list[str]:
    """Clear the controller where it was added, deepest first; returns what
    could not be cleared (a child enabled it meanwhile)."""
    failed = []
    for d in reversed(directories):
        if not os.path.isdir(d) or controller not in _names(d, SUBTREE_CONTROL):
            continue
        try:
            write_line(os.path.join(d, SUBTREE_CONTROL), f"-{controller}")
        except FaultError as exc:
            failed.append(str(exc))
    return failed


def read_keyed(path: str) -> dict[str, str]:
    """{key: whole line} of a keyed controller file."""
    try:
        with open(path) as f:
            lines = [ln.strip() for ln in f if ln.strip()]
    except FileNotFoundError:
        return {}
    except OSError as exc:
        raise FaultError(f"cannot read {path}: {exc.strerror}") from None
    return {ln.split()[0]: ln for ln in lines}


def restore_keyed(path: str, key: str, previous: str | None, unlimited: str,
                  enabled: list[str], controller: str) -> None:
    """Undo a keyed write: put back the line the key had (or the unlimited
    line, which makes the kernel drop it), then clear the controller where
    it was enabled for the write."""
    if os.path.exists(path) and read_keyed(path).get(key) != previous:
        write_line(path, previous or unlimited)
    failed = disable(enabled, controller)
    if failed:
        raise FaultError("; ".join(failed))


def write_line(path: str, text: str) -> None:
    try:
        with open(path, "w") as f:
            f.write(text)
    except OSError as exc:
        hint = ""
        if exc.errno == errno.ENOENT:
            hint = " (controller not enabled for this cgroup?)"
        raise FaultError(f"cannot write '{text}' to {path}: {exc.strerror}{hint}") from None
