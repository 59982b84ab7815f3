"""`tracehound chaos recover --slurm`: after a launcher died, run the local
recovery on exactly the nodes its fleet journal says it launched on (and
whose runs did not end clean), through srun, each against that run's own
journal directory on the node."""
from __future__ import annotations

import os
import subprocess

from . import journal as fleet_journal
from . import slurm

RECOVER_TIMEOUT_S = 300
IMMEDIATE_S = 60


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


def recover_fleet(base: str, node_command: list[str], out, err) -> int:
    from ..exit_codes import EXIT_FAILED, EXIT_OK, EXIT_ROLLBACK
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
            local = fleet_journal.node_journal(base, run.run_id, node)
            argv = _srun(node, job_id, [*node_command, "chaos", "recover", "--journal", local])
            try:
                done = subprocess.run(argv, capture_output=True, text=True,
                                      timeout=RECOVER_TIMEOUT_S)
                ok, text = done.returncode == 0, (done.stdout + done.stderr).strip()
            except subprocess.TimeoutExpired:
                ok, text = False, f"no end within {RECOVER_TIMEOUT_S} s"
            except slurm.SlurmError as exc:
                ok, text = False, str(exc)
            last = text.splitlines()[-1] if text else ""
            journal.recovered(node, ok, last[:500])
            out(f"tracehound: fleet run {run.run_id} ({run.title}): {node}: "
                + ("recovered" if ok else "RECOVERY FAILED") + (f": {last}" if last else ""))
            left += not ok
        failed += left
        journal.close(None if left else "recovered")
    return EXIT_ROLLBACK if failed else EXIT_OK
