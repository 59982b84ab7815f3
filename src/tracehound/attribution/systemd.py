"""systemd unit attribution and systemd's name escaping.

systemd writes a unit's cgroup as ``<slice>/<unit>``, nesting slices by their
dash-separated prefix (``user.slice/user-1000.slice/session-3.scope``). Any
byte that is not allowed in a unit name is written as ``\\xNN``; ``-`` is one
of them inside a name component, which is why libvirt machines appear as
``machine-qemu\\x2d1\\x2dvm1.scope``.

The ``unit`` label is the innermost ``.service`` or ``.scope`` on the path
(the unit that started the processes), else the innermost ``.slice``.
Services and scopes are preferred because a slice only groups units: a
process always lives in a service or scope unless it was put somewhere by
hand, and then the slice is the best systemd can say.
"""
from __future__ import annotations

import re
from collections.abc import Sequence

from .workload import Workload

_HEX_ESCAPE = re.compile(rb"\\x([0-9a-fA-F]{2})")
_LEAF_SUFFIXES = (".service", ".scope")
_GROUP_SUFFIX = ".slice"


def unescape(name: str) -> str:
    """Undo systemd's ``\\xNN`` escaping; the bytes are UTF-8 (systemd escapes
    every byte of a multi-byte character separately)."""
    if "\\x" not in name:
        return name
    raw = name.encode("utf-8", "surrogateescape")
    decoded = _HEX_ESCAPE.sub(lambda m: bytes([int(m.group(1), 16)]), raw)
    return decoded.decode("utf-8", "replace")


def split_path(cgroup_path: str) -> list[str]:
    return [c for c in cgroup_path.split("/") if c]


def nearest_unit(components: Sequence[str]) -> str:
    """The raw (still escaped) unit component the label is taken from."""
    for comp in reversed(components):
        if comp.endswith(_LEAF_SUFFIXES):
            return comp
    for comp in reversed(components):
        if comp.endswith(_GROUP_SUFFIX):
            return comp
    return ""


def match(components: Sequence[str]) -> Workload | None:
    unit = nearest_unit(components)
    if not unit:
        return None
    return Workload(kind="systemd", unit=unescape(unit))
