"""tracehound top: quantiles, naming, sorting, filtering, keys, JSON, rendering."""
import json
import math

import pytest
from rich.console import Console

from tracehound.top.model import (
    IoRow,
    Snapshot,
    estimate_quantile,
    filter_rows,
    sort_rows,
    workload_identity,
)
from tracehound.top.state import ViewState
from tracehound.top.terminal import split_keys
from tracehound.top.view import fmt_bytes, fmt_count, fmt_seconds, io_table, screen

INF = math.inf


def test_quantile_interpolates_inside_the_bucket():
    # 100 calls, all in (2, 4]
    b = [(1, 0), (2, 0), (4, 100), (8, 100), (INF, 100)]
    assert estimate_quantile(0.5, b) == pytest.approx(3.0)
    assert estimate_quantile(0.99, b) == pytest.approx(3.98)


def test_quantile_across_buckets():
    # 90 calls in (1, 2], 10 in (2, 4]
    b = [(1, 0), (2, 90), (4, 100), (INF, 100)]
    assert estimate_quantile(0.5, b) == pytest.approx(1 + 50 / 90)
    assert estimate_quantile(0.99, b) == pytest.approx(2 + 2 * 9 / 10)
    assert estimate_quantile(0.9, b) == pytest.approx(2.0)


def test_quantile_first_bucket_spans_half_its_bound():
    assert estimate_quantile(0.5, [(1, 10), (2, 10), (INF, 10)]) == pytest.approx(0.75)


def test_quantile_in_the_inf_bucket_is_the_highest_finite_bound():
    assert estimate_quantile(0.99, [(1, 0), (2, 0), (4, 5), (INF, 10)]) == 4


def test_quantile_without_calls_is_unknown():
    assert estimate_quantile(0.5, [(1, 0), (INF, 0)]) is None
    assert estimate_quantile(0.5, []) is None


def test_quantile_ignores_bucket_order_and_backward_noise():
    b = [(INF, 100), (4, 100), (2, 90), (1, 0)]
    assert estimate_quantile(0.5, b) == pytest.approx(1 + 50 / 90)


@pytest.mark.parametrize("labels,expected", [
    (dict(cgroup="/thtest/x"), ("cgroup", "/thtest/x")),
    # a step's tasks share its row, as they share its latency histograms
    (dict(cgroup="/s", workload="slurm", job_id="7", step="0", task="3"), ("slurm", "7.0")),
    (dict(cgroup="/s", workload="slurm", job_id="7", step="batch"), ("slurm", "7.batch")),
    (dict(cgroup="/s", workload="slurm"), ("slurm", "/s")),      # job not resolved yet
    (dict(cgroup="/k", workload="kubernetes", namespace="ml", pod="train-0", container="main"),
     ("kubernetes", "ml/train-0")),
    (dict(cgroup="/k", workload="kubernetes", namespace="ml", pod="train-0"),
     ("kubernetes", "ml/train-0")),
    (dict(cgroup="/m", workload="vm", vm="guest1"), ("vm", "guest1")),
    (dict(cgroup="/u", workload="systemd", unit="nfs.service"), ("systemd", "nfs.service")),
])
def test_workload_identity(labels, expected):
    assert workload_identity(labels) == expected


def rows():
    return [
        IoRow("slurm", "101.0", "/scratch", "lustre", cgroups=["/slurm/job_101"],
              read_bytes_per_second=5e9, write_bytes_per_second=1e6, read_ops_per_second=10,
              latency_p99_seconds=0.002),
        IoRow("kubernetes", "ml/train", "/data", "nfs", cgroups=["/kubepods/pod1"],
              write_bytes_per_second=3e8, write_ops_per_second=900, errors_per_second=0.5,
              latency_p99_seconds=0.2),
        IoRow("cgroup", "/thtest/idle", "/tmp", "tmpfs", cgroups=["/thtest/idle"]),
    ]


def names(rs):
    return [r.name for r in rs]


def test_sort_each_column():
    # ties keep name order
    assert names(sort_rows(rows(), "read")) == ["101.0", "/thtest/idle", "ml/train"]
    assert names(sort_rows(rows(), "write")) == ["ml/train", "101.0", "/thtest/idle"]
    assert names(sort_rows(rows(), "iops")) == ["ml/train", "101.0", "/thtest/idle"]
    assert names(sort_rows(rows(), "errors")) == ["ml/train", "/thtest/idle", "101.0"]
    assert names(sort_rows(rows(), "name")) == ["/thtest/idle", "101.0", "ml/train"]
    # rows without a latency go last, in both directions
    assert names(sort_rows(rows(), "p99")) == ["ml/train", "101.0", "/thtest/idle"]
    assert names(sort_rows(rows(), "p99", reverse=True)) == ["101.0", "ml/train", "/thtest/idle"]


