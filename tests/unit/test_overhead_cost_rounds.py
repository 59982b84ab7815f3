"""bench/overhead's cost phase over several rounds: a condition's runs are
pooled for the tables, and its net is taken against the floor of the same
round, so drift between rounds (the floor moving with the machine) cancels
instead of landing on one side of the difference."""
import pytest

from bench.overhead.report import add_floors
from bench.overhead.tools import pool_rounds

W = "randread-4k"


def one_start(ns_per_run: float, runs_per_io: int, ios: int = 1000, name: str = "p", pid: int = 1,
              counted: dict | None = None) -> dict:
    runs = runs_per_io * ios
    total = ns_per_run * runs
    return {"programs": 1, "counted": counted, "fio_ios": {"read": ios, "write": 0},
            "workloads": {W: {"fio": {"total_ios": ios, "iops": 1e6},
                              "programs": [{"id": pid, "name": name, "type": "tracing",
                                            "run_time_ns": total, "run_cnt": runs,
                                            "ns_per_run": ns_per_run}],
                              "total_run_time_ns": total, "program_runs": runs,
                              "ns_per_io": total / ios}}}


def test_rounds_pool_by_program_name_and_keep_their_own_figures():
    a = one_start(80, 2, pid=7, counted={"read": 1000, "write": 0})
    b = one_start(100, 2, pid=9, counted={"read": 1000, "write": 0})
    x = pool_rounds([a, b])
    w = x["workloads"][W]
    assert w["fio"]["total_ios"] == 2000 and w["program_runs"] == 4000
    assert w["ns_per_io"] == pytest.approx(180)               # (160 + 200) / 2 per I/O
    [p] = w["programs"]
    assert p["id"] == "7/9" and p["run_cnt"] == 4000 and p["ns_per_run"] == pytest.approx(90)
    assert [r["ns_per_io"] for r in w["rounds"]] == [160, 200]
    assert x["counted"] == {"read": 2000, "write": 0} and x["fio_ios"]["read"] == 2000


def test_the_net_is_the_median_of_each_rounds_difference_to_its_own_floor():
    # the machine slows by 20 ns per program run from round to round, floor
    # and agent alike: paired, the agent's net is 25 ns in every round
    floors = [50, 70, 90]
    agent = [one_start(f + 12.5, 2) for f in floors]
    cs = {"empty": pool_rounds([one_start(f, 2) for f in floors]),
          "empty-exit": pool_rounds([one_start(f, 1) for f in floors]),
          "tracehound": pool_rounds(agent)}
    got = add_floors(cs)
    assert got[W]["empty"] == pytest.approx(70)                 # median floor, for the text
    x = cs["tracehound"]["workloads"][W]
    assert x["net_rounds"] == pytest.approx([25, 25, 25])
    assert x["net_ns_per_io"] == pytest.approx(25)


def test_one_round_keeps_the_single_start_figures():
    cs = {"empty": pool_rounds([one_start(50, 2)]), "empty-exit": pool_rounds([one_start(50, 1)]),
          "tracehound": pool_rounds([one_start(80, 2)])}
    add_floors(cs)
    x = cs["tracehound"]["workloads"][W]
    assert x["ns_per_io"] == 160 and x["net_ns_per_io"] == pytest.approx(60)
