"""The time explain judges a job over (explain/span.py) and what it says
when it could not judge: Slurm's lines read field by field, the job's first
and last series found by range queries, the agents' lost data, the exit
status. The same against real Slurm and Prometheus: tests/cluster/test_explain.py."""
import re

import pytest

from tracehound import cli
from tracehound.explain import answer, fleet, render, span
from tracehound.explain.rules import RULES

NOW = 1_800_000_000.0


def test_a_running_job_runs_until_now_whatever_its_time_limit():
    got = span.parse_slurm_line(f"41|{int(NOW) - 600}|{int(NOW) + 3000}|RUNNING\n", "41", NOW)
    assert got == span.Span(NOW - 600, NOW, "slurm", running=True, state="RUNNING")


def test_an_ended_job_ends_when_slurm_says_and_other_jobs_lines_are_not_it():
    text = f"4|1|2|COMPLETED\n41|{int(NOW) - 600}|{int(NOW) - 60}|FAILED\n"
    assert span.parse_slurm_line(text, "41", NOW) == span.Span(NOW - 600, NOW - 60, "slurm",
                                                               state="FAILED")
    assert span.parse_slurm_line(text, "5", NOW) is None


@pytest.mark.parametrize("line", ["41|N/A|N/A|PENDING", "41|0|0|PENDING", "41|Unknown|Unknown|",
                                  "41|100|200", "41|100|200|COMPLETED|x", ""])
def test_a_job_not_started_or_a_line_not_read_has_no_span(line):
    assert span.parse_slurm_line(line, "41", NOW) is None


def test_squeue_first_then_sacct_then_nothing(monkeypatch):
    asked = []

    def run(argv):
        asked.append(argv[0])
        return "41|100|200|COMPLETED" if argv[0] == "sacct" else None
    monkeypatch.setattr(span, "_run", run)
    assert span.from_slurm("41", NOW) == span.Span(100.0, 200.0, "slurm", state="COMPLETED")
    assert asked == ["squeue", "sacct"]


class Present:
    """Prometheus's range answer for the job's series: those that go with
    its cgroup from `first` to `last`, its exits until `exits_until` (a
    retirement period later): a point at each step between."""

    def __init__(self, first: float, last: float, exits_until: float | None = None):
        self.first, self.last, self.asked = first, last, 0
        self.exits_until = exits_until

    def over(self, promql, start, end, step):
        self.asked += 1
        assert 'job_id="41"' in promql and '"kind", "live"' in promql
        # last_over_time(...[Ns]): a point sees a sample within N s before it
        lookback = re.search(r"\[(\d+)s\]", promql)
        window = int(lookback.group(1)) if lookback else 0
        out = []
        for kind, until in (("live", self.last), ("exits", self.exits_until)):
            points, t = [], start
            while until is not None and t <= end:
                if self.first <= t and t - window <= until:
                    points.append((t, 1.0))
                t += step
            out += [({"kind": kind}, points)] if points else []
        return out


def test_the_series_give_a_finished_job_its_first_and_last_second():
    # its exits outlive its cgroup by a retirement period: not its end
    ask = Present(NOW - 86400 - 123.0, NOW - 7200 + 17.0, exits_until=NOW - 7200 + 137.0)
    got = span.from_series(ask, 'job_id="41"', NOW)
    # coarse (15 days in 100 points), then each edge in 100 points of the
    # step before: 130 s, 1.3 s, 1 s
    assert ask.asked == 1 + 2 * 3
    assert abs(got.start - ask.first) <= 3 and abs(got.end - ask.last) <= 3
    assert (got.source, got.running) == ("series", False)


def test_a_job_shorter_than_the_coarse_step_is_found_too():
    ask = Present(NOW - 86400 + 0.4, NOW - 86400 + 30.4)         # 30 s, a day ago
    got = span.from_series(ask, 'job_id="41"', NOW)
    assert abs(got.start - ask.first) <= 1 and abs(got.end - ask.last) <= 1, got


def test_the_series_of_a_running_job_run_until_now():
    got = span.from_series(Present(NOW - 3000, NOW), 'job_id="41"', NOW)
    assert NOW - got.end <= 3 and got.running and abs(got.start - (NOW - 3000)) <= 3


def test_no_series_no_span_and_the_window_cuts_the_span_to_its_last_part():
    old = NOW - 20 * 86400                  # beyond the 15 days searched
    assert span.from_series(Present(old, old + 60), 'job_id="41"', NOW) is None
    whole = span.Span(NOW - 7200, NOW - 60, "slurm")
    assert whole.cut(3600, NOW) == span.Span(NOW - 3600, NOW - 60, "slurm")
    assert whole.cut(None, NOW) == whole


