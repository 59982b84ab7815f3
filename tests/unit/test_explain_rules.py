"""explain's judgement of the answers Prometheus (or one agent) gave: which
nodes are outliers among a job's, how a finding reads and ranks, node mode's
sums, and the timeline drawn as text and as a picture."""
import datetime
import json
import re
import sys
import time

import pytest

from tracehound import cli
from tracehound.explain import answer, fleet, node, plot, render, span, timeline
from tracehound.explain.rules import RULES, fill

SLOW = next(r for r in RULES if r.name == "slow_writes")
RETRANS = next(r for r in RULES if r.name == "tcp_retransmits")
# a job that ran from t=1000 to t=1300, as Slurm says
OVER = fleet.Over(span.Span(1000.0, 1300.0, "slurm"))


def rows(values: dict, **labels) -> list:
    return [({"node": n, **labels}, v) for n, v in values.items()]


def test_one_node_far_above_the_others_is_the_outlier():
    got = fleet.outliers(RETRANS, rows({"a": 2, "b": 3, "c": 400}), "node", alone=False)
    assert [(lb["node"], v, round(r, 1)) for lb, v, r in got] == [("c", 400, 160.0)]


def test_alike_nodes_are_not_outliers_however_high():
    assert fleet.outliers(RETRANS, rows({"a": 900, "b": 1000, "c": 1100}), "node",
                          alone=False) == []


def test_below_the_floor_nothing_is_an_outlier():
    # 9 retransmissions against none elsewhere: under the rule's floor of 10
    assert fleet.outliers(RETRANS, rows({"a": 0, "b": 0, "c": 9}), "node", alone=False) == []


def test_outliers_compare_like_with_like():
    # slow on /scratch on one node; /home slow on all of them is not one node's
    data = rows({"a": 0.002, "b": 0.003, "c": 0.2}, mountpoint="/scratch") + \
        rows({"a": 0.3, "b": 0.3, "c": 0.3}, mountpoint="/home")
    got = fleet.outliers(SLOW, data, "node", alone=False)
    assert [(lb["node"], lb["mountpoint"]) for lb, _v, _r in got] == [("c", "/scratch")]


def test_a_job_on_one_node_is_an_outlier_only_far_above_the_floor():
    assert fleet.outliers(RETRANS, rows({"a": 20}), "node", alone=True) == []
    [(labels, value, ratio)] = fleet.outliers(RETRANS, rows({"a": 31}), "node", alone=True)
    assert (labels["node"], value, ratio) == ("a", 31, None)


def test_a_lone_value_of_a_job_on_several_nodes_waits_for_the_others():
    # the first node's mean write latency is known a scrape before its
    # neighbours': slow or not, nothing to compare it with yet
    assert fleet.outliers(SLOW, rows({"b": 0.0168}, mountpoint="/"), "node", alone=False) == []
    [(labels, _v, ratio)] = fleet.outliers(SLOW, rows({"b": 0.0168}, mountpoint="/"), "node",
                                           alone=True)
    assert labels["node"] == "b" and ratio is None


class Answers:
    """Prometheus's range answer to the one question _since asks."""

    def __init__(self, series):
        self.series = series

    def over(self, promql, start, end, step):
        return self.series


class Judged(Answers):
    """Prometheus's instant answer to the rule, and its range answer to _since."""

    def __init__(self, rows):
        super().__init__([(labels, [(0.0, 0.0), (10.0, value)]) for labels, value in rows])
        self.rows, self.asked = rows, []

    def now(self, promql):
        self.asked.append(promql)
        return [type("S", (), {"labels": labels, "value": value}) for labels, value in self.rows]


def test_a_nodes_own_retransmissions_are_asked_of_the_jobs_nodes_and_read_against_them():
    rule = next(r for r in RULES if r.name == "node_tcp_retransmits")
    ask = Judged(rows({"a": 0, "b": 2, "c": 300}))
    [f] = fleet._judge(ask, rule, 'job_id="7"', 'node=~"a|b|c"', OVER, "node", alone=False)
    assert 'tracehound_net_node_tcp_retransmitted_segments_total{node=~"a|b|c"}' in ask.asked[0]
    assert "job_id" not in ask.asked[0]         # the node's series carry no job
    assert (f.node, f.value, f.outlier, f.since) == ("c", 300, True, 10.0)
    assert f.says == "300 TCP segments retransmitted by the node, 300.0x the median of " \
                     "the job's other nodes"
    [f] = fleet._judge(Judged(rows({"a": 0, "b": 0, "c": 400})), rule, 'job_id="7"',
                       'node=~"a|b|c"', OVER, "node", alone=False)
    assert f.says.endswith(", while the job's other nodes had none")
    # a few retransmissions of a busy healthy node are no finding, even alone
    assert fleet._judge(Judged(rows({"a": 0, "b": 0, "c": 40})), rule, 'job_id="7"',
                        'node=~"a|b|c"', OVER, "node", alone=False) == []
    [f] = fleet._judge(Judged(rows({"c": 400})), rule, 'job_id="7"', 'node=~"c"', OVER, "node",
                       alone=True)
    assert f.says.endswith(", with no other node of the job to compare") and not f.outlier


