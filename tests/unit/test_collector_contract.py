"""The collector contract (docs/architecture.md, "Collector"): `collect()`
only reads; housekeeping (`retire_*`, prune) runs on the agent's schedule.

Static, with `ast`: for every class of src/tracehound/collectors/ with a
`collect`, the code reachable from it (`self.m(...)`, module functions, those
imported from a sibling collector module, transitively) may not use a name
that says it changes state, called or bound (`r = self.probe.retire` counts).
Calls on other objects are not followed: a probe's read methods are trusted;
the dynamic test checks the I/O collector asks its probe for reads only.
"""
import array
import ast
from pathlib import Path

from tracehound.attribution.workload import WORKLOAD_LABELS
from tracehound.collectors import io as col
from tracehound.probes.io_maps import HEALTH, N_FIELDS, IoKey

ROOT = Path(__file__).resolve().parents[2] / "src" / "tracehound" / "collectors"

# First words of names that change state: the mutators src/tracehound has
# (retire*, forget*, delete, remove*, clear, reset, prune, update: the BPF map
# write, close, stop, set_*), the contract's (zero, drop, write, evict) and
# what empties a container kept between scrapes (pop, popitem, discard, purge,
# expire, trim). Split on "_": `drops()` (a read) and `retired_pages` are not.
VERBS = {"retire", "forget", "delete", "remove", "clear", "reset", "zero", "drop", "update",
         "pop", "popitem", "discard", "evict", "prune", "purge", "expire", "trim", "write",
         "close", "stop", "set"}

# (module, function, call) -> why this one is allowed: a local container the
# scrape built itself. None are needed today; keep each narrow and explained.
ALLOWED: dict[tuple[str, str, str], str] = {}


def _mutator(name: str) -> bool:
    words = name.lstrip("_").split("_")
    # bare `set(...)` builds a set; set_x(...) is a setter
    return words[0] in VERBS and (words[0] != "set" or len(words) > 1)


class _Module:
    """One module's functions, classes' methods and sibling imports."""

    def __init__(self, name: str, source: str):
        self.name = name
        tree = ast.parse(source, name)
        defs = (ast.FunctionDef, ast.AsyncFunctionDef)
        self.funcs = {n.name: n for n in tree.body if isinstance(n, defs)}
        self.classes = {n.name: {m.name: m for m in n.body if isinstance(m, defs)}
                        for n in tree.body if isinstance(n, ast.ClassDef)}
        self.imported = {a.asname or a.name: (n.module, a.name) for n in tree.body
                         if isinstance(n, ast.ImportFrom) and n.level == 1 and n.module
                         for a in n.names}


def check(sources: dict[str, str]) -> tuple[list[str], list[str]]:
    """(collector classes seen, contract breaches) over {module: source}."""
    mods = {name: _Module(name, text) for name, text in sources.items()}
    seen, broken = [], []
    for mod in mods.values():
        for cls, methods in sorted(mod.classes.items()):
            if "collect" not in methods:
                continue
            seen.append(f"{mod.name}.{cls}")
            # (module, class or None, function) -> how collect reached it
            todo = [(mod.name, cls, "collect", f"{cls}.collect")]
            done = set()
            while todo:
                m, c, f, path = todo.pop()
                if (m, c, f) in done:
                    continue
                done.add((m, c, f))
                here = mods[m]
                node = here.classes[c][f] if c else here.funcs[f]
                qual = f"{c}.{f}" if c else f
                for sub in ast.walk(node):  # nested defs and lambdas are part of it
                    name = None
                    if isinstance(sub, ast.Attribute) and isinstance(sub.ctx, ast.Load):
                        name = sub.attr
                        if c and isinstance(sub.value, ast.Name) and sub.value.id == "self" \
                                and name in here.classes[c]:
                            todo.append((m, c, name, f"{path} -> {name}"))
                    elif isinstance(sub, ast.Call) and isinstance(sub.func, ast.Name):
                        name = sub.func.id
                        if name in here.funcs:
                            todo.append((m, None, name, f"{path} -> {name}"))
                        elif name in here.classes and "__init__" in here.classes[name]:
                            todo.append((m, name, "__init__", f"{path} -> {name}()"))
                        elif name in here.imported:
                            src, real = here.imported[name]
                            if src in mods and real in mods[src].funcs:
                                todo.append((src, None, real, f"{path} -> {src}.{real}"))
                    if name is None or not _mutator(name):
                        continue
                    text = ast.unparse(sub.func if isinstance(sub, ast.Call) else sub)
                    if (m, qual, text) not in ALLOWED:
                        broken.append(f"collectors/{mod.name}.py {cls}.collect: "
                                      f"{m}.py:{sub.lineno} in {qual} ({path}) "
                                      f"uses {text}, which changes state")
    return seen, sorted(set(broken))


