"""`tracehound chaos recover --slurm`: after a launcher died, recover exactly
the nodes its fleet journal says it launched on (and whose runs did not end
clean), each against that run's own journal directory on the node.

A node's run may outlive its launcher (its srun is in a session of its
own). Such a run still holds its journal and its fault: the local recovery
would find nothing dead there, and "nothing to recover" would be a lie. So
for each node, first: is its step still running (by the id the launcher
journalled, else by the run's own step name, never the job's)? If it is, it
is sent SIGTERM by that id, rolls back by itself, and is waited for. Then
the local recovery runs on the node through srun; the node is recorded
"recovered" only when that recovery ended clean and found no live run
holding a journal there (each fault's rollback checks its own undoing, e.g.
no process left stopped).
"""
from __future__ import annotations

import os
import subprocess
import time

from ..exit_codes import EXIT_ALIVE, EXIT_FAILED, EXIT_OK, EXIT_ROLLBACK
from . import journal as fleet_journal
from . import slurm

RECOVER_TIMEOUT_S = 300
IMMEDIATE_S = 60
# how long a live node run is given to roll back and end after SIGTERM
STOP_WAIT_S = 120.0
POLL_S = 0.5


def _srun(node: str, job_id: str | None, command: list[str]) -> list[str]:
    argv = [slurm.tool("srun"), f"--nodelist={node}", "--nodes=1", "--ntasks=1", "--quiet",
            "--job-name=tracehound-chaos-recover"]
    if job_id and _running(job_id):
        argv += [f"--jobid={job_id}", "--overlap"]
    else:       # the job is gone (and its processes with it): any allocation on the node
        argv.append(f"--immediate={IMMEDIATE_S}")
    return [*argv, "--", *command]


def _running(job_id: str) -> bool:
    try:
        return slurm.job(job_id).state == "RUNNING"
    except slurm.SlurmError:
        return False


def live_step(run_id: str, node: str, step_id: str | None) -> str | None:
    """The node run's step, where it is still running."""
    if step_id is not None:
        return step_id if slurm.step_running(step_id) else None
    found = slurm.find_steps(slurm.step_name(run_id, node))
    return found[0] if len(found) == 1 else None


def stop_live(step_id: str, wait_s: float = STOP_WAIT_S) -> bool:
    """SIGTERM to exactly that step, then wait for it to end (a step that
    ends between the look and the signal is ended all the same)."""
    try:
        slurm.signal_step(step_id, "TERM")
    except slurm.SlurmError:
        # Slurm 22.05's scancel --signal on a step of a job it runs inside
        # delivers the signal and still exits 1 ("Invalid job id specified"):
        # whether the run ends is what is judged
        pass
    deadline = time.monotonic() + wait_s
    while slurm.step_running(step_id):
        if time.monotonic() > deadline:
            return False
        time.sleep(POLL_S)
    return True


def recover_node(run, node: str, job_id: str | None, base: str,
                 node_command: list[str]) -> tuple[bool, str]:
    """(recovered, what was found and done) for one node of a dead run."""
    said = []
    try:
        step = live_step(run.run_id, node, run.steps.get(node))
        if step is not None:
            if not stop_live(step):
                return False, (f"its run (step {step}) is still running {STOP_WAIT_S:g} s after "
                               "SIGTERM: not recovered")
            said.append(f"its run (step {step}) was alive: stopped it")
        local = fleet_journal.node_journal(base, run.run_id, node)
        argv = _srun(node, job_id, [*node_command, "chaos", "recover", "--journal", local])
        done = subprocess.run(argv, capture_output=True, text=True, timeout=RECOVER_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return False, f"no end within {RECOVER_TIMEOUT_S} s"
    except slurm.SlurmError as exc:
        return False, str(exc)
    text = (done.stdout + done.stderr).strip()
    last = text.splitlines()[-1] if text else ""
    said.append(last)
    if done.returncode == EXIT_ALIVE:
        return False, "; ".join(said) + " (a run on the node still holds its journal)"
    return done.returncode == EXIT_OK, "; ".join(s for s in said if s)


def recover_fleet(base: str, node_command: list[str], out, err) -> int:
    from ..trust import UntrustedFile
    try:
        runs = fleet_journal.dead_runs(base, err)
    except UntrustedFile as exc:
        err(f"tracehound: error: cannot recover: refusing the journal: {exc}")
        return EXIT_FAILED
    if not runs:
        out("tracehound: nothing to recover: no dead fleet run left a node unrecovered")
        return EXIT_OK
    failed = 0
    for run in runs:
        journal = fleet_journal.FleetJournal.adopt(
            os.path.join(fleet_journal.directory(base), f"{run.run_id}.jsonl"),
            run.fd)
        left = 0
        for node, job_id in sorted(run.nodes.items()):
            ok, detail = recover_node(run, node, job_id, base, node_command)
            journal.recovered(node, ok, detail[:500])
            out(f"tracehound: fleet run {run.run_id} ({run.title}): {node}: "
                + ("recovered" if ok else "RECOVERY FAILED") + (f": {detail}" if detail else ""))
            left += not ok
        failed += left
        journal.close(None if left else "recovered")
    return EXIT_ROLLBACK if failed else EXIT_OK
