"""Property-based fuzzing of every parser that reads text a user, a host or
a remote endpoint controls: each either returns its result or raises its own
documented error, never anything else (an IndexError, a UnicodeError, a
RecursionError would be a traceback, or a dead collector).

Hypothesis runs derandomized (the same examples on every machine, so CI is
reproducible); EXAMPLES per property. docs/reliability.md reports the count.
"""
import io
import string
from contextlib import contextmanager

import pytest
from elftools.elf.elffile import ELFFile
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tracehound.attribution.kubelet import parse_pod_list
from tracehound.host.procs import parse_proc_cgroup
from tracehound.attribution.resolver import WorkloadResolver
from tracehound.attribution.workload import WORKLOAD_LABELS
from tracehound.chaos import document, jsonpath, schema
from tracehound.chaos.detection import parse_predicate
from tracehound.chaos.metrics import QueryError, parse_samples, parse_selector
from tracehound.errors import SetupError
from tracehound.exporter.server import parse_listen
from tracehound.host.mounts import MountTableError, parse_mountinfo
from tracehound.host.netstat import parse_tcp
from tracehound.probes.elf_exports import ElfRefused, default_function_offsets
from tracehound.probes.rdma_app import VERBS
from tracehound.top.rates import parse_metrics

from tests.crafted_elf import REAL_LIBIBVERBS

EXAMPLES = 400
fuzz = settings(max_examples=EXAMPLES, derandomize=True, deadline=None, database=None,
                suppress_health_check=[HealthCheck.too_slow])



@contextmanager
def refused_only_with(*documented):
    """The parser either returns or refuses its input with one of its
    `documented` errors. A UnicodeError is a ValueError too, but one escaping
    a parser is a bug, never a refusal: it fails the test."""
    try:
        yield
    except UnicodeError as exc:
        raise AssertionError(f"{type(exc).__name__} escaped the parser: {exc}") from exc
    except documented:
        pass


def test_a_unicode_error_is_not_taken_for_a_refusal():
    with refused_only_with(ValueError):
        raise ValueError("not a number")
    with pytest.raises(AssertionError, match="UnicodeDecodeError escaped the parser"), \
            refused_only_with(ValueError):
        b"\xff".decode("utf-8")


# text that looks like the input more often than random text would
LINEISH = st.lists(st.one_of(
    st.text(max_size=40),
    st.sampled_from(["-", " - ", "0:0", "/", "\\040", "\\", "{", "}", "=", '"', "\n", "\t",
                     "#", "le=", "+Inf", "NaN", "1e308", "-1", "$", "..", "[", "]", "*", "'"]),
), max_size=20).map("".join)


@fuzz
@given(LINEISH)
def test_mountinfo_text_parses_or_is_refused(text):
    try:
        mounts = parse_mountinfo(text)
    except MountTableError:
        return
    assert all(isinstance(m.mountpoint, str) and m.fstype for m in mounts)


# a mount point as the kernel writes it: space, tab, newline and backslash as \ooo
PATHS = st.text(alphabet=st.characters(blacklist_categories=("Cs",)), min_size=1, max_size=30)


def kernel_escape(path: str) -> str:
    return "".join(f"\\{ord(c):03o}" if c in " \t\n\\" else c for c in path)


@fuzz
@given(st.integers(1, 2 ** 31), st.integers(0, 4095), st.integers(0, 2 ** 20 - 1), PATHS,
       st.text(alphabet=string.ascii_lowercase + "0123456789_", min_size=1, max_size=12))
def test_mountinfo_lines_round_trip(mnt_id, major, minor, path, fstype):
    line = f"{mnt_id} 1 {major}:{minor} / /{kernel_escape(path)} rw shared:1 - {fstype} src rw"
    (mount,) = parse_mountinfo(line)
    assert (mount.mnt_id, mount.mountpoint, mount.fstype) == (mnt_id, "/" + path, fstype)
    assert mount.dev == (major << 20) | minor


@fuzz
@given(st.text(max_size=200))
def test_proc_cgroup_text_never_raises(text):
    assert isinstance(parse_proc_cgroup(text), dict)


@fuzz
@given(st.lists(st.one_of(st.text(max_size=40), st.sampled_from(
    ["Tcp: InSegs OutSegs RetransSegs", "Tcp: 1 2 3", "Tcp: 1 2", "Tcp: ٣ 2 1"])), max_size=5))