class Stamped(Judged):
    """Judged, and the agent's own times of the events the rule counted."""

    def __init__(self, rows, times):
        super().__init__(rows)
        self.series = [(labels, [(1000.0, 0.0), (1010.0, value)]) for labels, value in rows]
        self.times = times

    def now(self, promql):
        if "last_exit_timestamp_seconds" not in promql:
            return super().now(promql)
        self.asked.append(promql)
        return [type("S", (), {"labels": labels, "value": at}) for labels, at in self.times]


def test_a_kills_since_is_the_agents_time_of_it_not_the_scrape_that_counted_it():
    rule = next(r for r in RULES if r.name == "killed_by_signal")
    kill = {"signal": "KILL"}
    # counted by the scrapes at t=1010 (the range answer); killed at
    # 1007.25 on b; c's time is from before the job (a stale stamp), d's
    # after the scrape that counted it: neither replaces the scrape's
    ask = Stamped(rows({"b": 1, "c": 1, "d": 1}, **kill),
                  [({"node": "b", **kill}, 1007.25), ({"node": "c", **kill}, 900.0),
                   ({"node": "d", **kill}, 1011.0)])
    got = fleet._judge(ask, rule, 'job_id="7"', 'node=~"b|c|d"', OVER, "node", alone=False)
    assert {f.node: f.since for f in got} == {"b": 1007.25, "c": 1010.0, "d": 1010.0}
    assert ('min by (node, signal) (min_over_time(tracehound_process_last_exit_timestamp_'
            'seconds{job_id="7",reason="signal"}[450000ms] @ 1450.000))') in ask.asked[-1]


def test_a_node_condition_reads_as_health_drains_on_it_with_its_own_action():
    rule = next(r for r in RULES if r.name == "node_unfit")
    bus = "0000:3b:00.0"
    ask = Judged([({"node": "c", "pci_bus_id": bus, "condition": "nvlink_down"}, 1.0),
                  ({"node": "a", "pci_bus_id": bus, "condition": "thermal_slowdown"}, 1.0),
                  ({"node": "b", "pci_bus_id": bus, "condition": "lost"}, 0.0)])
    got = fleet._judge(ask, rule, 'job_id="7"', 'node=~"a|b|c"', OVER, "node", alone=False)
    assert 'tracehound_gpu_health{node=~"a|b|c",condition=~"lost|' in ask.asked[0]
    by_node = {f.node: f for f in got}
    assert set(by_node) == {"a", "c"}            # b's GPU was never lost in the window
    assert by_node["c"].says == f"GPU {bus}: NVLink down" and by_node["c"].severity == 5
    assert by_node["c"].action.startswith("reset the GPU and check its NVLink")
    # not a condition health drains on by default: worth a look, no more
    assert by_node["a"].says == f"GPU {bus}: GPU thermal slowdown" and by_node["a"].severity == 2
    assert by_node["c"].labels == {"pci_bus_id": bus, "condition": "nvlink_down"}


def test_node_mode_names_the_gpu_conditions_that_hold_now():
    rows = [({"pci_bus_id": "b1", "condition": "recent_fatal_xid"}, 1.0),
            ({"pci_bus_id": "b1", "condition": "lost"}, 0.0),
            ({"pci_bus_id": "b1", "condition": "a_condition_of_a_newer_agent"}, 1.0)]
    [f] = node._unfit(rows, "n1")
    assert (f.rule, f.node, f.severity) == ("node_unfit", "n1", 5)
    assert f.says == "GPU b1: fatal XID within the agent's window (now)"


