"""What the launcher asks Slurm: the nodes of a partition and their states,
the nodes of a running job, a host list expanded; and the srun command line
that runs one node's part. Every call is a Slurm client run with a timeout;
a failure is a SlurmError that says which command and why."""
from __future__ import annotations

import re
import shutil
import subprocess
from dataclasses import dataclass

TIMEOUT_S = 30
# node states in which a node can take an exclusive allocation now
IDLE_STATES = {"idle"}
# a step's id: JOB.STEP (a job's own batch or extern steps are never ours)
_STEP_ID = re.compile(r"[0-9]{1,12}\.[0-9]{1,9}")


class SlurmError(Exception):
    """A Slurm client failed or answered something unexpected."""


@dataclass(frozen=True)
class NodeState:
    name: str
    state: str          # sinfo's long state, lower case, flags and all ("idle", "drained", "down*")

    @property
    def idle(self) -> bool:
        return self.state in IDLE_STATES


def tool(name: str) -> str:
    path = shutil.which(name) or next((p for p in (f"/usr/bin/{name}", f"/usr/local/bin/{name}")
                                       if shutil.which(p)), None)
    if path is None:
        raise SlurmError(f"{name} not found: the launcher needs Slurm's client tools")
    return path


def run(argv: list[str]) -> str:
    try:
        out = subprocess.run([tool(argv[0]), *argv[1:]], capture_output=True, text=True,
                             timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise SlurmError(f"{' '.join(argv)}: no answer in {TIMEOUT_S} s (is slurmctld up?)") \
            from None
    if out.returncode != 0:
        lines = (out.stderr or out.stdout).strip().splitlines()
        raise SlurmError(f"{' '.join(argv)} failed: {lines[-1] if lines else out.returncode}")
    return out.stdout


def hostnames(hostlist: str) -> list[str]:
    """n[1-3],m1 -> [n1, n2, n3, m1], as Slurm expands it."""
    names = run(["scontrol", "show", "hostnames", hostlist]).split()
    if not names:
        raise SlurmError(f"{hostlist!r} names no node")
    return names


def default_partition() -> str:
    for name in run(["sinfo", "-h", "-o", "%P"]).split():
        if name.endswith("*"):
            return name[:-1]
    raise SlurmError("the cluster has no default partition: give --partition")


def partition_nodes(partition: str) -> list[NodeState]:
    """Every node of the partition with its state, sorted by name."""
    out: dict[str, NodeState] = {}
    for line in run(["sinfo", "-h", "-N", "-p", partition, "-o", "%N|%T"]).splitlines():
        name, _, state = line.strip().partition("|")
        if name:
            out[name] = NodeState(name, state.strip().lower())
    if not out:
        raise SlurmError(f"partition {partition!r} has no nodes (or does not exist)")
    return [out[n] for n in sorted(out)]


@dataclass(frozen=True)
class Job:
    id: str
    state: str
    partition: str
    nodes: list[str]


def job(job_id: str) -> Job:
    if not job_id.isascii() or not job_id.isdigit():
        raise SlurmError(f"--job {job_id!r}: a job id is digits only")
    line = run(["squeue", "-h", "-j", job_id, "-o", "%i|%T|%P|%N"]).strip()
    fields = line.splitlines()[0].split("|") if line else []
    if len(fields) != 4:
        raise SlurmError(f"job {job_id} is not in the queue")
    jid, state, partition, nodelist = fields
    if state != "RUNNING":
        raise SlurmError(f"job {job_id} is {state.lower()}, not running: it has no nodes to "
                         "reach")
    return Job(jid, state, partition, hostnames(nodelist))


def srun_argv(node: str, command: list[str], partition: str | None, job_id: str | None,
              immediate_s: int, name: str) -> list[str]:
    """One node's part: inside the target job's allocation (--overlap: beside
    its steps, on the resources it holds), or an exclusive allocation of an
    idle node that gives up after immediate_s if the node is not free."""
    argv = [tool("srun"), f"--nodelist={node}", "--nodes=1", "--ntasks=1", "--quiet",
            f"--job-name={name}", "--kill-on-bad-exit=0"]
    if job_id:
        argv += [f"--jobid={job_id}", "--overlap"]
    else:
        argv += ["--exclusive", f"--immediate={immediate_s}"]
        if partition:
            argv.append(f"--partition={partition}")
    return [*argv, "--", *command]


def step_name(run_id: str, node: str) -> str:
    """The name of the step one node's run is launched as: the run's and the
    node's, so no step of anyone else's bears it."""
    return f"tracehound-chaos-{run_id}-{node}"


def find_steps(name: str) -> list[str]:
    """The ids (JOB.STEP) of the running steps named exactly `name`.
    squeue's --name filters by the *job's* name (inside --jobid, the user's
    job: every one of its steps matches), so every step is listed and its
    own name compared here."""
    out = []
    for line in run(["squeue", "-h", "-s", "-o", "%i|%j"]).splitlines():
        sid, _, step = line.strip().partition("|")
        if step == name and _STEP_ID.fullmatch(sid):
            out.append(sid)
    return out


def step_running(step_id: str) -> bool:
    return step_id in {line.strip() for line in
                       run(["squeue", "-h", "-s", "-o", "%i"]).splitlines()}


def signal_step(step_id: str, signame: str = "TERM") -> None:
    """Send a signal to the tasks of exactly step `step_id` (JOB.STEP)
    without cancelling it (scancel --signal only signals): srun itself, sent
    SIGTERM, would cancel the step and its tasks would die without their
    rollback."""
    if not _STEP_ID.fullmatch(step_id):
        raise SlurmError(f"{step_id!r} is not a step id (JOB.STEP)")
    run(["scancel", f"--signal={signame}", "--quiet", step_id])
