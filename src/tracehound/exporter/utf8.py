"""Text the agent emits (label values, help, JSON strings) as valid UTF-8.

Names on the node are bytes: a cgroup, a process or a mount point may be
named with bytes that are not UTF-8. The agent reads them with
surrogateescape, so the exact bytes still reach the kernel when the name is
used as a path; what it shows of them replaces each undecodable byte with
U+FFFD, as a UTF-8 decoder with errors="replace" would. A lone surrogate
that did not come from surrogateescape (a code point UTF-8 cannot carry)
becomes U+FFFD too.
"""
from __future__ import annotations

import re

# surrogates other than U+DC80..U+DCFF, the ones surrogateescape makes of bytes 0x80..0xFF
_FOREIGN_SURROGATE = re.compile("[\ud800-\udc7f\udd00-\udfff]")


def valid_utf8(text: str) -> str:
    """`text` where UTF-8 can encode it; each undecodable byte kept as a
    surrogate shown as U+FFFD."""
    if text.isascii():
        return text
    try:
        text.encode("utf-8")
        return text
    except UnicodeEncodeError:
        pass
    text = _FOREIGN_SURROGATE.sub("\ufffd", text)
    return text.encode("utf-8", "surrogateescape").decode("utf-8", "replace")


def valid_json(value):
    """A JSON-able value with every string in it (keys included) valid UTF-8."""
    if isinstance(value, str):
        return valid_utf8(value)
    if isinstance(value, dict):
        return {valid_json(k) if isinstance(k, str) else k: valid_json(v)
                for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [valid_json(v) for v in value]
    return value