def test_every_rule_is_asked_over_the_jobs_span_and_no_other_time():
    # an XID an hour before the job, or a minute after it, is the node's, not
    # the job's: the node's series are asked from the second after Slurm's
    # whole-second start to the job's end; the job's own, nobody else's, until
    # 150 s after it (what its end counted is scraped after it)
    ask = Judged([])
    for rule in RULES:
        fleet._judge(ask, rule, 'job_id="7"', 'node=~"a|b"', OVER, "node", alone=False)
    assert len(ask.asked) == len(RULES)
    for rule, promql in zip(RULES, ask.asked):
        length, end = ("450000ms", "1450.000") if rule.job_labelled else ("299000ms", "1300.000")
        ranges = re.findall(r"\[([^\]]+)\]( @ [0-9.]+)?( offset [0-9a-z]+)?", promql)
        # the span, or the lookback before it for a count's value at its start
        assert ranges and all(r in ((length, f" @ {end}", ""),
                                    ("5m", f" @ {end}", f" offset {length}")) for r in ranges), \
            promql
    xid = next(q for q in ask.asked if "gpu_xid" in q)
    assert ('last_over_time(tracehound_gpu_xid_errors_total{node=~"a|b"}[5m] @ 1300.000 '
            'offset 299000ms)') in xid


def test_an_outlier_is_one_since_it_parted_from_the_others_not_since_it_wrote():
    # mean write latency is above zero on every node all along; node c's
    # rose at t=30 (a throttled disk) and stays high
    times = [0.0, 10.0, 20.0, 30.0, 40.0]
    series = [({"node": "a", "mountpoint": "/"}, [(t, 0.002) for t in times]),
              ({"node": "b", "mountpoint": "/"}, [(t, 0.003) for t in times]),
              ({"node": "c", "mountpoint": "/"},
               [(t, 0.002 if t < 30 else 0.2) for t in times])]
    assert fleet._since(Answers(series), SLOW, {"job": 'job_id="7"', "by": "node, mountpoint"},
                        OVER, "node", alone=False) == {("c", "/"): 30.0}


def test_a_count_holds_since_it_first_grew():
    series = [({"node": "a", "signal": "KILL"}, [(0.0, 0.0), (10.0, 1.0), (20.0, 1.0)]),
              ({"node": "b", "signal": "KILL"}, [(0.0, 0.0), (10.0, 0.0), (20.0, 0.0)])]
    rule = next(r for r in RULES if r.name == "killed_by_signal")
    assert fleet._since(Answers(series), rule, {"job": 'job_id="7"', "by": "node, signal"},
                        OVER, "node", alone=False) == {("a", "KILL"): 10.0}


def test_fill_leaves_promql_braces_alone():
    expr = fill(RULES[0].expr, job='job_id="7"', window="5m", at="", by="node")
    assert '{job_id="7",reason="oom"}[5m]' in expr and "sum by (node)" in expr
    assert "{" + "job" + "}" not in expr and "{window}" not in expr and "{at}" not in expr


def test_findings_rank_by_severity_then_onset_then_size():
    f = [answer.Finding("tcp_retransmits", 3, "a", {}, 500, "x", "y", since=10.0, outlier=True),
         answer.Finding("killed_by_signal", 4, "b", {}, 1, "x", "y", since=20.0),
         answer.Finding("write_errors", 4, "c", {}, 90, "x", "y", since=5.0)]
    f.sort(key=answer.rank)
    assert [x.node for x in f] == ["c", "b", "a"]
    # same severity and onset: the outlier, then the larger value, first
    tie = [answer.Finding("write_errors", 4, "d", {}, 90, "x", "y", since=5.0),
           answer.Finding("write_errors", 4, "e", {}, 200, "x", "y", since=5.0),
           answer.Finding("write_errors", 4, "f", {}, 10, "x", "y", since=5.0, outlier=True),
           answer.Finding("write_errors", 4, "g", {}, 300, "x", "y")]      # onset unknown: last
    tie.sort(key=answer.rank)
    assert [x.node for x in tie] == ["f", "e", "d", "g"]


def test_text_and_json_say_nothing_abnormal_for_a_clean_job():
    start = time.time() - 600
    a = answer.Answer("12", "its life", ["n1", "n2"],
                     activity={"n1": {"read_bytes": 2048, "write_bytes": 0, "cpu_seconds": 3.25}},
                     queries=14, seconds=0.2, start=start, end=time.time(), span_source="slurm",
                     running=True)
    text = render.text(a, "http://prom:9090")
    began = datetime.datetime.fromtimestamp(start).strftime("%H:%M:%S")
    assert text.splitlines()[0].startswith(
        f"job 12: 2 node(s) (n1, n2), {began} to now (as Slurm says)"), text
    assert "  n1: read 2.0 KiB, wrote 0 B, CPU 3.2 s" in text
    assert "  n2: read -, wrote -, CPU -" in text
    assert text.splitlines()[-1] == "nothing abnormal"
    assert json.loads(render.as_json(a))["findings"] == []


def test_a_job_no_agent_saw_says_so():
    text = render.text(answer.Answer("12", "15m", []), "http://prom:9090")
    assert "no node has series of it" in text and "ran nowhere an agent watched" in text
    assert "not known to Slurm or in any series" in text