def test_filter_matches_name_kind_or_cgroup_any_case():
    assert names(filter_rows(rows(), "TRAIN")) == ["ml/train"]
    assert names(filter_rows(rows(), "kubepods")) == ["ml/train"]
    assert names(filter_rows(rows(), "slurm")) == ["101.0"]
    assert len(filter_rows(rows(), "")) == 3
    assert filter_rows(rows(), "nothing-like-this") == []


def test_keys_change_sort_filter_panel_and_quit():
    s = ViewState()
    assert (s.sort, s.reverse) == ("write", False)
    s.handle_key("r")
    assert (s.sort, s.reverse) == ("read", False)
    s.handle_key("r")
    assert (s.sort, s.reverse) == ("read", True)
    s.handle_key("l")
    assert (s.sort, s.reverse) == ("p99", False)
    for k in "/tra":
        s.handle_key(k)
    assert s.editing == "tra" and s.filter == "tra"      # applies while typing
    assert not s.handle_key("q")                          # a letter of the filter, not quit
    s.handle_key("\x7f")
    s.handle_key("\r")
    assert s.editing is None and s.filter == "tra"
    s.handle_key("/")
    s.handle_key("x")
    s.handle_key("\x1b")                                  # ESC while typing: back to "tra"
    assert s.filter == "tra"
    s.handle_key("\x1b")                                  # ESC otherwise: clear
    assert s.filter == ""
    assert [s.handle_key("\t") or s.panel for _ in range(4)] == ["jobs", "rdma", "gpu", "io"]
    assert s.handle_key("q")


def test_idle_rows_hidden_unless_asked():
    snap = Snapshot("test", io=rows())
    assert "/thtest/idle" not in names(ViewState().io_rows(snap))
    assert "/thtest/idle" in names(ViewState(show_idle=True).io_rows(snap))


def test_split_keys_keeps_escape_sequences_whole():
    assert split_keys("ab\x1b[A/\t\x1b") == ["a", "b", "\x1b[A", "/", "\t", "\x1b"]
    assert split_keys("\x1b[15~q") == ["\x1b[15~", "q"]


def test_json_shape_and_base_units():
    snap = Snapshot("http://x/metrics", io=rows()[:1], interval_seconds=1.5)
    doc = json.loads(json.dumps(snap.as_json("read")))
    assert set(doc) == {"source", "interval_seconds", "window", "sort", "io", "rdma", "gpu",
                         "jobs"}
    assert doc["rdma"] == {"objects": None, "verb_errors": None} and doc["gpu"] is None
    (row,) = doc["io"]
    assert set(row) == {
        "kind", "name", "mountpoint", "fstype", "workload", "cgroups",
        "read_bytes_per_second", "write_bytes_per_second", "read_ops_per_second",
        "write_ops_per_second", "ops_per_second", "errors_per_second",
        "latency_p50_seconds", "latency_p99_seconds", "read_latency_p99_seconds",
        "write_latency_p99_seconds", "read_bytes_total", "write_bytes_total"}
    assert row["read_bytes_per_second"] == 5e9 and row["latency_p99_seconds"] == 0.002
    assert row["ops_per_second"] == 10 and row["latency_p50_seconds"] is None


def test_formatting():
    assert fmt_bytes(0) == "0 B" and fmt_bytes(1536) == "1.5 KiB"
    assert fmt_bytes(5 * 2**30) == "5.0 GiB"
    assert fmt_count(0) == "0" and fmt_count(2.5) == "2.5" and fmt_count(12345) == "12.3k"
    assert fmt_seconds(None) == "-" and fmt_seconds(2.5e-5) == "25µs"
    assert fmt_seconds(0.0123) == "12.3ms" and fmt_seconds(2) == "2.00s"


def render(renderable) -> str:
    console = Console(width=160, record=True, color_system=None)
    console.print(renderable)
    return console.export_text()


def test_table_marks_the_sort_column_and_shows_rows():
    state = ViewState(sort="read")
    text = render(io_table(sort_rows(rows(), "read"), state))
    assert "READ/s ▼" in text
    lines = [line for line in text.splitlines() if "101.0" in line or "ml/train" in line]
    assert "101.0" in lines[0] and "4.7 GiB" in lines[0] and "/scratch (lustre)" in lines[0]


def test_panels_say_no_data():
    snap = Snapshot("test", io=rows())
    for panel, needle in (("rdma", "RDMA objects: no data"), ("gpu", "GPU: no data")):
        assert needle in render(screen(ViewState(panel=panel), snap, "src", 1))
    assert "collecting" in render(screen(ViewState(), None, "src", 1))


def test_rows_beyond_the_screen_are_counted_not_drawn():
    many = [IoRow("cgroup", f"/c{i:02}", "/tmp", "tmpfs", write_bytes_per_second=100 - i)
            for i in range(40)]
    text = render(screen(ViewState(), Snapshot("test", io=many), "src", 1, height=20))
    assert len(text.splitlines()) <= 20
    assert "/c00" in text and "/c39" not in text and "more rows" in text
    assert "q quit" in text
