"""The readers of names the node chose: the one parser of the agent's own
exposition (top, the chaos detection probe), /proc/PID/cgroup, and what top
draws on the terminal. A cgroup named with "\\r", a vertical tab, U+2028,
an ANSI escape or rich markup is read whole and shown inert."""
from prometheus_client.core import CounterMetricFamily
from prometheus_client.parser import text_string_to_metric_families

from tracehound.host.procs import cgroup_v2_path, parse_proc_cgroup
from tracehound.chaos.metrics import parse_samples
from tracehound.exporter.exposition import TEXT, render
from tracehound.exporter.rows import Blocks, ValueRows
from tracehound.exporter.text_parse import parse
from tracehound.top.model import IoRow, RdmaObjectRow, Snapshot
from tracehound.top.state import ViewState
from tracehound.top.view import io_table, rdma_panel, screen

from .test_top_model import render as draw
from .test_top_rates import TMP, by_name, io_series, two_scrapes

# every character str.splitlines() ends a line at, besides "\n"
BREAKS = "\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029"
NAME = f"/x/job{BREAKS}\x1b[2J\x1b]0;pwned\x07[bold]b[/x]\ufffd"


def agent_text(values) -> str:
    blocks = Blocks(["cgroup"])
    fam = ValueRows("tracehound_io_read_bytes", "Read.", "counter",
                    [blocks.get((v,)) for v in values], [1] * len(values))
    return b"".join(render([fam], TEXT)).decode("utf-8")


def test_the_parser_splits_lines_at_newline_only_and_agrees_with_prometheus_client():
    text = agent_text([NAME, 'a"b\\c\nd', "/plain"])
    ours = [(n, labels, v) for n, labels, v in parse(text).samples]
    theirs = [(s.name, s.labels, s.value)
              for f in text_string_to_metric_families(text) for s in f.samples]
    assert ours == theirs
    assert [labels["cgroup"] for _, labels, _ in ours] == [NAME, 'a"b\\c\nd', "/plain"]
    assert parse(text).types == {"tracehound_io_read_bytes_total": "counter"}


def test_the_chaos_probe_reads_a_cgroup_named_with_line_breaks():
    (labels, value), *_ = parse_samples(agent_text([NAME]))["tracehound_io_read_bytes_total"]
    assert labels == {"cgroup": NAME} and value == 1


def test_top_reads_a_cgroup_named_with_line_breaks():
    snap = two_scrapes([io_series(NAME, read=0)], [io_series(NAME, read=4096)])
    row = by_name(snap)[(NAME, TMP[0])]
    assert row.read_bytes_per_second == 2048


def test_top_shows_a_hostile_name_inert_and_keeps_the_table_whole():
    rows = [IoRow("cgroup", NAME, "/mnt\r", "tmpfs", read_bytes_per_second=1.0),
            IoRow("cgroup", "/next", "/mnt", "tmpfs", read_bytes_per_second=2.0)]
    text = draw(io_table(rows, ViewState()))
    # nothing reaches the terminal that it would act on
    assert not any(c in text for c in "\x1b\x07" + BREAKS)
    assert "\\x1b[2J" in text and "\\r" in text and "\\u2028" in text
    # rich markup in a name is text, not style (nor a MarkupError)
    assert "[bold]b[/x]" in text
    lines = [line for line in text.split("\n") if line.strip()]
    assert len(lines) == 4 and "/next" in lines[3]      # head, rule, two rows
    rdma = draw(rdma_panel([RdmaObjectRow(NAME, "mlx5_0", "QP", 1)], []))
    assert "\x1b" not in rdma and "[bold]b[/x]" in rdma
    state = ViewState(error=f"{NAME} failed")
    assert "\x1b" not in draw(screen(state, Snapshot("s", io=rows), "src", 1))


def test_proc_cgroup_lines_end_at_newline_only():
    assert parse_proc_cgroup("0::/system.slice/a.service\rjunk\n") == {
        "": "/system.slice/a.service\rjunk"}


def test_a_cgroup_named_with_a_newline_cannot_pass_for_another_membership(tmp_path):
    forged = "12:freezer:/slurm/uid_1/job_7/step_0\n0::/user.slice/x\n0::/slurm/job_99\n"
    paths = parse_proc_cgroup(forged)
    assert "" not in paths and paths["freezer"] == "/slurm/uid_1/job_7/step_0"
    (tmp_path / "42").mkdir()
    (tmp_path / "42" / "cgroup").write_bytes(b"0::/user.slice/trailing\r \xff\n")
    # neither stripped (another cgroup) nor decoded lossily (the kernel needs the bytes)
    assert cgroup_v2_path(42, str(tmp_path)) == "/user.slice/trailing\r \udcff"


def test_prometheus_client_families_with_hostile_names_reach_top():
    fam = CounterMetricFamily("tracehound_io_read_bytes", "Read.", labels=["cgroup"])
    fam.add_metric([NAME], 3)
    text = b"".join(render([fam], TEXT)).decode("utf-8")
    assert parse(text).samples == [("tracehound_io_read_bytes_total", {"cgroup": NAME}, 3.0)]