def test_bad_questions_are_refused_before_anything_is_asked(capsys):
    from tracehound.cli import main
    for argv, why in ((["12; drop"], "is not a Slurm job id"),
                      (["12", "--window", "15 minutes"], "a duration such as 90s"),
                      (["12", "--node-label", 'node"}'], "is not a label name")):
        # port 1: nothing answers there, so reaching Prometheus would say so instead
        assert main(["explain", *argv, "--prometheus", "http://127.0.0.1:1"]) == 2
        assert why in capsys.readouterr().out


def test_node_mode_adds_up_a_counting_rule_over_the_job_s_series_only():
    kill = next(r for r in RULES if r.name == "killed_by_signal")
    rows = [({"job_id": "7", "reason": "signal", "signal": "KILL", "step": "0"}, 1.0),
            ({"job_id": "7", "reason": "signal", "signal": "KILL", "step": "1"}, 2.0),
            ({"job_id": "7", "reason": "exit", "signal": "", "step": "0"}, 5.0),
            ({"job_id": "7", "reason": "signal", "signal": "TERM", "step": "0"}, 0.0)]
    [f] = node._counted(kill, rows, "n1")
    assert (f.node, f.labels, f.value) == ("n1", {"signal": "KILL"}, 3.0)
    assert f.says == "3 process(es) of the job killed by SIGKILL" and f.since is None


def test_node_mode_counts_the_xids_of_the_window_with_when_they_came():
    now = time.time()

    def at(t):
        return datetime.datetime.fromtimestamp(t, datetime.timezone.utc).isoformat()
    events = [{"kind": "xid", "xid": 79, "pci_bus_id": "0000:3b:00.0", "time": at(now - 30)},
              {"kind": "xid", "xid": 79, "pci_bus_id": "0000:3b:00.0", "time": at(now - 10)},
              {"kind": "xid", "xid": 13, "pci_bus_id": "0000:3b:00.0", "time": at(now - 3600)},
              {"kind": "thermal_slowdown", "pci_bus_id": "0000:3b:00.0", "time": at(now)},
              {"kind": "xid", "xid": "79; x", "time": "not a time"}, "not an event"]
    ran = span.Span(now - 900, now, "")
    [f] = node._xids(json.dumps({"events": events, "next": 6}), ran, "n1")
    assert (f.labels, f.value, f.severity) == ({"pci_bus_id": "0000:3b:00.0", "xid": "79"}, 2, 5)
    assert abs(f.since - (now - 30)) < 1e-3 and f.action.startswith("XID 79 (GPU fell off")


def test_node_mode_refuses_what_is_not_an_event_log():
    with pytest.raises(answer.ExplainError, match="not an event list"):
        node._xids("<html>", span.Span(0, 1, ""), "n1")


def test_one_node_or_the_fleet_not_both(capsys):
    assert cli.main(["explain", "7", "--prometheus", "http://p:9090", "--url",
                     "http://a:9560/metrics"]) == 2
    assert "--url and --node are for one node's agent" in capsys.readouterr().out


def test_an_agent_that_does_not_answer_is_said_so(capsys):
    assert cli.main(["explain", "7", "--url", "http://127.0.0.1:9/metrics"]) == 2
    assert "cannot read http://127.0.0.1:9/metrics" in capsys.readouterr().out


def test_names_from_the_node_cannot_drive_the_terminal():
    # a user named a mount point with a clear-screen and a line of its own
    mount = "/scratch\x1b[2J\n1. [5] n9: all is lost\u202e"
    f = answer.Finding("write_errors", 4, "n1", {"mountpoint": mount}, 2,
                       f"2 failed write call(s) on {mount}", "check")
    out = render.text(answer.Answer("12", "15m", ["n1"], [f]), "http://prom:9090")
    assert "\x1b" not in out and "\u202e" not in out
    assert "/scratch\\x1b[2J\\n1. [5] n9: all is lost\\u202e" in out
    assert len(out.splitlines()) == 4       # head, n1's activity, the finding, what to do


def test_a_timeline_row_puts_each_sample_in_its_column_and_leaves_gaps_blank():
    series = [({"node": "a"}, [(100.0, 1.0), (110.0, 2.0), (float(100 + 10 * 59), 3.0)]),
              ({"node": "b"}, [(120.0, float("nan"))])]
    rows = timeline.collect(series, 100.0, 10.0, "node")
    assert rows["a"][:3] == [1.0, 2.0, None] and rows["a"][59] == 3.0
    assert rows["b"] == [None] * timeline.COLUMNS


