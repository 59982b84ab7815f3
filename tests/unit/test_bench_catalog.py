"""bench/run names every benchmark: one folder of bench/ per benchmark of its
catalogue (bench/__main__.py), each run as `python -m bench.FOLDER`, no
other folder with an entry of its own, no script at the top of bench/ but
the runner, and bench/README.md documents each by its module."""
import ast
from pathlib import Path

import bench.__main__ as run

BENCH = Path(__file__).resolve().parents[2] / "bench"


def runs_on_its_own(path: Path) -> bool:
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.If) and "__main__" in ast.unparse(node.test):
            return True
    return False


def test_every_benchmark_is_a_folder_with_an_entry_and_every_entry_a_benchmark():
    named = {b.script for b in run.BENCHMARKS}
    entries = {p.parent.name for p in BENCH.glob("*/__main__.py")}
    assert named - entries == set(), "a benchmark of the catalogue without bench/FOLDER/__main__.py"
    assert entries - named == set(), "a bench/FOLDER/__main__.py bench/run does not name"
    assert all((BENCH / s / "__init__.py").is_file() for s in named), named


def test_a_benchmarks_folder_is_its_name():
    assert [b.script for b in run.BENCHMARKS] == [b.name.replace("-", "_")
                                                  for b in run.BENCHMARKS]


def test_nothing_at_the_top_of_bench_runs_on_its_own_but_the_runner():
    alone = {p.name for p in BENCH.glob("*.py") if runs_on_its_own(p)}
    assert alone == {"__main__.py"}, "a benchmark outside a folder of its own"


def test_the_readme_names_every_benchmark():
    readme = (BENCH / "README.md").read_text()
    missing = [b.name for b in run.BENCHMARKS if f"`bench.{b.script}`" not in readme]
    assert missing == [], missing


def test_a_reports_commit_is_found_wherever_its_writer_put_it():
    keys = ("commit", "tracehound_commit")
    assert run.stamped({"facts": {"tracehound_commit": "abc"}, "rows": [1]}, keys) == "abc"
    assert run.stamped({"commit": "top", "facts": {"commit": "inner"}}, keys) == "top"
    assert run.stamped({"rows": []}, keys) is None
