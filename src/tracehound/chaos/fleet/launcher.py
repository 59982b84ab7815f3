"""Runs one experiment on the plan's nodes, in waves, through srun.

Each node runs the ordinary local `tracehound chaos run` (its own journal
first, rollback always); the launcher only decides who runs when, writes
the fleet journal before each launch, and stops the fleet when told: an
--abort-when PromQL condition that holds, SIGINT or SIGTERM. Stopping means
no new node starts and every running node's run gets SIGTERM through its own
step, named by the id squeue gave it under the run's own step name (kept in
the fleet journal), so no other step of a job it runs inside is ever
signalled; the run rolls back and ends. A step that cannot be identified is
not signalled but reported; a node that does not end within --stop-timeout
has its own srun killed and is left to `chaos recover --slurm`.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from dataclasses import dataclass, field

from ...clients import prometheus
from . import journal as fleet_journal
from . import slurm
from .plan import Plan

POLL_S = 0.2
# how long a stop looks for a just-launched node's step in squeue
STEP_LOOKUP_S = 5.0
# consecutive failed checks of the abort condition that stop the run: a
# guard that cannot be read is no guard
ABORT_CHECK_FAILURES = 3


@dataclass
class Options:
    max_parallel: int = 1
    wave_pause_s: float = 0.0
    abort_when: str | None = None
    prometheus: str | None = None
    abort_interval_s: float = 5.0
    immediate_s: int = 60
    stop_timeout_s: float = 120.0
    allow_code: bool = False
    node_command: list[str] = field(default_factory=list)


@dataclass
class NodeRun:
    node: str
    proc: subprocess.Popen | None = None
    launched_at: float | None = None
    ended_at: float | None = None
    rc: int | None = None
    stopped: bool = False       # got SIGTERM from the launcher
    killed: bool = False        # did not end in time and was killed
    step_id: str | None = None  # JOB.STEP, once squeue lists it under the run's own name
    unidentified: bool = False  # its step was never found: never signalled


class Launcher:
    def __init__(self, experiment: str, title: str, plan: Plan, options: Options,
                 journal_base: str, report_dir: str, run_id: str, out, err):
        self.experiment, self.title, self.plan, self.opt = experiment, title, plan, options
        self.journal_base, self.report_dir, self.run_id = journal_base, report_dir, run_id
        self.out, self.err = out, err
        self.runs: dict[str, NodeRun] = {n: NodeRun(n) for n in plan.nodes}
        self.stop_reason: str | None = None
        self._abort_failures = 0
        self._next_check = 0.0
        self._next_lookup = 0.0

    # -- paths -------------------------------------------------------------
    def node_dir(self, node: str) -> str:
        return os.path.join(self.report_dir, "nodes", node)

    def node_command(self, node: str) -> list[str]:
        return node_run_argv(self.opt.node_command, self.experiment,
                             fleet_journal.node_journal(self.journal_base, self.run_id, node),
                             os.path.abspath(self.node_dir(node)), self.opt.allow_code)

    # -- the run -------------------------------------------------------------
    def run(self) -> dict:
        self.journal = fleet_journal.FleetJournal(self.journal_base, self.run_id)
        self.journal.start(self.title, self.experiment, self.plan.to_json())
        old = {s: signal.signal(s, self._on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
        start = time.time()
        try:
            self._check_abort(force=True)
            waves = self.plan.waves(self.opt.max_parallel)
            for i, wave in enumerate(waves, 1):
                if self.stop_reason:
                    break
                self.out(f"tracehound: fleet: wave {i}/{len(waves)}: {', '.join(wave)}")
                for node in wave:
                    self._launch(node)
                self._wait(wave)
                if i < len(waves) and not self.stop_reason:
                    self._pause(self.opt.wave_pause_s)
        finally:
            self._stop_running()
            for s, h in old.items():
                signal.signal(s, h)
            status = "completed" if not self.stop_reason else (
                "interrupted" if self.stop_reason.startswith("SIG") else "aborted")
            self.journal.close(status)
        return {"run_id": self.run_id, "title": self.title, "experiment": self.experiment,
                "status": status, "stop_reason": self.stop_reason, "start": start,
                "end": time.time(), "plan": self.plan.to_json(),
                "fleet_journal": self.journal.path,
                "runs": {n: {"launched_at": r.launched_at, "ended_at": r.ended_at,
                             "rc": r.rc, "stopped": r.stopped, "killed": r.killed,
                         "step_id": r.step_id, "unidentified": r.unidentified}
                         for n, r in self.runs.items()}}

    def _on_signal(self, signum, _frame) -> None:
        name = signal.Signals(signum).name
        if not self.stop_reason:
            self.stop_reason = name
            self.err(f"tracehound: fleet: {name} received: no new node starts, running nodes "
                     "roll back")

    def _launch(self, node: str) -> None:
        run = self.runs[node]
        os.makedirs(self.node_dir(node), exist_ok=True)
        argv = slurm.srun_argv(node, self.node_command(node), self.plan.partition,
                               self.plan.job_id, self.opt.immediate_s,
                               slurm.step_name(self.run_id, node))
        # journaled (fsync'd) before srun exists: a launcher killed from here
        # on leaves a record that `chaos recover --slurm` reaches this node by
        self.journal.launch(node, self.plan.job_id)
        with open(os.path.join(self.node_dir(node), "srun.log"), "ab") as log:
            # a session of its own: a Ctrl-C at the terminal reaches the
            # launcher only, which decides what each srun gets
            run.proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT,
                                        stdin=subprocess.DEVNULL, start_new_session=True)
        run.launched_at = time.time()
        self.out(f"tracehound: fleet: launched on {node}"
                 + (f" inside job {self.plan.job_id}" if self.plan.job_id else ""))

    def _reap(self) -> None:
        for node, run in self.runs.items():
            if run.proc is not None and run.rc is None and run.proc.poll() is not None:
                run.rc, run.ended_at = run.proc.returncode, time.time()
                status = node_status(self.node_dir(node), run.rc)
                self.journal.node_end(node, run.rc, status)
                self.out(f"tracehound: fleet: {node} ended: {status} (srun exit {run.rc})")

    def _identify(self, force: bool = False) -> None:
        """Each running node's step id, from squeue under the run's own step
        name for that node (exact, never the job's name), journalled as soon
        as it is known: every signal later names it."""
        now = time.monotonic()
        if not force and now < self._next_lookup:
            return
        self._next_lookup = now + 1.0
        for node, run in self.runs.items():
            if run.proc is None or run.rc is not None or run.step_id is not None:
                continue
            try:
                ids = slurm.find_steps(slurm.step_name(self.run_id, node))
            except slurm.SlurmError as exc:
                self.err(f"tracehound: fleet: cannot list {node}'s step: {exc}")
                continue
            if len(ids) == 1:
                run.step_id = ids[0]
                self.journal.step(node, run.step_id)

    def _wait(self, wave: list[str]) -> None:
        while any(self.runs[n].rc is None for n in wave):
            self._reap()
            self._identify()
            self._check_abort()
            if self.stop_reason:
                return
            time.sleep(POLL_S)

    def _pause(self, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline and not self.stop_reason:
            self._check_abort()
            time.sleep(min(POLL_S, max(deadline - time.monotonic(), 0)))

    def _check_abort(self, force: bool = False) -> None:
        if not self.opt.abort_when or self.stop_reason:
            return
        now = time.monotonic()
        if not force and now < self._next_check:
            return
        self._next_check = now + self.opt.abort_interval_s
        try:
            samples = prometheus.query(self.opt.prometheus, self.opt.abort_when, timeout=5)
        except prometheus.PrometheusError as exc:
            self._abort_failures += 1
            self.err(f"tracehound: fleet: cannot check --abort-when: {exc}")
            if force or not exc.retryable or self._abort_failures >= ABORT_CHECK_FAILURES:
                self.stop_reason = f"the abort condition could not be checked: {exc}"
            return
        self._abort_failures = 0
        held = [s for s in samples if s.value != 0]
        if held:
            shown = ", ".join(f"{s.labels or '{}'} {s.value:g}" for s in held[:3])
            self.stop_reason = f"--abort-when {self.opt.abort_when!r} holds: {shown}"
            self.err(f"tracehound: fleet: {self.stop_reason}: no new node starts, running "
                     "nodes roll back")

    def _stop_running(self) -> None:
        self._reap()
        running = [r for r in self.runs.values() if r.proc is not None and r.rc is None]
        if not running:
            return
        for run in running:
            run.stopped = True
            # the node's run rolls back and ends on SIGTERM, sent to its own
            # step by id: a step that cannot be identified is left alone
            # (no other step of the job is ever signalled in its place)
            if not self._signal_step(run):
                run.unidentified = True
                self.err(f"tracehound: fleet: {run.node}: its step could not be identified: "
                         "not signalled; it ends by itself, or run 'tracehound chaos recover "
                         "--slurm'")
        deadline = time.monotonic() + self.opt.stop_timeout_s
        while any(r.proc.poll() is None for r in running) and time.monotonic() < deadline:
            time.sleep(POLL_S)
        for run in running:
            if run.proc.poll() is None:
                run.killed = True
                self.err(f"tracehound: fleet: {run.node} did not end within "
                         f"{self.opt.stop_timeout_s:g} s: its srun killed (its own step alone "
                         "ends); run 'tracehound chaos recover --slurm'")
                _signal(run.proc, signal.SIGKILL)
                run.proc.wait()
        self._reap()

    def _signal_step(self, run: NodeRun) -> bool:
        """SIGTERM to the node's run through its own step; one launched a
        moment ago may not be listed yet, so it is looked for a few seconds."""
        deadline = time.monotonic() + STEP_LOOKUP_S
        while run.step_id is None and run.proc.poll() is None:
            self._identify(force=True)
            if run.step_id is None:
                if time.monotonic() > deadline:
                    return False
                time.sleep(POLL_S)
        if run.proc.poll() is not None:
            return True         # it ended by itself meanwhile
        try:
            slurm.signal_step(run.step_id, "TERM")
        except slurm.SlurmError as exc:
            # scancel --signal may deliver and still exit 1 (Slurm 22.05, a step
            # inside a job): the wait for the run's end judges it
            self.err(f"tracehound: fleet: {run.node}'s step {run.step_id}: {exc}")
        return True


def node_run_argv(tracehound: list[str], experiment: str, journal: str, report: str,
                  allow_code: bool) -> list[str]:
    """What each node runs: the ordinary local run, destructive faults
    consented to by the launcher's own --yes."""
    argv = [*tracehound, "chaos", "run", experiment, "--yes", "--journal", journal,
            "--report", report, "--no-plot"]
    return argv + (["--allow-code"] if allow_code else [])


def _signal(proc: subprocess.Popen, sig: int) -> None:
    try:
        proc.send_signal(sig)
    except ProcessLookupError:
        pass


def node_record_path(node_dir: str) -> str | None:
    """The node run's JSON record (report.write's *-journal.json), newest."""
    try:
        names = [n for n in os.listdir(node_dir) if n.endswith("-journal.json")]
    except OSError:
        return None
    if not names:
        return None
    return max((os.path.join(node_dir, n) for n in names), key=os.path.getmtime)


def node_status(node_dir: str, rc: int | None) -> str:
    """What became of a node's run: its own record's status, else why there
    is none (srun could not place it, or it was killed)."""
    path = node_record_path(node_dir)
    if path is not None:
        try:
            with open(path) as f:
                return str(json.load(f).get("status", "unknown"))
        except (OSError, ValueError):
            return "unreadable record"
    if rc is not None and rc < 0:
        return f"lost (srun killed by {signal.Signals(-rc).name})"
    if rc is not None and rc > 128:
        return (f"lost (the node's run was killed by signal {rc - 128} before it wrote its "
                "record: inside --job, the job may have ended)")
    return "not run (srun failed: see srun.log)"