def test_snmp_text_gives_plain_counts_or_nothing(lines):
    # /proc/net/snmp is the kernel's; a read cut short or a kernel of another
    # shape must still never stop the net collector
    counted = parse_tcp("\n".join(lines))
    assert all(type(v) is int and v >= 0 for v in counted.values())


RESOLVER = WorkloadResolver(None, job_id_source=None, pod_source=None)


@fuzz
@given(st.lists(st.one_of(st.text(max_size=30), st.sampled_from(
    ["system.slice", "slurmstepd.scope", "job_42", "step_0", "user", "task_1", "kubepods.slice",
     "kubepods-burstable.slice", "kubepods-burstable-pod0b1c2d3e_4f50.slice",
     "cri-containerd-0123abcd.scope", "machine.slice", "machine-qemu\\x2d1\\x2dvm.scope",
     "slurm", "uid_0", "job_7", "step_batch", "nginx.service", ""])), max_size=8))
def test_any_cgroup_path_has_workload_labels(components):
    path = "/" + "/".join(components)
    labels = RESOLVER.labels(path)
    assert len(labels) == len(WORKLOAD_LABELS) and all(isinstance(v, str) for v in labels)


@fuzz
@given(LINEISH)
def test_listen_addresses_parse_or_are_refused(text):
    try:
        host, port = parse_listen(text)
    except SetupError:
        return
    assert 0 <= port < 65536 and isinstance(host, str)


@fuzz
@given(LINEISH)
def test_exposition_text_for_top_parses_or_is_refused(text):
    with refused_only_with(ValueError):
        parse_metrics(text, 1.0)


@fuzz
@given(LINEISH)
def test_chaos_metric_selectors_and_samples(text):
    with refused_only_with(QueryError):
        parse_selector(text)
    with refused_only_with(QueryError, ValueError):
        parse_samples(text)


@fuzz
@given(LINEISH)
def test_chaos_predicates_and_json_paths(text):
    with refused_only_with(ValueError):
        op, ref = parse_predicate(text)
        assert op in ("==", "!=", ">=", "<=", ">", "<")
    with refused_only_with(jsonpath.JsonPathError):
        jsonpath.parse(text)


@fuzz
@given(LINEISH, st.sampled_from(["x.yaml", "x.json"]))
def test_experiment_files_load_or_are_refused(text, name):
    try:
        document.loads(text, name)
    except document.DocumentError:
        pass


JSONISH = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=False),
              st.text(max_size=12), st.sampled_from(["io.throttle", "proc.kill", "agent",
                                                     "probe", "action", "tolerance"])),
    lambda inner: st.one_of(st.lists(inner, max_size=4),
                            st.dictionaries(st.sampled_from(
                                ["title", "method", "steady-state-hypothesis", "rollbacks",
                                 "type", "name", "provider", "fault", "arguments", "probes",
                                 "tolerance", "detect", "source", "query", "x"]), inner,
                                max_size=5)),
    max_leaves=25)


@fuzz
@given(st.dictionaries(st.sampled_from(["title", "description", "method", "rollbacks",
                                        "steady-state-hypothesis", "configuration", "tags"]),
                       JSONISH, max_size=6))
def test_experiment_documents_validate_to_problems_never_to_exceptions(doc):
    import json
    try:
        loaded = document.loads(json.dumps(doc), "x.json")
    except document.DocumentError:
        return
    problems, experiment = schema.validate(loaded)
    assert problems or experiment is not None


POD_JSON = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(), st.text(max_size=10)),
    lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(st.sampled_from(
        ["items", "metadata", "uid", "name", "namespace", "status", "containerStatuses",
         "initContainerStatuses", "containerID", "x"]), inner, max_size=4)),
    max_leaves=30)


@fuzz
@given(POD_JSON)
def test_kubelet_pod_lists_parse_or_are_refused(doc):
    with refused_only_with(ValueError):
        pods = parse_pod_list(doc)
        assert all(isinstance(uid, str) and record.uid == uid for uid, record in pods.items())


# what the kernel log holds: records "prio,seq,usec,flags;text\n KEY=v", and
# the NVIDIA driver's lines inside them, with their punctuation
LABEL_VALUES = st.lists(st.one_of(
    st.text(alphabet=st.characters(blacklist_categories=()), max_size=12),
    st.sampled_from(["\r", "\n", "\\", '"', "\\n", "\x1b[2J", "\x00", "\x85", "\u2028", "}",
                     ",", "=", " ", "\udcff", "\udc80", "\ud800", "\udfff", "\ufffd", "é"]),
), max_size=8).map("".join)


