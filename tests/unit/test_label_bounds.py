"""No name on the node makes a label value longer than 1 KiB: a Prometheus
with label_value_length_limit refuses a scrape holding one whole, and the
node vanishes from it. A long value is its first bytes, an ellipsis and a
digest of the whole: the same name is the same label set every scrape, two
names stay two."""
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.openmetrics.parser import text_string_to_metric_families as om_parse
from prometheus_client.parser import text_string_to_metric_families as text_parse

from tracehound.exporter.exposition import OPENMETRICS, PROTOBUF, TEXT, render
from tracehound.exporter.rows import Blocks, ValueRows
from tracehound.utf8 import MAX_LABEL_BYTES, label_value

# a cgroup path of nested 250-byte names, as anyone with a delegated subtree makes
LONG = "/user.slice" + "".join(f"/{i:03d}" + "d" * 246 for i in range(15))


def test_a_long_value_is_cut_to_the_limit_with_a_digest_of_the_whole():
    assert len(LONG) == 3_761
    shown = label_value(LONG)
    assert len(shown.encode()) == MAX_LABEL_BYTES
    head, mark, digest = shown.rpartition("\u2026")
    assert LONG.startswith(head) and mark and len(digest) == 16 and int(digest, 16) >= 0
    assert label_value(LONG) == shown                           # the same every scrape
    assert label_value(LONG + "x") != shown                     # another name, another set
    assert label_value("/slurm/uid_0/job_1") == "/slurm/uid_0/job_1"
    assert label_value("d" * MAX_LABEL_BYTES) == "d" * MAX_LABEL_BYTES


def test_a_long_value_of_many_byte_characters_is_cut_between_characters():
    shown = label_value("/" + "\u00e9" * 2_000 + "\udcff")     # é, and a byte that is not UTF-8
    raw = shown.encode("utf-8")                                # raises on half a character
    assert len(raw) <= MAX_LABEL_BYTES and shown.startswith("/\u00e9\u00e9")


def families():
    blocks = Blocks(("cgroup", "job_id"))
    rows = [blocks.get((LONG, "7")), blocks.get(("/short", "8"))]
    plain = GaugeMetricFamily("t_plain", "From the library.", labels=["cgroup"])
    plain.add_metric([LONG], 1)
    return [ValueRows("t_bytes", "Bytes.", "counter", rows, [10, 20]), plain]


def test_every_format_shows_a_long_value_shortened_and_a_short_one_whole():
    want = label_value(LONG)
    for fmt, parse in ((TEXT, text_parse), (OPENMETRICS, om_parse)):
        text = b"".join(render(families(), fmt)).decode()
        values = {s.labels["cgroup"] for fam in parse(text) for s in fam.samples}
        assert values == {want, "/short"}, fmt
    body = b"".join(render(families(), PROTOBUF))
    assert want.encode() in body and LONG.encode() not in body
