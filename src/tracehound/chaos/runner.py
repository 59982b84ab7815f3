"""Running a validated experiment: steady state, method, rollbacks, report.

Order follows Chaos Toolkit: hypothesis before (a failure skips the
method), the method, hypothesis after. Then every fault still applied is
rolled back (newest first), the declared rollbacks run, and the hypothesis
is checked once more to show the system came back. SIGINT and SIGTERM jump
straight to the rollbacks; signals arriving during rollbacks are held off
until they finish.
"""
from __future__ import annotations

import concurrent.futures
import copy
import datetime
import signal
import time

from ..terminal_progress import steps
from . import faults as catalog
from . import providers
from .detection import baseline_and_before, run_detection, run_query, with_defaults
from .faults import FaultError
from .journal import Journal, new_run_id
from .metrics import QueryError
from .schema import Experiment
from .tolerance import within


class Interrupted(BaseException):
    """A signal asked the run to stop (BaseException: no handler swallows it)."""


class MethodAborted(Exception):
    pass


def _iso(ts: float) -> str:
    return datetime.datetime.fromtimestamp(ts, datetime.timezone.utc).isoformat()


class Runner:
    def __init__(self, exp: Experiment, source: str, journal_dir: str, out, err):
        self.exp = exp
        self.source = source
        self.journal_dir = journal_dir
        self.out, self.err = out, err
        # the id validation gave ${run} from, so the run's names carry it
        self.run_id = exp.run_id or new_run_id()
        self.journal: Journal | None = None
        self.faults: list[dict] = []          # applied (or half-applied) faults
        self.detections: list[dict] = []
        self.timeline: list[dict] = []
        self.baselines: dict[int, object] = {}
        self.befores: dict[int, float | None] = {}     # each probe's signal before its fault
        self.detect_specs: dict[int, dict] = {}
        self.rollback_failures = 0
        self._rolling_back = False
        self._pending_signal: str | None = None
        self._pool = concurrent.futures.ThreadPoolExecutor(max_workers=4)
        self._detect_for = self._link_detections()

    def _link_detections(self) -> dict[str, list[int]]:
        """fault action name -> method indexes of the detection probes that
        measure it (a probe without `fault` measures the latest one before it)."""
        links: dict[str, list[int]] = {}
        last = None
        for i, act in enumerate(self.exp.method):
            p = act.get("provider", {})
            if p.get("type") != "tracehound":
                continue
            if "fault" in p:
                last = act["name"]
            elif "detect" in p:
                target = p["detect"].get("fault") or last
                links.setdefault(target, []).append(i)
        return links

    def now(self) -> float:
        return round(time.monotonic() - self.t0, 3)

    def event(self, kind: str, name: str, **extra) -> None:
        self.timeline.append({"t": self.now(), "kind": kind, "name": name, **extra})

    # -- signals -----------------------------------------------------------
    def _on_signal(self, signum, _frame):
        name = signal.Signals(signum).name
        if self._rolling_back:
            self._pending_signal = name
            self.err(f"tracehound: {name} received: finishing the rollbacks first")
            return
        raise Interrupted(name)

    # -- the run -----------------------------------------------------------
    def run(self) -> dict:
        self.t0 = time.monotonic()
        self.wall0 = time.time()
        record = {"title": self.exp.title, "description": self.exp.description,
                  "source": self.source, "run_id": self.run_id, "start": _iso(self.wall0),
                  "steady_states": {}, "runs": [], "rollbacks": []}
        self.journal = Journal(self.journal_dir, self.run_id, self.exp.title, self.source)
        if self.exp.rollbacks:
            self.journal.declare_rollbacks(self.exp.rollbacks)
        old = {s: signal.signal(s, self._on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
        status = "completed"
        hyp_probes = len((self.exp.hypothesis or {}).get("probes") or [])
        # an upper bound: steady state is checked up to three times
        progress = steps(len(self.exp.method) + len(self.exp.rollbacks) + 3 * hyp_probes,
                         f"chaos: {self.exp.title}")
        self._progress = progress.__enter__()
        try:
            before = self.hypothesis("before")
            record["steady_states"]["before"] = before
            if before is not None and not before["met"]:
                status = "failed"
            else:
                self.method(record["runs"])
                after = self.hypothesis("after")
                record["steady_states"]["after"] = after
                if after is not None and not after["met"]:
                    status = "deviated"
        except Interrupted as exc:
            status = "interrupted"
            record["interrupted_by"] = str(exc)
            self.err(f"tracehound: {exc} received: rolling back")
        except MethodAborted as exc:
            status = "aborted"
            record["aborted_because"] = str(exc)
            self.err(f"tracehound: method aborted: {exc}")
        finally:
            self._rolling_back = True
            try:
                self.rollback_all()
                for act in self.exp.rollbacks:
                    record["rollbacks"].append(self.execute(act, "rollbacks"))
                if self.exp.rollbacks:
                    self.journal.rollbacks_run("run", [
                        i for i, r in enumerate(record["rollbacks"]) if r["status"] == "failed"])
                self._pool.shutdown(wait=True)
                if status in ("completed", "deviated", "failed"):
                    record["steady_states"]["after_rollback"] = self.hypothesis("after-rollback")
            finally:
                progress.__exit__(None, None, None)
                for s, h in old.items():
                    signal.signal(s, h)
                end = time.time()
                if self.rollback_failures:
                    status += " (rollback failed)"
                self.journal.close(status)
        record.update(status=status, end=_iso(end), duration=round(end - self.wall0, 3),
                      faults=self.faults, detections=self.detections, timeline=self.timeline,
                      rollback_failures=self.rollback_failures, journal=self.journal.path,
                      pending_signal=self._pending_signal)
        return record

    def hypothesis(self, phase: str) -> dict | None:
        hyp = self.exp.hypothesis
        if not hyp:
            return None
        result = {"title": hyp["title"], "phase": phase, "met": True, "probes": []}
        for act in hyp["probes"]:
            run = self.execute(act, f"hypothesis-{phase}")
            met = run["status"] == "succeeded" and within(act["tolerance"], run["output"],
                                                          self._tolerance_probe)
            run["tolerance_met"] = met
            result["probes"].append(run)
            if not met:
                result["met"] = False
                break
        self.event("hypothesis", phase, met=result["met"])
        return result

    def method(self, runs: list) -> None:
        background = []
        for index, act in enumerate(self.exp.method):
            if act.get("background"):
                background.append(self._pool.submit(self.execute, act, "method", index))
                continue
            run = self.execute(act, "method", index)
            runs.append(run)
            p = act["provider"]
            if run["status"] == "failed" and p["type"] == "tracehound" and "fault" in p:
                raise MethodAborted(f"fault action '{act['name']}' failed: {run['error']}")
        for future in background:
            runs.append(future.result())

    # -- activities --------------------------------------------------------
    def execute(self, act: dict, phase: str, index: int | None = None) -> dict:
        pauses = act.get("pauses") or {}
        if pauses.get("before"):
            time.sleep(pauses["before"])
        run = {"name": act["name"], "type": act["type"], "provider": act["provider"]["type"],
               "phase": phase, "start": self.now()}
        try:
            run["output"] = self.dispatch(act, index)
            run["status"] = "succeeded"
        except (providers.ActivityFailed, FaultError, QueryError, OSError, ValueError) as exc:
            run["status"], run["output"], run["error"] = "failed", None, str(exc)
            self.err(f"tracehound: {act['type']} '{act['name']}' failed: {exc}")
        except Exception as exc:   # a bug must not skip the rollbacks or the report
            run["status"], run["output"] = "failed", None
            run["error"] = f"{type(exc).__name__}: {exc}"
            self.err(f"tracehound: {act['type']} '{act['name']}' failed: {run['error']}")
        run["end"] = self.now()
        run["duration"] = round(run["end"] - run["start"], 3)
        self.event("activity", act["name"], start=run["start"], end=run["end"],
                   status=run["status"], phase=phase)
        if getattr(self, "_progress", None) is not None:
            self._progress.advance(f"{phase}: {act['name']} {run['status']}")
        if pauses.get("after"):
            time.sleep(pauses["after"])
        return run

    def dispatch(self, act: dict, index: int | None):
        p = act["provider"]
        kind = p["type"]
        if kind in providers.GENERIC:
            return providers.GENERIC[kind](p)
        if "fault" in p:
            return self.apply_fault(act)
        if "rollback" in p:
            return self.rollback_fault(p["rollback"])
        if "detect" in p:
            return self.detect(act, index)
        return run_query(p)

    def _tolerance_probe(self, tol: dict, value) -> bool:
        act = copy.deepcopy(tol)
        args = act["provider"].setdefault("arguments", {})
        if isinstance(args, dict):
            args["value"] = value
        act.setdefault("name", "tolerance")
        result = self.dispatch(act, None)
        if isinstance(result, dict) and "status" in result:
            return result["status"] == 0 or 200 <= result["status"] < 400
        return bool(result)

    # -- faults --------------------------------------------------------------
    def apply_fault(self, act: dict) -> dict:
        p = act["provider"]
        fault = catalog.get(p["fault"])
        args = fault.with_defaults(p.get("arguments") or {})
        fid = f"{self.run_id}-{len(self.faults) + 1}"
        prepared = fault.prepare(args, fid)
        for note in prepared.notes:
            self.out(f"tracehound: note: {fault.name}: {note}")
        for i in self._detect_for.get(act["name"], []):
            spec = with_defaults(self.exp.method[i]["provider"]["detect"],
                                 fault.detection(args, prepared.state))
            self.detect_specs[i] = spec
            self.baselines[i], self.befores[i] = baseline_and_before(spec)
        entry = {"id": fid, "action": act["name"], "fault": fault.name, "arguments": args,
                 "targets": prepared.targets, "notes": prepared.notes,
                 "state": prepared.state, "applied_at": None, "monotonic": None,
                 "rolled_back_at": None, "rollback": "pending", "observed": {}}
        # Listed for rollback before anything can happen (a signal may land
        # anywhere below; rollbacks are no-ops on what was never applied),
        # then journaled (fsync'd), so that a crash leaves a record to undo.
        self.faults.append(entry)
        self.journal.fault(fid, act["name"], fault.name, args, prepared.state, prepared.targets)
        entry["monotonic"] = time.monotonic()
        entry["applied_at"] = self.now()
        extra = fault.apply(prepared.state)
        if extra:
            prepared.state.update(extra)
        self.journal.applied(fid, extra)
        self.event("fault-applied", act["name"], fault=fault.name)
        self.out(f"tracehound: applied {fault.name} ({act['name']}) on "
                 f"{', '.join(prepared.targets)}")
        return {"fault": fault.name, "id": fid, "targets": prepared.targets,
                "notes": prepared.notes}

    def _find_fault(self, action: str) -> dict | None:
        for entry in reversed(self.faults):
            if entry["action"] == action:
                return entry
        return None

    def rollback_fault(self, action: str) -> dict:
        entry = self._find_fault(action)
        if entry is None:
            return {"rolled_back": None, "note": f"'{action}' was never applied"}
        self._undo(entry)
        if entry["rollback"] == "failed":
            raise FaultError(f"rollback of {entry['fault']} failed: {entry['rollback_error']}")
        return {"rolled_back": entry["fault"], "note": entry.get("rollback_note")}

    def _undo(self, entry: dict) -> None:
        if entry["rollback"] != "pending":
            return
        fault = catalog.get(entry["fault"])
        try:
            entry["observed"] = fault.observe(entry["state"])
        except Exception as exc:   # counters are a bonus; the rollback is what matters
            entry["observed"] = {"error": str(exc)}
        try:
            note = fault.rollback(entry["state"])
        except Exception as exc:   # report every failure loudly, then go on
            entry.update(rollback="failed", rollback_error=str(exc),
                         rolled_back_at=self.now())
            self.journal.rollback_failed(entry["id"], str(exc))
            self.rollback_failures += 1
            self.err(f"tracehound: ROLLBACK FAILED: {entry['fault']} ({entry['action']}) on "
                     f"{', '.join(entry['targets'])}: {exc}")
            return
        entry.update(rollback="done", rollback_note=note, rolled_back_at=self.now())
        self.journal.rolled_back(entry["id"], note)
        self.event("fault-rolled-back", entry["action"], fault=entry["fault"])
        self.out(f"tracehound: rolled back {entry['fault']} ({entry['action']})"
                 + (f": {note}" if note else ""))

    def rollback_all(self) -> None:
        for entry in reversed(self.faults):
            self._undo(entry)

    # -- detection -----------------------------------------------------------
    def detect(self, act: dict, index: int | None) -> dict:
        spec = act["provider"]["detect"]
        target = spec.get("fault")
        entry = self._find_fault(target) if target else (self.faults[-1] if self.faults
                                                          else None)
        if index is not None and index in self.detect_specs:
            spec = self.detect_specs[index]
        elif entry is not None:
            fault = catalog.get(entry["fault"])
            spec = with_defaults(spec, fault.detection(entry["arguments"], entry["state"]))
        result = run_detection(spec, entry["monotonic"] if entry else None,
                               self.baselines.get(index),
                               entry["fault"] if entry else None)
        result["probe"] = act["name"]
        result["action"] = entry["action"] if entry else None
        result["before"] = self.befores.get(index)
        if result["mttd_seconds"] is not None:
            self.event("detected", act["name"], mttd=result["mttd_seconds"],
                       at=round(entry["applied_at"] + result["mttd_seconds"], 3))
        self.detections.append(result)
        seen = "yes" if result["detected"] else "no"
        mttd = f", MTTD {result['mttd_seconds']:.2f} s" if result["detected"] else ""
        self.out(f"tracehound: detection '{act['name']}' of {result['fault']}: detected "
                 f"{seen}{mttd}" + (f" ({result['note']})" if result["note"] else ""))
        return result