def _sources() -> dict[str, str]:
    return {p.stem: p.read_text() for p in sorted(ROOT.glob("*.py"))}


def test_collect_changes_no_state():
    seen, broken = check(_sources())
    # every *Collector class is checked: a collect renamed away would pass unseen
    named = {f"{name}.{c}" for name, text in _sources().items()
             for c in _Module(name, text).classes if c.endswith("Collector")}
    assert named and named <= set(seen), f"collector classes without collect: {named - set(seen)}"
    assert not broken, "collect() must only read (docs/architecture.md, Collector):\n" + \
        "\n".join(broken)


# --- the checker itself --------------------------------------------------------

PLANTED = '''
from .helpers import tidy_up

class LeakyCollector:
    def collect(self):
        yield from self._families()

    def _families(self):
        keys = list(self.probe.keys())
        self._tidy(keys)
        tidy_up(self.detector)
        return []

    def _tidy(self, keys):
        self.probe.retire(keys)
'''

HELPERS = '''
def tidy_up(detector):
    forget = detector.forget
    forget(set())
'''

CLEAN = '''
class FineCollector:
    def collect(self):
        drops = self.probe.drops()
        per = {}
        per.setdefault("x", set()).add(1)     # building its own: not a mutator name
        yield from self._rows(drops)

    def _rows(self, drops):
        return [(k, v) for k, v in drops.items()]

    def retire_removed(self):      # housekeeping: not reached from collect
        self.probe.retire(self.probe.keys())
'''


def test_the_checker_catches_a_retirement_through_helpers():
    seen, broken = check({"leaky": PLANTED, "helpers": HELPERS})
    assert seen == ["leaky.LeakyCollector"]
    assert "collectors/leaky.py LeakyCollector.collect: leaky.py:15 in LeakyCollector._tidy " \
           "(LeakyCollector.collect -> _families -> _tidy) uses self.probe.retire, " \
           "which changes state" in broken
    # through a sibling module and a bound-method alias, both the alias and its call
    assert [b.split(": ", 1)[1].split(" (")[0] for b in broken if "helpers" in b] == \
        ["helpers.py:3 in tidy_up", "helpers.py:4 in tidy_up"], broken
    assert len(broken) == 3, broken


def test_the_checker_passes_a_clean_collector():
    assert check({"fine": CLEAN}) == (["fine.FineCollector"], [])


# --- dynamic: the I/O collector over recording stand-ins -------------------------

class Recorder:
    """Records every attribute asked for (a method is asked for before it is
    called, a bound alias too); one it has no answer for raises."""

    def __init__(self, **answers):
        self.answers = answers
        self.called: list[str] = []

    def __getattr__(self, name):
        self.called.append(name)
        if name not in self.answers:
            raise AssertionError(f"collect() asked for {name}")
        return self.answers[name]


def test_io_collect_calls_only_read_methods():
    values = array.array("Q", range(1, N_FIELDS + 1))
    probe = Recorder(stats=lambda: iter([(IoKey(7, 40, 0), values)]),
                     drops=lambda: dict.fromkeys(HEALTH, 0), timed_calls=lambda: {})
    labels = ("/job/7", *("",) * len(WORKLOAD_LABELS))
    owners = Recorder(new_scrape=lambda: None, alive=lambda cgid: True,
                      labels=lambda cgid: labels, in_scope=lambda path: True)
    mounts = type("Mounts", (), {"by_id": {}, "by_dev": {}})()
    c = col.IoCollector(probe, mounts, owners)
    for _ in range(2):      # the second scrape follows the first's book-keeping
        fams = {f.name: f for f in c.collect()}
    assert fams["tracehound_io_read_bytes"].samples[0].value == 1   # it was read
    # new_scrape only allows a rescan of the cgroup tree for ids first met
    assert set(probe.called) == {"stats", "drops", "timed_calls"}, probe.called
    assert set(owners.called) <= {"new_scrape", "alive", "labels", "in_scope"}, owners.called
