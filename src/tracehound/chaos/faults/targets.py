"""Choosing what a fault hits, and refusing what it must never hit.

Processes are remembered as (pid, start time) so that a rollback after a
crash never signals a process that merely reused the pid.
"""
from __future__ import annotations

import os
import re
import subprocess
from dataclasses import dataclass

from ...attribution import ownership, slurm as slurm_paths
from ...attribution.cgroup_layout import v1_hierarchies
from ...host.mounts import MountTable, MountTableError
from ...host.procs import proc_cgroups
from . import FaultError, names

PF_KTHREAD = 0x00200000


@dataclass(frozen=True)
class Proc:
    pid: int
    start: int
    comm: str

    def label(self) -> str:
        return f"pid {self.pid} ({self.comm})"


def _stat_fields(pid: int) -> list[str] | None:
    try:
        with open(f"/proc/{pid}/stat") as f:
            raw = f.read()
    except OSError:
        return None
    # comm may hold spaces and parentheses: split after the last ')'
    head, _, rest = raw.rpartition(")")
    comm = head.split("(", 1)[1] if "(" in head else ""
    return [str(pid), comm] + rest.split()


def proc_state(pid: int) -> str | None:
    """One-letter state from /proc/<pid>/stat (R, S, T, Z...), None if gone."""
    fields = _stat_fields(pid)
    return fields[2] if fields else None


def proc_of(pid: int) -> Proc | None:
    fields = _stat_fields(pid)
    if not fields:
        return None
    return Proc(pid, int(fields[21]), fields[1])


def same_process(pid: int, start: int) -> bool:
    fields = _stat_fields(pid)
    return fields is not None and int(fields[21]) == start and fields[2] != "Z"


def _protected() -> set[int]:
    """pid 1 and this process with all its ancestors: killing or stopping
    them would take the chaos run (or the machine) down with the target."""
    out = {1, os.getpid()}
    pid = os.getpid()
    while pid > 1:
        fields = _stat_fields(pid)
        if not fields:
            break
        pid = int(fields[3])
        out.add(pid)
    return out


def all_pids() -> list[int]:
    return sorted(int(d) for d in os.listdir("/proc") if d.isdigit())


TARGET_KEYS = ("pid", "name", "cgroup", "job_id")


def hierarchy_roots(mountinfo: str = "/proc/self/mountinfo") -> dict[str, str]:
    """Where the hierarchies a Slurm job's path is read from are mounted:
    "" for v2, and each v1 hierarchy the agent can count by (freezer,
    cpuset, memory: cgroup_layout.v1_hierarchies, the agent's own pick)."""
    try:
        mounts = MountTable(mountinfo)
    except MountTableError:
        return {}
    v2 = mounts.cgroup2_root()
    return {**({"": v2} if v2 else {}), **v1_hierarchies(mounts)}


def slurm_job_of(pid: int, node: str | None = None,
                 roots: dict[str, str] | None = None) -> tuple[str, str] | None:
    """(job id, step) of the Slurm job whose cgroup holds the process, in
    whichever hierarchy says so (v2 on a v2 host, the v1 controllers on a
    hybrid or v1 one); None for a process of no job. Only directories root
    made name a job (attribution/ownership.py), so a hierarchy not mounted
    here, where they cannot be looked at, names none. With `node`, a path
    under another node's slurmd (slurm_<other>/, as several slurmd on one
    host make) is not this node's job."""
    if roots is None:
        roots = hierarchy_roots()
    for hierarchy, path in proc_cgroups(pid).items():
        if hierarchy not in roots:
            continue
        parts = ownership.root_made_part(roots[hierarchy], [c for c in path.split("/") if c])
        parsed = slurm_paths.parse(parts)
        if parsed is None or not parsed.job_id:
            continue
        slurmds = [c[len("slurm_"):] for c in parts if c.startswith("slurm_")]
        if node and slurmds and slurmds[0] != node:
            continue
        return parsed.job_id, parsed.step
    return None


def common_job(pids) -> str | None:
    """The Slurm job every one of the processes belongs to on this node, if
    one: detection then asks for that job's series, which the agent labels
    whatever cgroup (v2, or a v1 controller's) it counts by."""
    node, roots = os.environ.get("SLURMD_NODENAME"), hierarchy_roots()
    jobs = {(slurm_job_of(pid, node, roots) or (None,))[0] for pid in pids}
    return next(iter(jobs)) if len(jobs) == 1 else None


