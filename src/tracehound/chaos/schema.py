"""Validating an experiment: every problem found, each with its field path,
its line and why, before anything runs."""
from __future__ import annotations

import difflib
from dataclasses import dataclass, field

from . import config as cfg
from . import faults as catalog
from . import consent, tolerance
from .detection import DETECT_KEYS, QUERY_KEYS, check_spec
from .document import Document, child_path
from .journal import new_run_id
from .provider_checks import PROVIDER_KEYS, ProviderChecks

TOP_KEYS = ("version", "title", "description", "tags", "contributions", "extensions",
            "configuration", "steady-state-hypothesis", "method", "rollbacks")
UNSUPPORTED = {"secrets": "secrets are not supported: use configuration with type env",
               "controls": "controls are not supported by tracehound chaos",
               "runtime": "runtime strategies are not supported: the hypothesis is checked "
                          "before and after the method"}
ACTIVITY_KEYS = ("type", "name", "provider", "tolerance", "pauses", "background",
                 "description", "ref")
MAX_PAUSE = 3600


@dataclass
class Problem:
    path: str
    message: str
    line: int | None = None

    def format(self, filename: str) -> str:
        where = f"{filename}:{self.line}" if self.line else filename
        return f"{where}: {self.path or '(top)'}: {self.message}"


@dataclass
class Experiment:
    title: str
    description: str
    hypothesis: dict | None
    method: list
    rollbacks: list
    faults: list = field(default_factory=list)     # (action name, fault name)
    code: list = field(default_factory=list)       # consent.CodeActivity: runs code
    notes: list = field(default_factory=list)
    # Probed once while validating: some checks shell out or load modules.
    availability: dict[str, catalog.Availability] = field(default_factory=dict)
    run_id: str = ""          # the run's id, whose ${run} the names were given

    @property
    def destructive(self) -> bool:
        return any(catalog.get(f).destructive for _, f in self.faults)


def _suggest(word: str, choices) -> str:
    close = difflib.get_close_matches(word, list(choices), n=1)
    return f" (did you mean '{close[0]}'?)" if close else ""


