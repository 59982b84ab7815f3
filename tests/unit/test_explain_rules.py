"""explain's judgement of the answers Prometheus gave: which nodes are
outliers among a job's, how a finding reads, and how they rank."""
import json

from tracehound.explain import fleet, render
from tracehound.explain.rules import RULES, fill

SLOW = next(r for r in RULES if r.name == "slow_writes")
RETRANS = next(r for r in RULES if r.name == "tcp_retransmits")


def rows(values: dict, **labels) -> list:
    return [({"node": n, **labels}, v) for n, v in values.items()]


def test_one_node_far_above_the_others_is_the_outlier():
    got = fleet.outliers(RETRANS, rows({"a": 2, "b": 3, "c": 400}), "node")
    assert [(lb["node"], v, round(r, 1)) for lb, v, r in got] == [("c", 400, 160.0)]


def test_alike_nodes_are_not_outliers_however_high():
    assert fleet.outliers(RETRANS, rows({"a": 900, "b": 1000, "c": 1100}), "node") == []


def test_below_the_floor_nothing_is_an_outlier():
    # 9 retransmissions against none elsewhere: under the rule's floor of 10
    assert fleet.outliers(RETRANS, rows({"a": 0, "b": 0, "c": 9}), "node") == []


def test_outliers_compare_like_with_like():
    # slow on /scratch on one node; /home slow on all of them is not one node's
    data = rows({"a": 0.002, "b": 0.003, "c": 0.2}, mountpoint="/scratch") + \
        rows({"a": 0.3, "b": 0.3, "c": 0.3}, mountpoint="/home")
    got = fleet.outliers(SLOW, data, "node")
    assert [(lb["node"], lb["mountpoint"]) for lb, _v, _r in got] == [("c", "/scratch")]


def test_a_lone_node_is_an_outlier_only_far_above_the_floor():
    assert fleet.outliers(RETRANS, rows({"a": 20}), "node") == []
    [(labels, value, ratio)] = fleet.outliers(RETRANS, rows({"a": 31}), "node")
    assert (labels["node"], value, ratio) == ("a", 31, None)


def test_fill_leaves_promql_braces_alone():
    expr = fill(RULES[0].expr, job='job_id="7"', window="5m", by="node")
    assert '{job_id="7",reason="oom"}[5m]' in expr and "sum by (node)" in expr
    assert "{" + "job" + "}" not in expr and "{window}" not in expr


def test_findings_rank_by_severity_then_onset_then_size():
    f = [fleet.Finding("tcp_retransmits", 3, "a", {}, 500, "x", "y", since=10.0, outlier=True),
         fleet.Finding("killed_by_signal", 4, "b", {}, 1, "x", "y", since=20.0),
         fleet.Finding("write_errors", 4, "c", {}, 90, "x", "y", since=5.0)]
    f.sort(key=fleet.rank)
    assert [x.node for x in f] == ["c", "b", "a"]


def test_text_and_json_say_nothing_abnormal_for_a_clean_job():
    a = fleet.Answer("12", "15m", ["n1", "n2"],
                     activity={"n1": {"read_bytes": 2048, "write_bytes": 0, "cpu_seconds": 3.25}},
                     queries=14, seconds=0.2)
    text = render.text(a, "http://prom:9090")
    assert text.splitlines()[0].startswith("job 12: 2 node(s) (n1, n2), last 15m")
    assert "  n1: read 2.0 KiB, wrote 0 B, CPU 3.2 s" in text
    assert "  n2: read -, wrote -, CPU -" in text
    assert text.splitlines()[-1] == "nothing abnormal"
    assert json.loads(render.as_json(a))["findings"] == []


def test_a_job_no_agent_saw_says_so():
    text = render.text(fleet.Answer("12", "15m", []), "http://prom:9090")
    assert "no node has series of it" in text and "ran nowhere an agent watched" in text


def test_bad_questions_are_refused_before_anything_is_asked(capsys):
    from tracehound.cli import main
    for argv, why in ((["12; drop"], "is not a Slurm job id"),
                      (["12", "--window", "15 minutes"], "a duration such as 90s"),
                      (["12", "--node-label", 'node"}'], "is not a label name")):
        # port 1: nothing answers there, so reaching Prometheus would say so instead
        assert main(["explain", *argv, "--prometheus", "http://127.0.0.1:1"]) == 2
        assert why in capsys.readouterr().out