def test_one_scale_per_signal_makes_the_unlike_node_stand_out():
    slow, fast = [0.2] * 4, [0.002] * 4
    top = max(slow + fast)
    assert timeline.bar(slow, top) == "████"
    assert timeline.bar(fast, top) == "▂▂▂▂"           # above zero, far below the top
    assert timeline.bar([0.0, None, 0.1], top) == "▁ ▅"


def test_the_drawing_marks_each_finding_where_it_began():
    cols = timeline.COLUMNS
    tl = {"write latency": {"n1": [0.002] * cols, "n3": [0.002] * 30 + [0.2] * (cols - 30)},
          "node retransmits": {"n1": [0.0] * cols}}
    f = answer.Finding("slow_writes", 2, "n3", {"mountpoint": "/"}, 0.07, "x", "y",
                       since=1000.0 + 30 * 5)
    lines = timeline.draw(tl, 1000.0, 5.0, [f])
    assert lines[1] == "  write latency (top 200.0 ms)"
    assert lines[3].startswith("    n3   |" + "▂" * 30 + "█")
    assert lines[-1] == "    " + " " * 4 + "  " + " " * 30 + "1"
    assert not any("retransmits" in ln for ln in lines)     # flat at zero: left out


def test_the_timeline_fills_one_label_without_filling_it_twice():
    q = timeline.query("stopped", 'job_id="5"', 'node=~"a|b"', "RANGE", 5)
    assert q == 'sum by (RANGE) (tracehound_cgroup_processes{job_id="5",state="stopped"})'
    assert "[30s]" in timeline.query("write", 'job_id="5"', 'node=~"a|b"', "node", 5)
    # the node's own series are asked of the job's nodes, not by the job
    q = timeline.query("node retransmits", 'job_id="5"', 'node=~"a|b"', "node", 5)
    assert q == ('sum by (node) (rate(tracehound_net_node_tcp_retransmitted_segments_total'
                 '{node=~"a|b"}[30s]))')


def test_the_timeline_needs_prometheus(capsys):
    assert cli.main(["explain", "7", "--timeline"]) == 2
    assert "--timeline and --plot need --prometheus" in capsys.readouterr().out


def test_the_plot_draws_the_nodes_and_marks_the_findings(tmp_path):
    cols = timeline.COLUMNS
    a = answer.Answer("12", "5m", ["n1", "n3"], timeline_start=1000.0, timeline_step=5.0,
                      timeline={"write latency": {"n1": [0.002] * cols,
                                                  "n3": [0.002] * 30 + [0.2] * (cols - 30)},
                                "stopped": {"n1": [0.0] * cols}})
    a.findings = [answer.Finding("slow_writes", 2, "n3", {}, 0.07, "slow", "y", since=1150.0)]
    from matplotlib import dates as mdates, image     # the bench extra, as --plot needs
    fig = plot.figure(a)
    # one panel: the signal that moved ("stopped" stayed at zero)
    assert [ax.get_ylabel().split("\n")[0] for ax in fig.axes] == ["write latency"]
    lines = fig.axes[0].get_lines()
    drawn = {ln.get_label(): list(ln.get_ydata()) for ln in lines
             if not ln.get_label().startswith("_")}
    assert drawn == {"n1": [0.002] * cols, "n3": [0.002] * 30 + [0.2] * (cols - 30)}
    # the finding's onset: a dashed line at its time, numbered 1
    marks = [ln for ln in lines if ln.get_linestyle() == "--"]
    assert len(marks) == 1
    assert mdates.date2num(marks[0].get_xdata()[0]) == pytest.approx(
        mdates.date2num(datetime.datetime.fromtimestamp(1150.0)))
    assert [t.get_text() for t in fig.axes[0].texts] == ["1"]
    path = tmp_path / "job.png"
    plot.write(a, str(path))
    assert image.imread(str(path)).shape[:2] == (int(fig.get_figheight() * 110),
                                                 int(fig.get_figwidth() * 110))


def test_a_job_that_moved_nothing_has_no_plot(tmp_path):
    a = answer.Answer("12", "5m", ["n1"], timeline={"write": {"n1": [None] * 60}})
    with pytest.raises(answer.ExplainError, match="moved nothing"):
        plot.write(a, str(tmp_path / "x.png"))


def test_without_matplotlib_the_plot_says_how_to_get_it(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    a = answer.Answer("12", "5m", ["n1"], timeline={"write": {"n1": [1.0] * 60}})
    with pytest.raises(answer.ExplainError, match=r"pip install 'tracehound\[bench\]'"):
        plot.write(a, str(tmp_path / "x.png"))
