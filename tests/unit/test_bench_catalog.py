"""bench/run names every benchmark: each script it names exists, every script
of bench/ that runs on its own is either a benchmark of the catalogue or a
part of one, and bench/README.md documents each by its name."""
import ast
import importlib.machinery
import importlib.util
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "bench"
# scripts that run on their own as parts of a benchmark, not as one
PARTS = {"accuracy_report.py", "overhead_report.py", "scrape_report.py", "mapfill.py",
         "empty_hooks.py", "vm_modes_guest.py", "vm_modes_ceems.py", "vm_modes_tool.py",
         "gpu_smi.py", "gpu_faults.py", "gpu_agent.py", "tracer.py"}


def catalogue():
    loader = importlib.machinery.SourceFileLoader("bench_run", str(BENCH / "run"))
    spec = importlib.util.spec_from_loader("bench_run", loader)
    module = importlib.util.module_from_spec(spec)
    sys.modules["bench_run"] = module       # its dataclasses look themselves up there
    loader.exec_module(module)
    return module


def runs_on_its_own(path: Path) -> bool:
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.If) and "__main__" in ast.unparse(node.test):
            return True
    return False


def test_every_benchmark_script_is_in_the_catalogue_or_a_part_of_one():
    run = catalogue()
    named = {b.script for b in run.BENCHMARKS}
    assert all((BENCH / s).is_file() for s in named), named
    alone = {p.name for p in BENCH.glob("*.py") if runs_on_its_own(p)}
    assert alone - named - PARTS == set(), "a benchmark bench/run does not name"
    assert PARTS & named == set()


def test_the_readme_names_every_benchmark():
    readme = (BENCH / "README.md").read_text()
    missing = [b.name for b in catalogue().BENCHMARKS if f"`{b.script}`" not in readme]
    assert missing == [], missing


def test_a_reports_commit_is_found_wherever_its_writer_put_it():
    run = catalogue()
    keys = ("commit", "tracehound_commit")
    assert run.stamped({"facts": {"tracehound_commit": "abc"}, "rows": [1]}, keys) == "abc"
    assert run.stamped({"commit": "top", "facts": {"commit": "inner"}}, keys) == "top"
    assert run.stamped({"rows": []}, keys) is None