def test_a_job_that_ended_before_the_window_is_said_so(monkeypatch):
    monkeypatch.setattr(span, "from_slurm", lambda job, now: span.Span(NOW - 7200, NOW - 3600,
                                                                        "slurm"))
    with pytest.raises(answer.ExplainError, match="ended before the last 900 s"):
        span.of_job(None, "41", 'job_id="41"', 900, NOW)


@pytest.mark.parametrize("argv, why", [(["1234\n"], "is not a Slurm job id"),
                                       (["12", "--window", "15m\n"], "a duration such as"),
                                       (["12", "--window", "0x1m"], "a duration such as")])
def test_a_trailing_newline_is_refused_not_half_read(argv, why, capsys):
    assert cli.main(["explain", *argv, "--prometheus", "http://127.0.0.1:1"]) == 2
    assert why in capsys.readouterr().out


def test_a_crash_is_not_advised_as_a_kill():
    kill = next(r for r in RULES if r.name == "killed_by_signal")
    for signal in ("SEGV", "BUS", "ABRT"):
        assert answer.judged(kill, {"signal": signal})[1] == answer.CRASH_ACTION
    assert answer.judged(kill, {"signal": "KILL"})[1].startswith("find who sent it")


class Instant:
    def __init__(self, *answers):
        self.answers, self.asked = list(answers), []

    def now(self, promql):
        self.asked.append(promql)
        return [type("S", (), {"labels": lb, "value": v}) for lb, v in self.answers.pop(0)]


def test_a_node_label_no_series_has_is_an_error_not_nothing_known():
    over = fleet.Over(span.Span(NOW - 60, NOW, "slurm"), now=NOW)
    ask = Instant([({"instance": "a:9560"}, 1.0)], [({}, 1.0)])
    with pytest.raises(answer.ExplainError, match="carry no label 'node'"):
        fleet._nodes(ask, 'job_id="41"', over, "node")
    # a job with no series at all is no error: nothing is known of it
    assert fleet._nodes(Instant([], []), 'job_id="41"', over, "node") == []


def test_data_an_agent_lost_in_the_jobs_span_is_named_with_its_node():
    over = fleet.Over(span.Span(NOW - 60, NOW, "slurm"), now=NOW)
    ask = Instant([({"node": "n2", "blind": "map_full", "map": "io_stats"}, 18988.0),
                   ({"node": "n1", "blind": "map_full", "map": "io_stats"}, 0.0),
                   ({"node": "n3", "blind": "not_scraped"}, 1.0)])
    got = fleet._blind(ask, 'node=~"n1|n2|n3"', over, "node")
    assert got == [{"node": "n2", "what": "map_full",
                    "says": "18988 updates lost: the agent's io_stats map was full"},
                   {"node": "n3", "what": "not_scraped", "says": fleet.BLIND["not_scraped"][1]}]
    [promql] = ask.asked
    assert promql.count("label_replace(") == len(fleet.BLIND) and "[60000ms] @ " in promql


def test_nothing_abnormal_where_an_agent_was_blind_is_no_clean_bill(monkeypatch, capsys):
    blind = answer.Answer("41", "its life", ["n1"], start=NOW - 60, end=NOW, span_source="slurm",
                          blind=[{"node": "n1", "what": "map_full", "says": "9 updates lost"}])
    text = render.text(blind, "http://prom:9090")
    assert "  blind in part: n1: 9 updates lost" in text
    assert text.splitlines()[-1].startswith("nothing judged abnormal, but the agents lost data")
    for got, status in ((blind, 3), (answer.Answer("41", "its life", []), 3),
                        (answer.Answer("41", "its life", ["n1"]), 0)):
        monkeypatch.setattr(fleet, "explain", lambda *a, **k: got)
        assert cli.main(["explain", "41", "--prometheus", "http://prom:9090"]) == status
    capsys.readouterr()


def test_node_mode_names_a_mean_latency_or_retransmissions_far_above_the_floor():
    from tracehound.explain import node
    mine = {"tracehound_io_write_latency_seconds_sum": [({"mountpoint": "/scratch"}, 8.16),
                                                        ({"mountpoint": "/"}, 0.01)],
            "tracehound_io_write_latency_seconds_count": [({"mountpoint": "/scratch"}, 100.0),
                                                          ({"mountpoint": "/"}, 100.0)],
            "tracehound_net_tcp_retransmits_total": [({"cgroup": "/a"}, 14000.0),
                                                     ({"cgroup": "/b"}, 627.0)]}
    got = {f.rule: f for f in node._far_above(mine, "n1")}
    assert set(got) == {"slow_writes", "tcp_retransmits"}
    assert got["slow_writes"].says == ("mean write latency 81.6 ms on /scratch, with no other "
                                       "node of the job to compare")
    assert got["tcp_retransmits"].value == 14627
    # below floor x factor (15 ms, 30 retransmissions): nothing
    calm = {"tracehound_io_write_latency_seconds_sum": [({"mountpoint": "/"}, 1.4)],
            "tracehound_io_write_latency_seconds_count": [({"mountpoint": "/"}, 100.0)],
            "tracehound_net_tcp_retransmits_total": [({}, 30.0)]}
    assert node._far_above(calm, "n1") == []


