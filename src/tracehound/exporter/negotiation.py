"""Content negotiation with quality values (RFC 9110 12.4.2): `q=0`
means "not acceptable", and among the text formats the higher q wins.
exposition.choose() picks among the media ranges this leaves."""
from __future__ import annotations

import re
from typing import Optional

# qvalue = ( "0" [ "." 0*3DIGIT ] ) / ( "1" [ "." 0*3("0") ] )
_QVALUE = re.compile(r"0(\.[0-9]{0,3})?|1(\.0{0,3})?")
_OPENMETRICS = "application/openmetrics-text"
_TEXT_RANGES = ("text/plain", "text/*", "*/*")


def _ranges(header: Optional[str]) -> list[tuple[str, float, str]]:
    """(media type or coding, q, the range as written) for each element;
    a malformed q counts as 0 (not acceptable), never as 1."""
    out = []
    for element in (header or "").split(","):
        name, *params = element.split(";")
        name = name.strip().lower()
        if not name:
            continue
        q = 1.0
        for param in params:
            key, _, value = param.partition("=")
            if key.strip().lower() == "q":
                value = value.strip()
                q = float(value) if _QVALUE.fullmatch(value) else 0.0
        out.append((name, q, element.strip()))
    return out


def acceptable_media(accept: Optional[str]) -> str:
    """The Accept header without what it refuses: ranges with q=0 go, and
    OpenMetrics goes when a plain-text range is preferred to it. An empty
    result means the default, the Prometheus text format."""
    ranges = [r for r in _ranges(accept) if r[1] > 0]
    best_text = max((q for name, q, _ in ranges if name in _TEXT_RANGES), default=0.0)
    best_om = max((q for name, q, _ in ranges if name == _OPENMETRICS), default=0.0)
    if best_om < best_text:
        ranges = [r for r in ranges if r[0] != _OPENMETRICS]
    return ", ".join(written for _, _, written in ranges)


def gzip_accepted(accept_encoding: Optional[str]) -> bool:
    """gzip (or x-gzip) with a q above zero, named or through "*"."""
    named = [q for name, q, _ in _ranges(accept_encoding) if name in ("gzip", "x-gzip")]
    if named:
        return max(named) > 0
    wildcard = [q for name, q, _ in _ranges(accept_encoding) if name == "*"]
    return bool(wildcard) and max(wildcard) > 0
