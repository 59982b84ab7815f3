"""The PromQL a fault's detection gives a Prometheus source, evaluated by
Prometheus's own promtool over series shaped like the real ones: a counter
or gauge born already non-zero (a fresh cgroup's first kill, its RSS) must
count, an old one only by what it grew."""
import yaml

from tests.unit.test_deploy_rules import promtool, run_promtool  # noqa: F401 (fixture)
from tracehound.chaos.faults import grown

KILLS = 'kills{cgroup="/new"}'
OLD = 'errors{cgroup="/old"}'
RSS_NEW = 'rss{cgroup="/new"}'
RSS_OLD = 'rss{cgroup="/old"}'


def test_grown_counts_series_born_non_zero_and_only_growth_of_old_ones(promtool, tmp_path):  # noqa: F811
    cases = [
        # (query, counter?, time, expected value)
        # born within the window: all of its value; older than the window: nothing
        (KILLS, True, "2m", 0), (KILLS, True, "4m", 1), (KILLS, True, "4m30s", 1),
        (KILLS, True, "5m30s", 0),
        (OLD, True, "3m", 0), (OLD, True, "6m", 2),
        (RSS_NEW, False, "2m", 0), (RSS_NEW, False, "4m30s", 500), (RSS_NEW, False, "6m", 0),
        (RSS_OLD, False, "3m", 0), (RSS_OLD, False, "5m30s", 400),
        ('nothing{cgroup="/x"}', True, "5m", 0), ('nothing{cgroup="/x"}', False, "5m", 0),
    ]
    doc = {"rule_files": [], "evaluation_interval": "30s", "tests": [{
        "interval": "30s",
        "input_series": [
            # absent for 4 minutes, then 1 and never again
            {"series": KILLS, "values": "_x8 1x10"},
            # 7 for five minutes, then one more every 30 s
            {"series": OLD, "values": "7x10 8+1x8"},
            {"series": RSS_NEW, "values": "_x8 500x10"},
            {"series": RSS_OLD, "values": "100x10 500x8"},
        ],
        "promql_expr_test": [
            {"expr": grown(q, counter=c), "eval_time": t,
             "exp_samples": [{"labels": "{}", "value": v}]}
            for q, c, t, v in cases],
    }]}
    path = tmp_path / "grown.yml"
    path.write_text(yaml.safe_dump(doc))
    run_promtool(promtool, "test", "rules", str(path))
