"""The rows of a busy family, rendered once per label set.

Collectors with thousands of label sets yield `Rows` families: their label
sets come as `Block`s, rendered once (text and protobuf) and kept by a
`Blocks` cache while the label set lives, so a scrape only formats numbers.
A classic histogram row is one %-format of a per-family template, not 25
separate lines.

A `Rows` family is also a prometheus_client Metric: its `samples` are built
on demand, with prometheus_client's own histogram rules, so tests and any
other consumer see ordinary samples, and the fast rendering can be checked
against the library's (exposition.py sends them).
"""
from __future__ import annotations

import math
from itertools import accumulate
from typing import Iterable, Iterator, Sequence

from prometheus_client import exposition as text_exposition
from prometheus_client.core import (CounterMetricFamily, GaugeMetricFamily,
                                    HistogramMetricFamily, Metric)

from . import protobuf
from ..utf8 import label_value

# histogram rows joined per chunk: a few MB, so a large exposition is never
# copied whole once more on its way to the socket
_ROWS_PER_CHUNK = 1024

def _escape_value(value: str) -> str:
    return value.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")


def _escape_help(text: str, openmetrics: bool) -> str:
    text = text.replace("\\", r"\\").replace("\n", r"\n")
    return text.replace('"', r"\"") if openmetrics else text


class Block:
    """One label set, rendered: `braced` is b'{a="x",b="y"}' (or b'' with no
    labels), `open` the same without its closing brace and with a trailing
    comma where another label may follow, `proto` the protobuf LabelPairs."""

    __slots__ = ("names", "values", "braced", "open", "proto")

    def __init__(self, names: tuple, values: tuple):
        self.names = names
        # an exposition is UTF-8: a path that is not (kept as surrogates
        # when read) shows its undecodable bytes as U+FFFD; a long one is
        # shortened (utf8.label_value)
        self.values = values = tuple(label_value(v) for v in values)
        inner = ",".join(f'{n}="{_escape_value(v)}"' for n, v in zip(names, values) if v)
        inner = inner.encode()
        self.braced = b"{" + inner + b"}" if inner else b""
        self.open = b"{" + inner + b"," if inner else b"{"
        self.proto = protobuf.labels(zip(names, values))

    @property
    def labels(self) -> dict[str, str]:
        return {n: v for n, v in zip(self.names, self.values) if v}


class Blocks:
    """Blocks of one set of label names, kept while they are used: a label
    set not asked for during a whole collection is forgotten at the next
    `rotate()`, so the cache follows the live label sets."""

    def __init__(self, names: Iterable[str]):
        self.names = tuple(names)
        self._current: dict[tuple, Block] = {}
        self._previous: dict[tuple, Block] = {}

    def get(self, values: tuple) -> Block:
        block = self._current.get(values)
        if block is None:
            block = self._previous.get(values)
            if block is None:
                block = Block(self.names, values)
            self._current[values] = block
        return block

    def rotate(self) -> None:
        """Call once per collection, before its first get()."""
        self._previous, self._current = self._current, {}

    def __len__(self) -> int:
        return len(self._current)


class Rows(Metric):
    """A family whose series are (Block, value) rows. Subclasses give the
    sample view (`_reference`) and the fast renderings."""

    def __init__(self, name: str, documentation: str, typ: str, blocks: Sequence[Block]):
        self.name = name
        self.documentation = documentation
        self.unit = ""
        self.type = typ
        self.blocks = blocks

    @property
    def samples(self):
        return self._reference().samples

    @samples.setter
    def samples(self, _value):
        raise AttributeError("Rows families are read-only")

    def __len__(self) -> int:
        return len(self.blocks)


class ValueRows(Rows):
    """Counter or gauge rows: one number per block."""

    def __init__(self, name: str, documentation: str, typ: str, blocks: Sequence[Block],
                 values: Sequence[float]):
        if typ not in ("counter", "gauge"):
            raise ValueError(f"{name}: ValueRows are counters or gauges, not {typ}")
        super().__init__(name, documentation, typ, blocks)
        self.values = values

    def _reference(self) -> Metric:
        cls = CounterMetricFamily if self.type == "counter" else GaugeMetricFamily
        fam = cls(self.name, self.documentation)
        for block, v in zip(self.blocks, self.values):
            labels = block.labels
            one = cls(self.name, self.documentation, labels=list(labels))
            one.add_metric(list(labels.values()), v)
            fam.samples.extend(one.samples)
        return fam

    def text(self, openmetrics: bool) -> list[bytes]:
        series = self.name + "_total" if self.type == "counter" else self.name
        head_name = self.name if openmetrics else series
        help_ = _escape_help(self.documentation, openmetrics)
        head = f"# HELP {head_name} {help_}\n# TYPE {head_name} {self.type}\n".encode()
        prefix = series.encode()
        values = self.values
        if set(map(type, values)) <= {int}:
            body = b"".join([b"%s%s %d\n" % (prefix, b.braced, v)
                             for b, v in zip(self.blocks, values)])
        else:
            body = b"".join([b"%s%s %s\n" % (prefix, b.braced, _num(v).encode())
                             for b, v in zip(self.blocks, values)])
        return [head, body]

    def proto(self) -> bytes:
        if self.type == "counter":
            name, kind, value = self.name + "_total", protobuf.COUNTER, protobuf.counter
        else:
            name, kind, value = self.name, protobuf.GAUGE, protobuf.gauge
        return protobuf.family(name, self.documentation, kind,
                               [protobuf.metric(b.proto, value(v))
                                for b, v in zip(self.blocks, self.values)])


