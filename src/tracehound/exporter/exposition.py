"""Exposition written directly as bytes: Prometheus text 0.0.4, OpenMetrics
1.0 and the delimited protobuf format (with native histograms).

Collectors with thousands of label sets yield `Rows` families (rows.py),
which render themselves. Every other family (prometheus_client's own
classes, a few series each) is rendered by prometheus_client itself, and by
protobuf.py's generic converter.

Empty label values are left out (Prometheus treats an empty label as
absent, so no query changes). Every label value and help text is valid
UTF-8, a label value at most 1 KiB (utf8.py), and a family whose rendering
raises anyway is left out of that scrape and reported to the caller: one
family never cuts the others short, nor fails the scrape.
"""
from __future__ import annotations

from typing import Callable, Iterable, Iterator, Optional

from prometheus_client import exposition as text_exposition
from prometheus_client.core import Metric
from prometheus_client.openmetrics import exposition as om_exposition

from . import failures, protobuf
from .rows import HistogramRows, Rows
from ..utf8 import MAX_LABEL_BYTES, label_value, valid_utf8

TEXT, OPENMETRICS, PROTOBUF = "text", "openmetrics", "protobuf"
# Every name the agent exports is a classic Prometheus name, so the text
# formats need no name escaping and say so by their plain versions.
CONTENT_TYPES = {
    TEXT: "text/plain; version=0.0.4; charset=utf-8",
    OPENMETRICS: "application/openmetrics-text; version=1.0.0; charset=utf-8",
    PROTOBUF: protobuf.CONTENT_TYPE,
}


class _Families:
    """What prometheus_client's generate_latest needs from a registry."""

    def __init__(self, families):
        self.families = families

    def collect(self):
        return self.families


def shown(fam: Metric) -> Metric:
    """The family as it is exposed: empty label values left out, every label
    value and the help valid UTF-8 (a copy, only where anything changes)."""
    def needs_care(labels: dict) -> bool:
        values = labels.values()
        return "" in values or not "".join(values).isascii() or \
            any(len(v) > MAX_LABEL_BYTES for v in values)

    doc = fam.documentation
    if doc.isascii() and not any(needs_care(s.labels) for s in fam.samples):
        return fam
    out = Metric(fam.name, valid_utf8(doc), fam.type, fam.unit)
    out.samples = [s._replace(labels={k: label_value(v) for k, v in s.labels.items() if v})
                   if needs_care(s.labels) else s for s in fam.samples]
    return out


def _library_text(families: list, openmetrics: bool) -> bytes:
    if openmetrics:
        return om_exposition.generate_latest(_Families(families)).removesuffix(b"# EOF\n")
    return text_exposition.generate_latest(_Families(families))


Failed = Callable[[str, BaseException], None]


def _plain_text(families: list, openmetrics: bool, failed: Failed) -> bytes:
    """prometheus_client's rendering of a run of families, each made safe to
    show; one that still fails is left out and reported."""
    if not families:
        return b""
    safe = []
    for fam in families:
        try:
            safe.append(shown(fam))
        except Exception as exc:  # noqa: BLE001 - one family never fails the scrape
            failed(fam.name, exc)
    try:
        return _library_text(safe, openmetrics)
    except Exception:  # noqa: BLE001 - find the family at fault, keep the rest
        out = []
        for fam in safe:
            try:
                out.append(_library_text([fam], openmetrics))
            except Exception as exc:  # noqa: BLE001
                failed(fam.name, exc)
        return b"".join(out)


def _rows_text(fam: Rows, openmetrics: bool, failed: Failed) -> Iterator[bytes]:
    """A Rows family's chunks. Each chunk is whole lines, so a rendering
    that raises half-way leaves a shorter family, never a broken line."""
    try:
        yield from fam.text(openmetrics)
    except Exception as exc:  # noqa: BLE001
        failed(fam.name, exc)


def _proto(fam: Metric, failed: Failed) -> bytes:
    try:
        return fam.proto() if isinstance(fam, Rows) else protobuf.from_metric(shown(fam))
    except Exception as exc:  # noqa: BLE001 - one message is one family: all or nothing
        failed(fam.name, exc)
        return b""


def render(families: Iterable[Metric], fmt: str,
           failed: Optional[Failed] = None) -> Iterator[bytes]:
    """The families in one format (TEXT, OPENMETRICS or PROTOBUF), as byte
    chunks to send in order, rendered as they are asked for: a consumer
    that compresses as it goes never holds the whole uncompressed body.
    A family whose rendering raises is left out and passed to
    `failed(name, exception)`, by default counted in failures.FAILURES."""
    failed = failed or failures.FAILURES.record
    if fmt == PROTOBUF:
        for f in families:
            yield _proto(f, failed)
        return
    openmetrics = fmt == OPENMETRICS
    plain: list[Metric] = []
    for fam in families:
        if isinstance(fam, Rows):
            yield _plain_text(plain, openmetrics, failed)
            plain = []
            yield from _rows_text(fam, openmetrics, failed)
        else:
            plain.append(fam)
    yield _plain_text(plain, openmetrics, failed)
    if openmetrics:
        yield b"# EOF\n"


def choose(accept: str | None) -> str:
    """The format an Accept header asks for: protobuf when it is listed
    (Prometheus asks for it when native histograms are enabled), else what
    prometheus_client would choose between its two text formats."""
    if protobuf.accepts(accept):
        return PROTOBUF
    try:
        _encoder, content_type = text_exposition.choose_encoder(accept or "")
    except Exception:                  # a malformed version= in Accept
        return TEXT
    return OPENMETRICS if content_type.startswith("application/openmetrics-text") else TEXT


def samples_in(families: Iterable[Metric]) -> int:
    """Exposed samples (text lines that carry a value)."""
    n = 0
    for fam in families:
        if isinstance(fam, HistogramRows):
            n += len(fam) * (len(fam.shape.bounds) + 3)
        elif isinstance(fam, Rows):
            n += len(fam)
        else:
            try:
                n += len(fam.samples)
            except Exception:  # noqa: BLE001 - left out, and counted, by render()
                pass
    return n


def samples_or_none(fam: Metric):
    """The family's samples; None, counted as a failed family, when reading
    them raises (the family is left out, as render() leaves it out)."""
    try:
        return fam.samples
    except Exception as exc:  # noqa: BLE001 - one family never fails the scrape
        failures.FAILURES.record(fam.name, exc)
        return None
