"""The fault catalog: what the chaos engine can break, and how to undo it.

A fault runs in three steps so that a crash can never leave it unrecorded:
prepare() reads the current state and resolves targets without changing
anything; the runner journals that state (fsync'd); apply() changes the
system. rollback() takes only the journaled state, so it works in the same
process, after a signal, or in `tracehound chaos recover` after a crash, and
it must be idempotent: a fault journaled but never applied rolls back to a
no-op.
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from typing import Any, Callable

from . import names

FAULT_MODULES = ("io", "io_space", "net", "proc", "rdma", "gpu", "gpu_xid", "gpu_nvml", "gpu_dcgm")


class FaultError(Exception):
    """A fault cannot be planned, applied or rolled back; the message says why."""


@dataclass(frozen=True)
class Arg:
    kind: type | tuple
    help: str
    required: bool = False
    default: Any = None
    choices: tuple = ()
    minimum: float | None = None
    maximum: float | None = None
    # for a string that names something (a namespace, an interface): None if
    # the name fits the grammar of what it names, else why not (names.py)
    grammar: Callable[[str], str | None] | None = None


@dataclass
class Availability:
    ok: bool
    reason: str = ""


@dataclass
class Prepared:
    """What prepare() found: the targets (for blast-radius checks and the
    report) and the state rollback() needs, which must be JSON."""
    targets: list[str]
    state: dict
    notes: list[str] = field(default_factory=list)


@dataclass
class Detection:
    """How tracehound should see a fault: a metric selector on the agent with
    a signal and a predicate, and the same question in PromQL. query None
    means tracehound exports no signal for this fault (note says why)."""
    query: str | None = None
    signal: str = "value"
    predicate: str = "> 0"
    promql: str | None = None
    note: str = ""

    @classmethod
    def counter_grows(cls, query: str, note: str) -> "Detection":
        """The usual question: did this counter grow after the fault went in?"""
        return cls(query=query, signal="increase", predicate="> 0",
                   promql=grown(query, counter=True), note=note)


def grown(query: str, counter: bool, window: str = "1m") -> str:
    """PromQL for "how much did this grow over `window`", a series born within
    it included: a counter first scraped at 1 (a job's first kill, a fresh
    cgroup's RSS) has no increase() and no delta(), only a value it did not
    have before. Always answers (0 for nothing), so a predicate can compare."""
    born = f"(sum({query} unless {query} offset {window}) or vector(0))"
    if counter:
        return f"(sum(increase({query}[{window}])) or vector(0)) + {born}"
    return f"(sum({query}) - sum({query} offset {window})) or {born}"


def target_args(default_max: int = 1) -> dict[str, Arg]:
    """Arguments shared by faults aimed at processes."""
    return {
        "pid": Arg(int, "target process id", minimum=2),
        "name": Arg(str, "regular expression matched against the process name (comm) "
                         "or its full command line"),
        "cgroup": Arg(str, "every process in this cgroup v2 path (e.g. /thtest/job1)",
                      grammar=names.cgroup_path),
        "job_id": Arg(str, "every process of this Slurm job on this node (found by its "
                           "cgroups in any hierarchy, v1 or v2), except slurmstepd and the "
                           "chaos run's own step", grammar=names.slurm_job_id),
        "max_targets": Arg(int, "blast radius: refuse when more processes match",
                           default=default_max, minimum=1),
    }


def interface_args(interface_help: str) -> dict[str, Arg]:
    """Arguments shared by faults aimed at a network interface."""
    return {
        "interface": Arg(str, interface_help, required=True, grammar=names.interface_name),
        "netns": Arg(str, "named network namespace (ip netns) holding the interface",
                     grammar=names.netns_name),
        "allow_host_netns": Arg(bool, "allow an interface of the host's own namespace "
                                      "(it may cut this machine off)", default=False),
    }


def refuse_host_netns(args: dict, doing: str) -> None:
    """An interface of the host's own namespace only when asked for by name."""
    if not args.get("netns") and not args.get("allow_host_netns"):
        raise FaultError(f"refusing to {doing} in the host's own network namespace: "
                         "give netns, or set allow_host_netns: true")


class Fault:
    name = ""
    summary = ""
    destructive = True
    where = "host"          # where it can be exercised: host, vm (RDMA), gpu
    args: dict[str, Arg] = {}

    def check(self, args: dict) -> list[str]:
        """Problems across arguments (types are checked generically)."""
        return []

    def launches(self, args: dict) -> str | None:
        """The command line of a program of the experiment's choosing this
        fault runs (it then needs the user's consent), or None."""
        return None

    def availability(self) -> Availability:
        return Availability(True)

    def prepare(self, args: dict, fault_id: str) -> Prepared:
        raise NotImplementedError

    def apply(self, state: dict) -> dict | None:
        """Change the system; may return facts learned while applying (a
        child's pid), journaled and merged into the state for rollback."""
        raise NotImplementedError

    def rollback(self, state: dict) -> str | None:
        """Undo; returns a note for the report (e.g. 'irreversible')."""
        raise NotImplementedError

    def observe(self, state: dict) -> dict:
        """Counters the fault itself keeps (packets dropped...), for the report."""
        return {}

    def detection(self, args: dict, state: dict | None = None) -> Detection:
        return Detection(note=f"tracehound exports no signal for {self.name}")

    def with_defaults(self, args: dict) -> dict:
        out = {k: a.default for k, a in self.args.items() if a.default is not None}
        out.update(args)
        return out


_catalog: dict[str, Fault] | None = None


def catalog() -> dict[str, Fault]:
    global _catalog
    if _catalog is None:
        found: dict[str, Fault] = {}
        for mod in FAULT_MODULES:
            module = importlib.import_module(f"{__name__}.{mod}")
            for fault in module.FAULTS:
                found[fault.name] = fault
        _catalog = found
    return _catalog


def get(name: str) -> Fault:
    try:
        return catalog()[name]
    except KeyError:
        raise FaultError(f"unknown fault '{name}'") from None


def check_args(fault: Fault, args) -> list[tuple[str, str]]:
    """(argument, problem) for every argument that is missing, unknown or of
    the wrong type or range, then the fault's own cross-argument checks."""
    if args is None:
        args = {}
    if not isinstance(args, dict):
        return [("", f"arguments must be a mapping, not {_type_name(args)}")]
    problems = []
    for key, value in args.items():
        spec = fault.args.get(key)
        if spec is None:
            known = ", ".join(sorted(fault.args)) or "none"
            problems.append((key, f"{fault.name} takes no argument '{key}' (known: {known})"))
            continue
        why = _check_value(spec, value)
        if why:
            problems.append((key, why))
    for key, spec in fault.args.items():
        if spec.required and key not in args:
            problems.append((key, f"{fault.name} needs argument '{key}': {spec.help}"))
    try:
        problems.extend(("", p) for p in fault.check(fault.with_defaults(args)))
    except (TypeError, AttributeError, KeyError, ValueError):
        pass        # an argument of the wrong type or missing, reported above
    return problems


def _check_value(spec: Arg, value) -> str | None:
    kinds = spec.kind if isinstance(spec.kind, tuple) else (spec.kind,)
    ok = any(_is(value, k) for k in kinds)
    if not ok:
        want = " or ".join(_kind_name(k) for k in kinds)
        return f"must be {want}, not {_type_name(value)} ({value!r})"
    if spec.choices and value not in spec.choices:
        return f"must be one of {', '.join(map(str, spec.choices))}, not {value!r}"
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        if spec.minimum is not None and value < spec.minimum:
            return f"must be at least {spec.minimum}, not {value}"
        if spec.maximum is not None and value > spec.maximum:
            return f"must be at most {spec.maximum}, not {value}"
    if isinstance(value, list) and any(not isinstance(x, (str, int, float)) for x in value):
        return "must be a list of strings or numbers"
    if spec.grammar is not None and isinstance(value, str):
        return spec.grammar(value)
    return None


def _is(value, kind) -> bool:
    if kind is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if kind is int:
        return isinstance(value, int) and not isinstance(value, bool)
    return isinstance(value, kind)


def _kind_name(kind) -> str:
    return {int: "an integer", float: "a number", str: "a string", bool: "true or false",
            list: "a list", dict: "a mapping"}.get(kind, kind.__name__)


def _type_name(value) -> str:
    if value is None:
        return "null"
    return {bool: "a boolean", int: "an integer", float: "a number", str: "a string",
            list: "a list", dict: "a mapping"}.get(type(value), type(value).__name__)