class Ranges:
    """Prometheus's range answers: a count on node a that grew at t=1777,
    sampled every second, seen by a trailing window of `window_s`."""

    def __init__(self):
        self.asked = []

    def over(self, promql, start, end, step):
        self.asked.append((start, end, step))
        points, t = [], start
        while t <= end:
            points.append((t, 1.0 if t >= 1777 else 0.0))
            t += step
        return [({"node": "a", "signal": "KILL"}, points)]


def test_a_long_jobs_since_is_refined_to_about_its_scrape():
    kill = next(r for r in RULES if r.name == "killed_by_signal")
    over = fleet.Over(span.Span(1000.0, 1000.0 + 3600, "slurm"), now=4600.0)   # a 15 s step
    ask = Ranges()
    got = fleet._since(ask, kill, {"job": 'job_id="7"', "by": "node, signal"}, over, "node",
                       alone=False)
    assert got == {("a", "KILL"): pytest.approx(1777, abs=1.0)}
    assert len(ask.asked) == 2 and ask.asked[0][2] == 15.0 and ask.asked[1][2] < 1.01


def test_a_completing_job_has_ended_when_slurm_says():
    got = span.parse_slurm_line(f"41|{int(NOW) - 600}|{int(NOW) - 5}|COMPLETING", "41", NOW)
    assert got == span.Span(NOW - 600, NOW - 5, "slurm", running=False, state="COMPLETING")


def test_a_job_shorter_than_slurms_second_has_no_node_time_of_its_own():
    xid = next(r for r in RULES if r.name == "gpu_xid")
    over = fleet.Over(span.Span(NOW - 0.6, NOW, "slurm"), now=NOW)
    assert over.node_empty
    assert fleet._judge(Instant(), xid, 'job_id="41"', 'node=~"n1"', over, "node",
                        alone=True) == []


def test_a_signal_on_every_node_at_an_ended_jobs_end_is_how_it_ended_not_a_fault():
    def kill(node, signal, since):
        return answer.Finding("killed_by_signal", 4, node, {"signal": signal}, 1, "x", "y",
                              since=since)
    ended = span.Span(NOW - 600, NOW - 100, "series")
    a = answer.Answer("41", "its life", ["n1", "n2"],
                      findings=[kill("n1", "TERM", NOW - 99), kill("n2", "TERM", NOW - 98),
                                kill("n2", "KILL", NOW - 400)])
    fleet._set_apart_the_end(a, ended)
    assert [(f.node, f.labels["signal"]) for f in a.findings] == [("n2", "KILL")]
    assert a.ended_by == ("SIGTERM to its processes in its last moments (on every node: a "
                          "scancel, its time limit or a shutdown)")
    assert "  ended: SIGTERM" in render.text(a, "http://prom:9090")
    # on one node only, or while the job runs: a finding
    for found, nodes in ((ended, ["n1", "n2", "n3"]), (span.Span(NOW - 600, NOW, "slurm",
                                                                  running=True), ["n1", "n2"])):
        b = answer.Answer("41", "its life", nodes, findings=[kill("n1", "TERM", NOW - 99),
                                                              kill("n2", "TERM", NOW - 98)])
        fleet._set_apart_the_end(b, found)
        assert len(b.findings) == 2 and b.ended_by is None
    # a rank the OOM killer took gets no TERM: the other nodes' is the end
    oom = answer.Finding("oom_kill", 5, "n3", {}, 1, "x", "y", since=NOW - 300)
    c = answer.Answer("41", "its life", ["n1", "n2", "n3"],
                      findings=[oom, kill("n1", "TERM", NOW - 99), kill("n2", "TERM", NOW - 98)])
    fleet._set_apart_the_end(c, ended)
    assert c.findings == [oom] and c.ended_by
    # Slurm says it cancelled the job: its TERM, wherever it landed, is the end
    d = answer.Answer("41", "its life", ["n1", "n2"], findings=[kill("n1", "TERM", NOW - 99)])
    fleet._set_apart_the_end(d, span.Span(NOW - 600, NOW - 100, "slurm", state="CANCELLED"))
    assert d.findings == [] and d.ended_by.endswith("(Slurm: CANCELLED)")