class Checker(ProviderChecks):
    def __init__(self, doc: Document, allow_code: bool = False, run_id: str | None = None):
        self.doc = doc
        self.allow_code = allow_code
        self.code: list[consent.CodeActivity] = []
        self.notes: list[str] = []
        self.problems: list[Problem] = []
        self.run_id = run_id or new_run_id()
        self.given = cfg.builtins(self.run_id)
        self.config: dict = dict(self.given)
        self.fault_actions: list[str] = []
        self.named: dict[str, dict] = {}
        self.refs: list[tuple[str, str]] = []
        self.faults: list[tuple[str, str]] = []

    def add(self, path: str, message: str) -> None:
        self.problems.append(Problem(path, message, self.doc.line(path)))

    def _keys(self, value: dict, path: str, known, what: str) -> None:
        for key in value:
            if key not in known:
                self.add(child_path(path, key), f"unknown field '{key}' in {what}"
                         + _suggest(key, known))

    def run(self) -> Experiment | None:
        data = self.doc.data
        if not isinstance(data, dict):
            self.add("", "an experiment is a mapping with title, description and method")
            return None
        for key in data:
            if key in UNSUPPORTED:
                self.add(key, UNSUPPORTED[key])
            elif key not in TOP_KEYS:
                self.add(key, f"unknown field '{key}'" + _suggest(key, TOP_KEYS))
        for key in ("title", "description"):
            if key not in data:
                self.add(key, f"'{key}' is missing: every experiment needs one")
            elif not isinstance(data[key], str) or not data[key].strip():
                self.add(key, f"'{key}' must be a non-empty string")
        for sub, msg in cfg.check(data.get("configuration")):
            self.add(child_path("configuration", sub) if sub else "configuration", msg)
        if isinstance(data.get("configuration"), dict):
            self.config = cfg.resolve(data["configuration"], self.given)
        for part in ("steady-state-hypothesis", "method", "rollbacks"):
            for path, name in cfg.references(data.get(part), part):
                if name not in self.config:
                    self.add(path, f"${{{name}}} names no configuration entry"
                             + _suggest(name, self.config))
        hypothesis = self._hypothesis(data.get("steady-state-hypothesis"))
        method = self._activities(data.get("method"), "method", required=True)
        rollbacks = self._activities(data.get("rollbacks"), "rollbacks", required=False)
        for path, ref in self.refs:
            if ref not in self.named:
                self.add(path, f"ref '{ref}' names no activity" + _suggest(ref, self.named))
        if self.problems:
            return None
        resolve = lambda acts: [self.named[a["ref"]] if "ref" in a else a  # noqa: E731
                                for a in acts]
        if hypothesis:
            hypothesis["probes"] = resolve(hypothesis["probes"])
        exp = Experiment(data["title"], data["description"], hypothesis,
                         resolve(method), resolve(rollbacks), self.faults, self.code,
                         list(self.notes), run_id=self.run_id)
        for _, name in self.faults:
            if name not in exp.availability:
                exp.availability[name] = catalog.get(name).availability()
            avail = exp.availability[name]
            if not avail.ok:
                exp.notes.append(f"{name} is not available on this host: {avail.reason}")
        return exp

    def _hypothesis(self, hyp) -> dict | None:
        path = "steady-state-hypothesis"
        if hyp is None:
            return None
        if not isinstance(hyp, dict):
            self.add(path, "the steady-state hypothesis must be a mapping with title and probes")
            return None
        self._keys(hyp, path, ("title", "probes"), "the steady-state hypothesis")
        if not isinstance(hyp.get("title"), str) or not hyp.get("title", "").strip():
            self.add(child_path(path, "title"), "the hypothesis needs a non-empty title")
        probes = self._activities(hyp.get("probes", []), child_path(path, "probes"),
                                  required=False, hypothesis=True)
        return {"title": hyp.get("title"), "probes": probes}

    def _activities(self, acts, path: str, required: bool, hypothesis: bool = False) -> list:
        if acts is None and not required:
            return []
        if acts is None:
            self.add(path, f"'{path}' is missing: the list of actions and probes to run")
            return []
        if not isinstance(acts, list):
            self.add(path, f"{path} must be a list of activities")
            return []
        if required and not acts:
            self.add(path, f"{path} needs at least one activity")
        out = []
        for i, act in enumerate(acts):
            checked = self._activity(cfg.substitute(act, self.config), child_path(path, i),
                                     path, hypothesis)
            if checked is not None:
                out.append(checked)
        return out

    def _activity(self, act, path: str, section: str, hypothesis: bool) -> dict | None:
        if not isinstance(act, dict):
            self.add(path, "an activity must be a mapping (type, name, provider)")
            return None
        if "ref" in act:
            if set(act) != {"ref"} or not isinstance(act["ref"], str) or not act["ref"]:
                self.add(path, "a reference is only {ref: NAME}, NAME a non-empty string")
                return None
            self.refs.append((child_path(path, "ref"), act["ref"]))
            return act
        self._keys(act, path, ACTIVITY_KEYS, "an activity")
        kind = act.get("type")
        want = "probe" if hypothesis else None
        if section == "rollbacks":
            want = "action"
        if kind not in ("probe", "action"):
            self.add(child_path(path, "type"), f"activity type must be probe or action, not "
                     f"{kind!r}")
        elif want and kind != want:
            self.add(child_path(path, "type"), f"activities in {section} must be {want}s")
        name = act.get("name")
        if not isinstance(name, str) or not name.strip():
            self.add(child_path(path, "name"), "an activity needs a non-empty string name")
        elif name not in self.named:
            self.named[name] = act
        if hypothesis and "tolerance" not in act:
            self.add(path, "a steady-state probe needs a tolerance")
        if "tolerance" in act:
            for sub, msg in tolerance.check(act["tolerance"]):
                self.add(child_path(child_path(path, "tolerance"), sub) if sub else
                         child_path(path, "tolerance"), msg)
            self._tolerance_probe(act["tolerance"], child_path(path, "tolerance"), act)
        self._pauses(act.get("pauses"), child_path(path, "pauses"))
        if "background" in act and not isinstance(act["background"], bool):
            self.add(child_path(path, "background"), "background must be true or false")
        provider = act.get("provider")
        ppath = child_path(path, "provider")
        if not isinstance(provider, dict):
            self.add(ppath, "an activity needs a provider mapping with a type")
            return act
        ptype = provider.get("type")
        if ptype not in PROVIDER_KEYS:
            self.add(child_path(ppath, "type"), f"unknown provider type {ptype!r} (python, "
                     "process, http or tracehound)" + _suggest(str(ptype), PROVIDER_KEYS))
            return act
        self._keys(provider, ppath, PROVIDER_KEYS[ptype], f"a {ptype} provider")
        getattr(self, f"_{ptype}")(provider, ppath, act, section, hypothesis)
        if ptype in consent.CODE_PROVIDERS:
            self.code.append(consent.CodeActivity(ppath, str(name), ptype,
                                                  consent.describe(provider)))
        return act

    def _pauses(self, pauses, path: str) -> None:
        if pauses is None:
            return
        if not isinstance(pauses, dict):
            self.add(path, "pauses must be a mapping with before and/or after (seconds)")
            return
        self._keys(pauses, path, ("before", "after"), "pauses")
        for key in ("before", "after"):
            v = pauses.get(key)
            if v is not None and (not tolerance.is_number(v) or not 0 <= v <= MAX_PAUSE):
                self.add(child_path(path, key), f"pause must be a number of seconds between "
                         f"0 and {MAX_PAUSE}, not {v!r}")

    def _tracehound(self, p, path, act, section, hypothesis) -> None:
        modes = [k for k in ("fault", "rollback", "detect", "query") if k in p]
        if len(modes) != 1:
            self.add(path, "a tracehound provider needs exactly one of fault (apply a fault), "
                     "rollback (undo one), detect (detection probe) or query (read a metric)"
                     + (f"; got {', '.join(modes)}" if modes else ""))
            return
        mode = modes[0]
        extra = set(p) - {"type", mode} - ({"arguments"} if mode == "fault" else set()) - (
            set(QUERY_KEYS) if mode == "query" else set())
        for key in sorted(extra):
            self.add(child_path(path, key), f"'{key}' does not belong with {mode}")
        kind = act.get("type")
        if mode in ("fault", "rollback") and kind != "action":
            self.add(child_path(path, mode), f"a tracehound {mode} is an action, not a {kind}")
        if mode in ("detect", "query") and kind != "probe":
            self.add(child_path(path, mode), f"a tracehound {mode} is a probe, not a {kind}")
        if mode == "fault":
            self._fault(p, path, act, section, hypothesis)
        elif mode == "rollback":
            if p["rollback"] not in self.fault_actions:
                self.add(child_path(path, "rollback"), f"rollback '{p['rollback']}' names no "
                         "earlier fault action" + _suggest(str(p["rollback"]),
                                                          self.fault_actions))
        elif mode == "detect":
            if hypothesis:
                self.add(child_path(path, "detect"), "a detection probe measures a fault; it "
                         "cannot be part of the steady-state hypothesis")
            self._detect(p["detect"], child_path(path, "detect"))
        else:
            self._detect(p, path, query=True)
        spec = p["detect"] if mode == "detect" else p
        if isinstance(spec, dict) and spec.get("source") == "process":
            # a process source runs its command at every reading
            self.code.append(consent.CodeActivity(path, str(act.get("name")),
                                                  f"{mode} (process source)",
                                                  consent.command_line(spec.get("command"))))

    def _fault(self, p, path, act, section, hypothesis) -> None:
        name = p["fault"]
        if hypothesis or section == "rollbacks":
            self.add(child_path(path, "fault"), "faults are applied in the method only")
        if not isinstance(name, str) or name not in catalog.catalog():
            self.add(child_path(path, "fault"), f"unknown fault {name!r}"
                     + _suggest(str(name), catalog.catalog())
                     + f"; known: {', '.join(sorted(catalog.catalog()))}")
            return
        fault = catalog.get(name)
        apath = child_path(path, "arguments")
        for arg, msg in catalog.check_args(fault, p.get("arguments")):
            self.add(child_path(apath, arg) if arg else apath, msg)
        if act.get("name") in self.fault_actions:
            self.add(child_path(path, "fault"), f"another fault action is already named "
                     f"'{act['name']}': fault actions need unique names")
        if isinstance(act.get("name"), str):
            self.fault_actions.append(act["name"])
            self.faults.append((act["name"], name))
        if act.get("background"):
            self.add(child_path(path, "fault"), "faults cannot run in the background")
        args = p.get("arguments") or {}
        launches = fault.launches(fault.with_defaults(args)) if isinstance(args, dict) else None
        if launches:
            self.code.append(consent.CodeActivity(path, str(act.get("name")), name, launches))

    def _detect(self, spec, path: str, query: bool = False) -> None:
        if not isinstance(spec, dict):
            self.add(path, "detect must be a mapping (fault, source, query, predicate...)")
            return
        if not query:
            self._keys(spec, path, DETECT_KEYS, "a detection probe")
            target = spec.get("fault")
            if target is None and not self.fault_actions:
                self.add(path, "no fault action comes before this detection probe")
            elif target is not None and target not in self.fault_actions:
                self.add(child_path(path, "fault"), f"'{target}' names no earlier fault action"
                         + _suggest(str(target), self.fault_actions))
        for sub, msg in check_spec(spec, query):
            self.add(child_path(path, sub) if sub else path, msg)


def validate(doc: Document, allow_code: bool = False,
             run_id: str | None = None) -> tuple[list[Problem], Experiment | None]:
    """allow_code: the user consented to running code, so python providers'
    modules may be imported to check their functions and arguments. run_id:
    the run's (made here when not given), whose ${run} names take."""
    checker = Checker(doc, allow_code, run_id)
    exp = checker.run()
    problems = sorted(checker.problems, key=lambda p: (p.line or 0, p.path))
    return problems, exp