def job_pids(job_id: str) -> list[int]:
    """The processes of a job on this node, less slurmstepd (Slurm's own)
    and the step this chaos run is itself a part of (srun --jobid --overlap
    puts it inside the job it targets)."""
    own = (os.environ.get("SLURM_JOB_ID"), os.environ.get("SLURM_STEP_ID"))
    node, roots = os.environ.get("SLURMD_NODENAME"), hierarchy_roots()
    out = []
    for pid in all_pids():
        found = slurm_job_of(pid, node, roots)
        if found is None or found[0] != job_id or found == own:
            continue
        fields = _stat_fields(pid)
        if fields is None or fields[1] == "slurmstepd":
            continue
        out.append(pid)
    return out


def check_target_args(args: dict) -> list[str]:
    given = [k for k in TARGET_KEYS if args.get(k) is not None]
    if len(given) != 1:
        return ["give exactly one target: pid, name, cgroup or job_id"
                + (f" (got {', '.join(given)})" if given else "")]
    if args.get("name") is not None:
        try:
            re.compile(args["name"])
        except re.error as exc:
            return [f"name is not a valid regular expression: {exc}"]
    return []           # a cgroup path is checked as the argument's grammar


def check_cgroup_path(path: str) -> list[str]:
    why = names.cgroup_path(path)
    return [why] if why else []


def resolve_processes(args: dict) -> list[Proc]:
    """The processes named by pid, name or cgroup, minus protected ones."""
    protected = _protected()
    if args.get("pid") is not None:
        pids = [args["pid"]]
        if args["pid"] in protected:
            raise FaultError(f"pid {args['pid']} is protected (init, or this chaos run "
                             "and its parents)")
    elif args.get("name") is not None:
        rx = re.compile(args["name"])
        pids = [p for p in all_pids() if _name_matches(p, rx)]
    elif args.get("job_id") is not None:
        pids = job_pids(args["job_id"])
    else:
        pids = cgroup_procs(cgroup_dir(args["cgroup"]))
    out = []
    for pid in pids:
        if pid in protected:
            continue
        fields = _stat_fields(pid)
        if fields is None or int(fields[8]) & PF_KTHREAD or fields[2] == "Z":
            continue
        out.append(Proc(pid, int(fields[21]), fields[1]))
    if not out:
        raise FaultError(f"no process matches {describe_target(args)}")
    return out


def _name_matches(pid: int, rx: re.Pattern) -> bool:
    try:
        with open(f"/proc/{pid}/comm") as f:
            comm = f.read().strip()
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            cmdline = f.read().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return False
    return bool(rx.search(comm) or (cmdline and rx.search(cmdline)))


def describe_target(args: dict) -> str:
    for key in TARGET_KEYS:
        if args.get(key) is not None:
            return f"{key} {args[key]!r}"
    return "no target"


def enforce_blast_radius(what: str, found: list, limit: int) -> None:
    if len(found) > limit:
        raise FaultError(f"{len(found)} {what} match, more than the blast-radius limit "
                         f"max_targets={limit}: narrow the target or raise the limit")


def cgroup2_root() -> str:
    root = MountTable().cgroup2_root()
    if root is None:
        raise FaultError("no cgroup v2 hierarchy is mounted")
    return root


def cgroup_dir(path: str, root: str | None = None) -> str:
    problems = check_cgroup_path(path)
    if problems:
        raise FaultError(problems[0])
    full = os.path.join(root or cgroup2_root(), path.strip("/"))
    if not os.path.isdir(full):
        raise FaultError(f"cgroup {path} does not exist ({full})")
    return full


def cgroup_procs(directory: str) -> list[int]:
    try:
        with open(os.path.join(directory, "cgroup.procs")) as f:
            return [int(x) for x in f.read().split()]
    except OSError as exc:
        raise FaultError(f"cannot list processes of {directory}: {exc.strerror}") from None


def run_cmd(argv: list[str], timeout: float = 30) -> subprocess.CompletedProcess:
    """Run a helper tool; a missing tool or a failure becomes a FaultError."""
    try:
        out = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    except FileNotFoundError:
        raise FaultError(f"{argv[0]} is not installed") from None
    except subprocess.TimeoutExpired:
        raise FaultError(f"{' '.join(argv)} took longer than {timeout} s") from None
    if out.returncode != 0:
        msg = (out.stderr or out.stdout).strip().splitlines()
        raise FaultError(f"{' '.join(argv)} failed: {msg[-1] if msg else out.returncode}")
    return out


def netns_prefix(netns: str | None) -> list[str]:
    """Command prefix that runs a tool in a named network namespace. nsenter
    switches only the network namespace (ip netns exec also remounts /sys)."""
    if not netns:
        return []
    return ["nsenter", f"--net={netns_path(netns)}", "--"]


def netns_path(netns: str) -> str:
    """/run/netns/<netns>, for a name only (also checked here: a journal's
    state reaches this too)."""
    why = names.netns_name(netns)
    if why:
        raise FaultError(why)
    return f"/run/netns/{netns}"
