"""Text the agent emits (label values, help, JSON strings) as valid UTF-8,
and label values no longer than MAX_LABEL_BYTES.

Names on the node are bytes: a cgroup, a process or a mount point may be
named with bytes that are not UTF-8. The agent reads them with
surrogateescape, so the exact bytes still reach the kernel when the name is
used as a path; what it shows of them replaces each undecodable byte with
U+FFFD, as a UTF-8 decoder with errors="replace" would. A lone surrogate
that did not come from surrogateescape (a code point UTF-8 cannot carry)
becomes U+FFFD too.

Anyone names cgroups, and a path of nested names runs to kilobytes. A
Prometheus with `label_value_length_limit` refuses a scrape with a longer
value whole: the node would vanish from it. A longer value is shown as its
first bytes, an ellipsis and a digest of the whole, so two long names
stay two label sets, and the same name is the same label set every scrape.
"""
from __future__ import annotations

import hashlib
import re

# a label value's most bytes: Prometheus's label_value_length_limit, where
# an operator sets one, is 1024 or more in the configurations seen
MAX_LABEL_BYTES = 1024
_DIGEST_HEX = 16
_MARK = "\u2026"              # …, 3 bytes

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


def label_value(text: str) -> str:
    """TEXT as a label value: valid UTF-8, at most MAX_LABEL_BYTES bytes
    (a longer one: its first bytes, an ellipsis, a digest of it all)."""
    if text.isascii() and len(text) <= MAX_LABEL_BYTES:
        return text
    text = valid_utf8(text)
    raw = text.encode("utf-8")
    if len(raw) <= MAX_LABEL_BYTES:
        return text
    digest = hashlib.sha256(raw).hexdigest()[:_DIGEST_HEX]
    keep = MAX_LABEL_BYTES - len(_MARK.encode()) - _DIGEST_HEX
    # cut at a character's start: a half character would not be UTF-8
    return raw[:keep].decode("utf-8", "ignore") + _MARK + digest


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
