"""What encoding one scrape in the protobuf format costs: the agent's
hand-written encoder (exporter/protobuf.py, each label set encoded once and
kept, as the exporter's Blocks keep it) against google.protobuf's message
classes (upb) filling the same MetricFamily messages, in one run.

    .venv/bin/python -m bench.protobuf_encoding [--cgroups N] [--mounts M] [--rounds R]

The scrape is a busy node's I/O families: per (cgroup, mount) label set,
eight counters and three native histograms of ten buckets. Each round times
every encoder once, in turn. Both outputs are decoded with the library and
must be the same messages, or the run fails. Writes
report/protobuf-encoding.{md,json}.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

from google.protobuf.internal import api_implementation
from google.protobuf.internal.encoder import _VarintBytes

from bench.common import REPORT, log, stamp
from testbed.metrics_proto import message_classes, read_varint
from tracehound.exporter import protobuf

LABELS = ("cgroup", "job_id", "step", "user", "device", "mountpoint")
COUNTERS = ("read_bytes", "write_bytes", "read_calls", "write_calls", "open_calls",
            "fsync_calls", "read_errors", "write_errors")
HISTOGRAMS = ("read_latency_seconds", "write_latency_seconds", "fsync_latency_seconds")
SLOTS = 32
OFFSET = -30            # slot s is native bucket s - 30 (nanoseconds as seconds, schema 0)
CLASSES = message_classes()
MetricFamily = CLASSES["MetricFamily"]
LabelPair = CLASSES["LabelPair"]


def workload(cgroups: int, mounts: int) -> list[dict]:
    """One dict per label set: its labels, counter values, histogram slots."""
    series = []
    for c in range(cgroups):
        for m in range(mounts):
            i = c * mounts + m
            slots = [0] * SLOTS
            for s in range(10, 20):
                slots[s] = (i * 7 + s * 13) % 97 + 1
            series.append({
                "labels": (f"/system.slice/slurmstepd.scope/job_{1000 + c}/step_0",
                           str(1000 + c), "0", f"user{c % 50}", f"259:{m}", f"/scratch{m}"),
                "counters": [float(i * 4096 + k) for k in range(len(COUNTERS))],
                "slots": slots, "sums": [0.001 * (i % 113 + k) for k in range(len(HISTOGRAMS))]})
    return series


def spans_and_deltas(slots: list[int]) -> tuple[list[tuple[int, int]], list[int]]:
    """Native histogram spans (offset from the last span's end) and bucket
    deltas of the non-empty slots: what any encoder of the format computes."""
    spans, deltas, previous, start, end, since = [], [], 0, None, None, -OFFSET
    for s, c in enumerate(slots):
        if c:
            if s != end:
                if end is not None:
                    spans.append((start - since, end - start))
                    since = end
                start = s
            end = s + 1
            deltas.append(c - previous)
            previous = c
    if end is not None:
        spans.append((start - since, end - start))
    return spans, deltas


def hand(series: list[dict], blocks: list[bytes]) -> bytes:
    out = []
    for k, name in enumerate(COUNTERS):
        out.append(protobuf.family(f"tracehound_io_{name}_total", "Help.", protobuf.COUNTER,
                                   [protobuf.metric(b, protobuf.counter(s["counters"][k]))
                                    for b, s in zip(blocks, series)]))
    for k, name in enumerate(HISTOGRAMS):
        out.append(protobuf.family(f"tracehound_io_{name}", "Help.", protobuf.HISTOGRAM,
                                   [protobuf.metric(b, protobuf.native_histogram(
                                       s["slots"], OFFSET, s["sums"][k]))
                                    for b, s in zip(blocks, series)]))
    return b"".join(out)


def delimited(mf) -> bytes:
    body = mf.SerializeToString()
    return _VarintBytes(len(body)) + body


def library(series: list[dict], label_sets=None) -> bytes:
    """With label_sets (LabelPair messages built once), they are copied into
    each metric; without, each scrape builds them."""
    out = []
    for k, name in enumerate(COUNTERS + HISTOGRAMS):
        histogram = k >= len(COUNTERS)
        mf = MetricFamily(name=f"tracehound_io_{name}" + ("" if histogram else "_total"),
                          help="Help.", type=4 if histogram else 0)
        for i, s in enumerate(series):
            m = mf.metric.add()
            if label_sets is None:
                for n, v in zip(LABELS, s["labels"]):
                    if v:
                        m.label.add(name=n, value=v)
            else:
                m.label.extend(label_sets[i])
            if not histogram:
                m.counter.value = s["counters"][k]
                continue
            slots, h = s["slots"], m.histogram
            h.sample_count = sum(slots)
            h.sample_sum = s["sums"][k - len(COUNTERS)]
            h.schema = 0
            h.zero_threshold = 2.0 ** -128
            spans, deltas = spans_and_deltas(slots)
            for offset, length in spans:
                h.positive_span.add(offset=offset, length=length)
            h.positive_delta.extend(deltas)
        out.append(delimited(mf))
    return b"".join(out)


def decode(data: bytes) -> list:
    msgs, pos = [], 0
    while pos < len(data):
        size, pos = read_varint(data, pos)
        msgs.append(MetricFamily.FromString(data[pos:pos + size]))
        pos += size
    return msgs


def main() -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.protobuf_encoding",
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("--cgroups", type=int, default=1000)
    ap.add_argument("--mounts", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--out", type=Path, default=REPORT)
    args = ap.parse_args()
    series = workload(args.cgroups, args.mounts)
    blocks = [protobuf.labels(zip(LABELS, s["labels"])) for s in series]
    label_sets = [[LabelPair(name=n, value=v) for n, v in zip(LABELS, s["labels"]) if v]
                  for s in series]
    encoders = {"hand-written (labels kept)": lambda: hand(series, blocks),
                "upb (labels built each scrape)": lambda: library(series),
                "upb (label messages kept, copied in)": lambda: library(series, label_sets)}
    reference = decode(encoders["upb (labels built each scrape)"]())
    for name, encode in encoders.items():
        if decode(encode()) != reference:
            log(f"{name}: not the same messages as the library's")
            return 1
    times: dict[str, list[float]] = {name: [] for name in encoders}
    for r in range(args.rounds):
        for name, encode in encoders.items():
            started = time.perf_counter()
            body = encode()
            times[name].append(time.perf_counter() - started)
        log(f"round {r + 1}/{args.rounds}: " + ", ".join(
            f"{n.split()[0]} {t[-1] * 1000:.0f} ms" for n, t in times.items()))
    base = statistics.median(times["hand-written (labels kept)"])
    result = {"stamp": stamp(), "protobuf": f"google.protobuf {api_implementation.Type()}",
              "series": len(series), "families": len(COUNTERS) + len(HISTOGRAMS),
              "bytes": len(body), "rounds": args.rounds,
              "seconds": {n: t for n, t in times.items()},
              "median_ms": {n: round(statistics.median(t) * 1000, 1) for n, t in times.items()},
              "ratio_to_hand": {n: round(statistics.median(t) / base, 2)
                                for n, t in times.items()}}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "protobuf-encoding.json").write_text(json.dumps(result, indent=2) + "\n")
    st = result["stamp"]
    lines = ["# Protobuf exposition: hand-written encoder against google.protobuf", "",
             f"{st['machine']}; commit {st['commit']}; {st['date']}; {result['protobuf']}.",
             f"One scrape of {len(series):,} label sets x {result['families']} families "
             f"(8 counters, 3 native histograms of 10 buckets), {len(body) / 1e6:.1f} MB; "
             f"{args.rounds} rounds, encoders in turn; both outputs decode to the same messages.",
             "", "| encoder | median ms per scrape | ÷ hand-written |", "|---|---:|---:|"]
    lines += [f"| {n} | {result['median_ms'][n]} | {result['ratio_to_hand'][n]}x |"
              for n in encoders]
    (args.out / "protobuf-encoding.md").write_text("\n".join(lines) + "\n")
    log(f"wrote {args.out / 'protobuf-encoding.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