def _num(v) -> str:
    if type(v) is int:
        return str(v)
    return text_exposition.floatToGoString(v)


class Log2Histogram:
    """How kernel log2 slots become buckets: slot s counts values in
    [2^s, 2^(s+1)) units of `scale` (1e-9 for nanoseconds exported as
    seconds). Classic buckets are le=2^k units for k in first..slots-1
    (lower slots fold into the first bucket; the last slot reaches +Inf
    only). A native bucket (schema 0) cannot match a slot exactly unless
    `scale` is a power of two: slot s goes to the bucket that overlaps most
    of it, whose bounds are the slot's times 2^(round(log2 scale) - log2
    scale) (0.93 for nanoseconds)."""

    def __init__(self, slots: int, scale: float, first: int):
        self.first = first
        self.bounds = [2 ** k * scale for k in range(first, slots)]
        # slot s is [2^(s+l), 2^(s+1+l)) with l = log2(scale); the schema-0
        # bucket i is (2^(i-1), 2^i]: i = s + 1 + round(l) shifts it least
        self.native_offset = 1 + round(math.log2(scale))

    def template(self, series: str) -> bytes:
        """One row's text: %s the label block, %d the counts, %a the sum."""
        lines = [f'{series}_bucket%sle="{b!r}"}} %d\n' for b in self.bounds]
        lines.append(f'{series}_bucket%sle="+Inf"}} %d\n')
        lines.append(f"{series}_count%s %d\n{series}_sum%s %a\n")
        return "".join(lines).encode()

    def cumulative(self, slots: Sequence[int]) -> list[int]:
        """Counts at each classic bound, then +Inf (the total)."""
        return list(accumulate(slots))[self.first - 1:]


class Slices(Sequence):
    """`array[at:at + n]` of each array, made when a row is rendered: the
    collector's samples already hold every slot, so a family need not keep
    a second copy of them for the whole scrape."""

    def __init__(self, arrays: Sequence, at: int, n: int):
        self.arrays, self.at, self.end = arrays, at, at + n

    def __len__(self) -> int:
        return len(self.arrays)

    def __getitem__(self, i):
        return self.arrays[i][self.at:self.end]

    def __iter__(self):
        at, end = self.at, self.end
        return (a[at:end] for a in self.arrays)


class HistogramRows(Rows):
    """Histogram rows from log2 slots: (block, slots, sum) per series."""

    def __init__(self, name: str, documentation: str, blocks: Sequence[Block],
                 slots: Sequence[Sequence[int]], sums: Sequence[float], shape: Log2Histogram):
        super().__init__(name, documentation, "histogram", blocks)
        self.slots = slots
        self.sums = sums
        self.shape = shape

    def _reference(self) -> Metric:
        fam = HistogramMetricFamily(self.name, self.documentation)
        les = [repr(b) for b in self.shape.bounds] + ["+Inf"]
        for block, slots, total in zip(self.blocks, self.slots, self.sums):
            labels = block.labels
            one = HistogramMetricFamily(self.name, self.documentation, labels=list(labels))
            one.add_metric(list(labels.values()),
                           list(zip(les, self.shape.cumulative(slots))), total)
            fam.samples.extend(one.samples)
        return fam

    def text(self, openmetrics: bool) -> Iterator[bytes]:
        help_ = _escape_help(self.documentation, openmetrics)
        yield f"# HELP {self.name} {help_}\n# TYPE {self.name} histogram\n".encode()
        template = self.shape.template(self.name)
        cumulative = self.shape.cumulative
        n = len(self.shape.bounds) + 1
        rows = list(zip(self.blocks, self.slots, self.sums))
        for start in range(0, len(rows), _ROWS_PER_CHUNK):
            chunk = []
            for block, slots, total in rows[start:start + _ROWS_PER_CHUNK]:
                cum = cumulative(slots)
                args = [block.open] * (2 * n + 4)
                args[1:2 * n:2] = cum
                args[2 * n] = args[2 * n + 2] = block.braced
                args[2 * n + 1] = cum[-1]
                args[2 * n + 3] = total
                chunk.append(template % tuple(args))
            yield b"".join(chunk)

    def proto(self) -> bytes:
        offset = self.shape.native_offset
        hist = protobuf.native_histogram
        return protobuf.family(self.name, self.documentation, protobuf.HISTOGRAM,
                               [protobuf.metric(b.proto, hist(slots, offset, total))
                                for b, slots, total in zip(self.blocks, self.slots, self.sums)])


# -- whole scrapes ---------------------------------------------------------
