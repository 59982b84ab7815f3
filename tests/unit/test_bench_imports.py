"""What bench/ and testbed/ may import, read from the source with `ast`
(nothing is imported): testbed/ holds the real systems that tests and
benchmarks both start, so it imports neither tests nor bench, and bench
never imports tests. Neither changes sys.path: every import resolves from
the repository root, as written.

Every `import` statement counts wherever it is, a function-level one
included. Dynamic imports (importlib.import_module) are not seen."""
import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# package -> the top-level packages of this repository it must not import
FORBIDDEN = {"bench": {"tests"}, "testbed": {"tests", "bench"}}


def problems(source: str, package: str, where: str = "<planted>") -> list[str]:
    """Imports of a module of PACKAGE that FORBIDDEN rules out, and any use
    of sys.path; relative imports stay inside the package."""
    out = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
        else:
            names = []
        for name in names:
            if name.split(".")[0] in FORBIDDEN[package]:
                out.append(f"{where}:{node.lineno}: imports {name}")
        if isinstance(node, ast.Attribute) and node.attr == "path" and \
                isinstance(node.value, ast.Name) and node.value.id == "sys":
            out.append(f"{where}:{node.lineno}: sys.path")
        if isinstance(node, ast.ImportFrom) and node.module == "sys" and \
                any(alias.name == "path" for alias in node.names):
            out.append(f"{where}:{node.lineno}: sys.path")
    return out


def test_bench_and_testbed_import_only_what_they_may():
    found = []
    for package in FORBIDDEN:
        files = sorted((ROOT / package).rglob("*.py"))
        assert files, package
        for path in files:
            found += problems(path.read_text(), package, str(path.relative_to(ROOT)))
    assert found == []


def test_the_check_sees_a_forbidden_import_wherever_it_is():
    assert problems("from tests.conftest import ROOT\n", "bench")
    assert problems("import tests.kernel.conftest as k\n", "bench")
    assert problems("def f():\n    from tests import prometheus_server\n", "bench")
    assert problems("from bench.common import log\n", "testbed")
    assert problems("import tests\n", "testbed")
    assert problems("import sys\nsys.path.insert(0, 'tests/vm')\n", "bench")
    assert problems("from sys import path\n", "testbed")


def test_the_check_lets_what_is_allowed_pass():
    assert problems("from testbed.prometheus import launch\nfrom bench.common import log\n"
                    "from . import report\nimport testsuite\n", "bench") == []
    assert problems("from testbed.cli import tracehound_cmd\nfrom . import network\n",
                    "testbed") == []
