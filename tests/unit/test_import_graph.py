"""The import graph of src/tracehound, read from the source with `ast` (nothing
is imported): no cycles between modules, none between sub-packages, and no
module reaching into another's private names.

Every `import` statement counts wherever it is, a function-level import
included: deferring an import to dodge a cycle leaves the cycle in the design.
Only imports under `if TYPE_CHECKING:` are left out (they never run).
Dynamic imports (importlib.import_module) are not seen.
"""
import ast
from pathlib import Path

PKG = "tracehound"
ROOT = Path(__file__).resolve().parents[2] / "src" / PKG


def _modules() -> dict[str, Path]:
    """dotted module name -> file; a package is named by its __init__.py"""
    out = {}
    for path in sorted(ROOT.rglob("*.py")):
        parts = path.relative_to(ROOT.parent).with_suffix("").parts
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


MODULES = _modules()


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _short(module: str) -> str:
    return module.removeprefix(PKG + ".")


def _dotted(node) -> str | None:
    """a.b.c for a chain of attribute accesses on a plain name"""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    return ".".join([node.id, *reversed(parts)])


class _Scan(ast.NodeVisitor):
    """The tracehound imports of one module, and its uses of other modules'
    private names."""

    def __init__(self, name: str):
        self.name = name
        self.package = name if MODULES[name].name == "__init__.py" else name.rpartition(".")[0]
        self.edges: dict[str, int] = {}     # imported module -> first line
        self.aliases: dict[str, str] = {}   # local name -> the module it is bound to
        self.private: list[str] = []

    def _edge(self, target: str, line: int) -> None:
        if target != self.name:
            self.edges.setdefault(target, line)

    def _flag(self, line: int, what: str) -> None:
        self.private.append(f"{_short(self.name)}:{line}: {what}")

    @staticmethod
    def _existing(dotted: str) -> str | None:
        """the longest prefix of dotted that is one of our modules"""
        parts = dotted.split(".")
        for n in range(len(parts), 0, -1):
            if ".".join(parts[:n]) in MODULES:
                return ".".join(parts[:n])
        return None

    def visit_If(self, node: ast.If) -> None:
        test = node.test
        if (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or \
                (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"):
            for child in node.orelse:
                self.visit(child)
        else:
            self.generic_visit(node)

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            target = self._existing(alias.name)
            if target is None:
                continue
            self._edge(target, node.lineno)
            if alias.asname:
                self.aliases[alias.asname] = target
            else:   # `import tracehound.x.y` binds the name tracehound
                self.aliases[alias.name.split(".")[0]] = alias.name.split(".")[0]

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        if node.level:
            base = self.package.split(".")
            base = base[:len(base) - (node.level - 1)]
            source = ".".join(base + ([node.module] if node.module else []))
        else:
            source = node.module or ""
        if source.split(".")[0] != PKG:
            return
        for alias in node.names:
            sub = f"{source}.{alias.name}"
            if sub in MODULES:      # `from pkg import module`
                self._edge(sub, node.lineno)
                self.aliases[alias.asname or alias.name] = sub
                if _private(alias.name) and not self.name.startswith(source + "."):
                    self._flag(node.lineno, f"imports private module {_short(sub)}")
                continue
            target = self._existing(source)
            if target is None:
                continue
            self._edge(target, node.lineno)
            if _private(alias.name) and target != self.name:
                self._flag(node.lineno, f"imports {alias.name} from {_short(target)}")

    def visit_Attribute(self, node: ast.Attribute) -> None:
        dotted = _dotted(node)
        head, _, rest = (dotted or "").partition(".")
        if dotted is None or head not in self.aliases or not rest:
            self.generic_visit(node)
            return
        # expand the alias, then find where the module path ends
        full = f"{self.aliases[head]}.{rest}".split(".")
        for n in range(len(full) - 1, 0, -1):
            module = ".".join(full[:n])
            if module in MODULES:
                if _private(full[n]) and module != self.name:
                    self._flag(node.lineno, f"uses {_short(module)}.{full[n]}")
                break


def _scan_all() -> dict[str, _Scan]:
    scans = {}
    for name, path in MODULES.items():
        scan = _Scan(name)
        scan.visit(ast.parse(path.read_text(), str(path)))
        scans[name] = scan
    return scans


SCANS = _scan_all()


def _cycles(graph: dict[str, dict[str, str]], limit: int = 200) -> list[list[str]]:
    """Every elementary cycle of graph (node -> {successor: witness}), each
    once, starting from its smallest node; at most `limit` of them."""
    def reach(start):
        seen, todo = set(), [start]
        while todo:
            for nxt in graph.get(todo.pop(), ()):
                if nxt not in seen:
                    seen.add(nxt)
                    todo.append(nxt)
        return seen
    reachable = {n: reach(n) for n in graph}
    found = []
    for start in sorted(graph):
        # only nodes of start's strongly connected component can close a cycle
        allowed = {n for n in reachable[start] if n > start and start in reachable.get(n, ())}
        path, stack = [start], [iter(sorted(graph[start]))]
        while stack:
            nxt = next(stack[-1], None)
            if nxt is None:
                stack.pop()
                path.pop()
            elif nxt == start:
                found.append(path + [start])
                if len(found) >= limit:
                    return found
            elif nxt in allowed and nxt not in path:
                path.append(nxt)
                stack.append(iter(sorted(graph.get(nxt, ()))))
    return found


def _chain(graph, cycle) -> str:
    """a -> b -> a, each arrow annotated with the import that makes it"""
    hops = [f"{a} -[{graph[a][b]}]-> " for a, b in zip(cycle, cycle[1:])]
    return "".join(hops) + cycle[-1]


def _package(module: str) -> str:
    """tracehound.collectors.io -> collectors; tracehound.agent -> agent"""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else PKG


def test_no_import_cycles_between_modules():
    graph = {_short(m): {_short(t): f"line {line}" for t, line in s.edges.items()}
             for m, s in SCANS.items()}
    cycles = _cycles(graph)
    assert not cycles, f"{len(cycles)} module import cycle(s):\n" + \
        "\n".join(_chain(graph, c) for c in cycles)


def test_no_import_cycles_between_packages():
    graph: dict[str, dict[str, str]] = {}
    for m, s in SCANS.items():
        for t, line in s.edges.items():
            a, b = _package(m), _package(t)
            if a != b:      # witness: the first import seen for this edge
                graph.setdefault(a, {}).setdefault(b, f"{_short(m)}:{line} imports {_short(t)}")
    cycles = _cycles(graph)
    assert not cycles, f"{len(cycles)} package import cycle(s):\n" + \
        "\n".join(_chain(graph, c) for c in cycles)


def test_no_module_uses_another_modules_private_names():
    uses = [u for s in SCANS.values() for u in s.private]
    assert not uses, f"{len(uses)} use(s) of private names across modules:\n" + "\n".join(uses)


# --- the scanner itself ------------------------------------------------------

def test_the_scanner_resolves_relative_and_nested_imports():
    name = next(m for m in MODULES if m.count(".") == 2 and MODULES[m].name != "__init__.py")
    pkg = name.rpartition(".")[0]
    sibling = next(m for m in MODULES if m.startswith(pkg + ".") and m != name)
    scan = _Scan(name)
    scan.visit(ast.parse(
        "from typing import TYPE_CHECKING\n"
        f"from . import {sibling.rpartition('.')[2]} as sib\n"
        "def f():\n"
        f"    from .. import errors\n"
        "    return errors._hidden, sib._x, sib.__doc__\n"
        "if TYPE_CHECKING:\n"
        f"    from {PKG} import agent\n"
        f"from {PKG}.errors import _y, __name__\n"))
    assert set(scan.edges) == {sibling, f"{PKG}.errors"}
    assert [p.split(": ", 1)[1] for p in scan.private] == [
        "uses errors._hidden", f"uses {_short(sibling)}._x", "imports _y from errors"]


# --- layers ------------------------------------------------------------------

# Lowest first. A package (or top-level module) imports only from layers below
# its own, never beside or above it: the node's readers cannot reach the
# agent's assembly, and nothing below the tools knows a tool. docs/architecture.md
# ("Layers") says the same in words.
LAYERS = (
    ("base", {PKG, "errors", "defaults", "printable", "signals", "conditions", "logsink",
              "terminal_progress", "regular_file", "utf8"}),
    ("node access", {"host", "bpf", "clients", "instance"}),
    ("sources and formats", {"attribution", "probes", "gpu", "exporter", "config",
                             "preflight", "linear_regex"}),
    ("readers", {"collectors", "detect"}),
    ("assembly", {"subsystems"}),
    ("agent", {"agent"}),
    ("tools", {"chaos", "explain", "health", "top"}),
    ("commands", {"commands", "cli"}),
    ("entry point", {"__main__"}),
)
LAYER_OF = {name: i for i, (_title, members) in enumerate(LAYERS) for name in members}


def _upward_or_sideways(scans) -> list[str]:
    out = []
    for m, s in scans.items():
        a = _package(m)
        for t, line in s.edges.items():
            b = _package(t)
            if a != b and LAYER_OF[b] >= LAYER_OF[a]:
                out.append(f"{_short(m)}:{line} imports {_short(t)}: "
                           f"{LAYERS[LAYER_OF[a]][0]} -> {LAYERS[LAYER_OF[b]][0]}")
    return out


def test_every_package_has_a_layer():
    assert {_package(m) for m in MODULES} - set(LAYER_OF) == set(), \
        "a package or top-level module with no layer: add it to LAYERS and to " \
        "docs/architecture.md"


def test_imports_go_down_the_layers_only():
    wrong = _upward_or_sideways(SCANS)
    assert not wrong, "imports that do not go down the layers:\n" + "\n".join(wrong)


def test_the_layer_check_sees_an_import_up_and_one_beside():
    probe = f"{PKG}.probes.io"
    scan = _Scan(probe)
    scan.visit(ast.parse(f"from {PKG}.subsystems import io\nfrom {PKG} import gpu\n"
                         f"from {PKG} import errors\n"))
    got = _upward_or_sideways({probe: scan})
    assert [g.split(": ", 1)[1] for g in got] == [
        "sources and formats -> assembly", "sources and formats -> sources and formats"], got