def _one_of_each_kind(value: str):
    """The value in a Rows family (the collectors' fast path) and in a
    prometheus_client family (every other collector)."""
    from prometheus_client.core import GaugeMetricFamily

    from tracehound.exporter.rows import Blocks, ValueRows
    rows = ValueRows("t_rows", "Rows.", "gauge", [Blocks(["v"]).get((value,))], [1])
    plain = GaugeMetricFamily("t_plain", "Plain.", labels=["v"])
    plain.add_metric([value], 2)
    return [rows, plain]


def _read_back(samples) -> dict:
    return {s.name: s.labels.get("v", "") for s in samples}


@settings(max_examples=150, derandomize=True, deadline=None, database=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(LABEL_VALUES)
def test_any_label_value_renders_to_utf8_that_parsers_read_back(value):
    from prometheus_client.openmetrics.parser import text_string_to_metric_families as om
    from prometheus_client.parser import text_string_to_metric_families as text

    from tests.unit.test_protobuf import decode, label_dict
    from tracehound.exporter import text_parse
    from tracehound.exporter.exposition import OPENMETRICS, PROTOBUF, TEXT, render
    from tracehound.utf8 import valid_utf8
    want = valid_utf8(value)
    want.encode("utf-8")                          # no surrogate is left
    expected = {"t_rows": want, "t_plain": want}
    fams = _one_of_each_kind(value)
    plain = b"".join(render(fams, TEXT)).decode("utf-8")
    assert _read_back(s for f in text(plain) for s in f.samples) == expected
    assert {n: labels.get("v", "") for n, labels, _ in text_parse.parse(plain).samples} \
        == expected
    openmetrics = b"".join(render(fams, OPENMETRICS)).decode("utf-8")
    assert _read_back(s for f in om(openmetrics) for s in f.samples) == expected
    messages = decode(b"".join(render(fams, PROTOBUF)))
    assert {m.name: label_dict(m.metric[0]).get("v", "") for m in messages} == expected


# libibverbs as a container user may craft it: the real library with bytes
# rewritten where the reader looks (ELF, section and program headers, the
# dynamic symbols, their versions and names), or any bytes at all
with open(REAL_LIBIBVERBS, "rb") as _f:
    LIBRARY = _f.read()


def _looked_at(data: bytes) -> list[tuple[int, int]]:
    elf = ELFFile(io.BytesIO(data))
    spans = [(0, 64), (elf["e_phoff"], elf["e_phnum"] * elf["e_phentsize"]),
             (elf["e_shoff"], elf["e_shnum"] * elf["e_shentsize"])]
    for name in (".dynsym", ".gnu.version", ".dynstr"):
        s = elf.get_section_by_name(name)
        spans.append((s["sh_offset"], min(s["sh_size"], 4096)))
    return spans


LIBRARY_SPANS = _looked_at(LIBRARY)
# (span, position in it, new byte)
LIBRARY_EDITS = st.lists(st.tuples(st.integers(0, len(LIBRARY_SPANS) - 1), st.integers(0, 2**32),
                                   st.integers(0, 255)), min_size=1, max_size=12)


def offsets_within_bounds(data: bytes) -> None:
    try:
        offsets = default_function_offsets(data, VERBS)
    except ElfRefused as exc:
        assert str(exc)
        return
    assert set(offsets) <= set(VERBS)
    assert all(0 <= at < len(data) for at in offsets.values())


@fuzz
@given(st.booleans(), st.binary(max_size=2048))
def test_any_bytes_read_as_a_library_give_offsets_in_the_file_or_a_refusal(as_elf64, data):
    # half of them past the magic and class bytes, so the headers' parsing is reached
    offsets_within_bounds(LIBRARY[:7] + data if as_elf64 else data)


@fuzz
@given(LIBRARY_EDITS)
def test_a_library_rewritten_where_the_reader_looks_gives_offsets_in_the_file_or_a_refusal(edits):
    data = bytearray(LIBRARY)
    for span, at, byte in edits:
        start, size = LIBRARY_SPANS[span]
        data[start + at % size] = byte
    offsets_within_bounds(bytes(data))

# a bus id as the kernel log's form gives it back: NVML's, lower case
