"""Process faults: kill, stop (SIGSTOP/SIGCONT), CPU/memory/I/O stress."""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
import time

from ...host.procs import cgroup_v2_path
from . import Arg, Availability, Detection, Fault, FaultError, Prepared, names, target_args
from . import grown as grown_promql
from . import workload_cgroup
from .targets import (all_pids, cgroup_dir, check_target_args, enforce_blast_radius,
                      common_job, resolve_processes, same_process)

MARKER = "TRACEHOUND_CHAOS_FAULT"
STARTUP_S = 1.0
SIGNALS = ("KILL", "TERM", "INT", "HUP", "QUIT", "ABRT", "SEGV", "USR1", "USR2")


def _target_cgroup(state: dict | None, args: dict) -> str | None:
    """The targets' cgroup: named, or the first target's as prepare() found it."""
    cgroup = args.get("cgroup")
    if cgroup is None and state and state.get("procs"):
        cgroup = state["procs"][0][3]
    return cgroup if cgroup and cgroup != "/" else None


def _target_owner(state: dict | None, args: dict) -> tuple[str, str] | None:
    """The label that names the targets' owner on the agent: their Slurm job
    when they belong to one (the agent labels it whatever cgroup it counts
    by, v2 or a v1 controller's), else their cgroup v2 path."""
    job = args.get("job_id") or (state or {}).get("job_id")
    if job:
        return "job_id", job
    cgroup = _target_cgroup(state, args)
    return ("cgroup", cgroup) if cgroup else None


def _no_cgroup(what: str) -> Detection:
    return Detection(note=f"{what}: tracehound's process signals are per cgroup and the "
                          "target's cgroup is unknown or the root")


class _ProcessFault(Fault):
    args = {**target_args(1)}

    def check(self, args):
        return check_target_args(args)

    def prepare(self, args, fault_id):
        procs = resolve_processes(args)
        enforce_blast_radius("processes", procs, args["max_targets"])
        rows = [[p.pid, p.start, p.comm, cgroup_v2_path(p.pid)] for p in procs]
        return Prepared([p.label() for p in procs],
                        {"procs": rows, "job_id": common_job(p.pid for p in procs),
                         **self._extra(args)})

    def _extra(self, args) -> dict:
        return {}

    def _signal(self, state: dict, sig: int) -> None:
        for pid, start, *_ in state["procs"]:
            if same_process(pid, start):
                try:
                    os.kill(pid, sig)
                except ProcessLookupError:
                    pass

    def detection(self, args, state=None):
        owner = _target_owner(state, args)
        if owner is None:
            return _no_cgroup(self.name)
        key, value = owner
        sig = args.get("signal", "KILL")
        sel = f'{{{key}="{value}",reason="signal",signal="{sig}"}}'
        return Detection.counter_grows("tracehound_process_exits_total" + sel,
                                       f"the kernel counts the target's exit by SIG{sig} in "
                                       f"{key.replace('_', ' ')} {value}")


class ProcKill(_ProcessFault):
    name = "proc.kill"
    summary = "send a fatal signal (default SIGKILL) to the target processes"
    args = {**target_args(1),
            "signal": Arg(str, "signal name without SIG", default="KILL", choices=SIGNALS)}

    def _extra(self, args):
        return {"signal": args["signal"]}

    def apply(self, state):
        self._signal(state, getattr(signal, "SIG" + state["signal"]))
        return None

    def rollback(self, state):
        return "irreversible: killed processes are not restarted"


# how long a rollback waits to see its SIGCONT land
THAW_CHECK_S = 2.0


def _stopped(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] in ("T", "t")
    except (OSError, IndexError):
        return False


class ProcStop(_ProcessFault):
    name = "proc.stop"
    summary = "freeze the target processes with SIGSTOP (rollback: SIGCONT)"

    def prepare(self, args, fault_id):
        prepared = super().prepare(args, fault_id)
        # a process someone else had stopped stays stopped after the rollback
        prepared.state["stopped_before"] = [
            pid for pid, *_ in prepared.state["procs"] if _stopped(pid)]
        return prepared

    def apply(self, state):
        self._signal(state, signal.SIGSTOP)
        return None

    def detection(self, args, state=None):
        owner = _target_owner(state, args)
        if owner is None:
            return _no_cgroup(self.name)
        key, value = owner
        q = f'tracehound_cgroup_processes{{{key}="{value}",state="stopped"}}'
        return Detection(query=q, signal="value", predicate="> 0", promql=f"sum({q})",
                         note=f"stopped processes in {key.replace('_', ' ')} {value} (after "
                              "--stall-after, also a job_stalled event; a job's process "
                              "states are read from its own cgroup, v2 or the v1 key's)")

    def rollback(self, state):
        keep = set(state.get("stopped_before", ()))
        thawed = [row for row in state["procs"] if row[0] not in keep]
        self._signal({"procs": thawed}, signal.SIGCONT)
        # verified where it lands: none of them is left stopped (the kernel
        # wakes a stopped task at once; a moment is allowed for it)
        deadline = time.monotonic() + THAW_CHECK_S
        while True:
            still = [pid for pid, start, *_ in thawed
                     if same_process(pid, start) and _stopped(pid)]
            if not still:
                break
            if time.monotonic() > deadline:
                raise RuntimeError(f"still stopped after SIGCONT: pid {', '.join(map(str, still))}")
            time.sleep(0.05)
        return f"left {len(keep)} process(es) stopped as found" if keep else None


class ProcStress(Fault):
    name = "proc.stress"
    summary = "run stress-ng (cpu, memory or io stressors) inside a cgroup"
    destructive = False
    args = {
        "cgroup": Arg(str, "cgroup v2 path the stressor joins", required=True,
                      grammar=names.cgroup_path),
        "kind": Arg(str, "what to stress", default="cpu", choices=("cpu", "memory", "io")),
        "workers": Arg(int, "stressor processes (blast radius: at most 64)", default=1,
                       minimum=1, maximum=64),
        "memory_bytes": Arg(int, "memory: bytes per worker", default=256 << 20,
                            minimum=4096),
        "io_bytes": Arg(int, "io: bytes each worker writes per round", default=64 << 20,
                        minimum=4096),
        "temp_dir": Arg(str, "io: directory the io workers write in", default="/var/tmp"),
        "seconds": Arg(int, "stress-ng's own time limit, a safety net if rollback never "
                            "runs", default=600, minimum=1, maximum=86400),
    }

    def check(self, args):
        return []

    def availability(self):
        if shutil.which("stress-ng"):
            return Availability(True)
        return Availability(False, "stress-ng is not installed (apt-get install stress-ng)")

    def prepare(self, args, fault_id):
        if not shutil.which("stress-ng"):
            raise FaultError("stress-ng is not installed (apt-get install stress-ng)")
        cgroup_dir(args["cgroup"])         # it exists, or the fault is refused here
        n, kind = args["workers"], args["kind"]
        # stress-ng refuses to start without a writable directory of its own
        # (the current one by default: "/" may be read-only)
        argv = ["stress-ng", "--timeout", f"{args['seconds']}s", "--quiet",
                "--temp-path", tempfile.gettempdir()]
        workdir = None
        if kind == "cpu":
            argv += ["--cpu", str(n)]
        elif kind == "memory":
            argv += ["--vm", str(n), "--vm-bytes", str(args["memory_bytes"]), "--vm-keep"]
        else:
            if not os.path.isdir(args["temp_dir"]):
                raise FaultError(f"temp_dir {args['temp_dir']} is not a directory")
            workdir = os.path.join(os.path.realpath(args["temp_dir"]),
                                   f".tracehound-chaos-stress-{fault_id}")
            argv[argv.index("--temp-path") + 1] = workdir
            argv += ["--hdd", str(n), "--hdd-bytes", str(args["io_bytes"])]
        return Prepared([f"{n} {kind} worker(s) in cgroup {args['cgroup']}"],
                        # its cgroup.procs, and the same path's in the v1
                        # hierarchies an agent may key by, where the experiment made it
                        {"argv": argv, "join": workload_cgroup.existing_procs(args["cgroup"]),
                         "marker": fault_id, "workdir": workdir, "kind": kind,
                         "cgroup": args["cgroup"]})

    def apply(self, state):
        if state["workdir"]:
            os.makedirs(state["workdir"], exist_ok=True)
        env = dict(os.environ, **{MARKER: state["marker"]})
        errors = tempfile.TemporaryFile()
        # The shell joins the cgroup before exec, so no stressor ever runs outside it.
        proc = subprocess.Popen(workload_cgroup.join_argv(state["join"], state["argv"]),
                                env=env, cwd=state["workdir"] or "/", start_new_session=True,
                                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                stderr=errors)
        # a stress-ng that refuses its arguments or its directory exits within
        # a moment (longer on a slow machine); one still running has started
        deadline = time.monotonic() + STARTUP_S
        while proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        if proc.poll() is not None and proc.returncode != 0:
            errors.seek(0)
            err = errors.read().decode(errors="replace").strip()
            raise FaultError(f"stress-ng exited with {proc.returncode}: {err}")
        errors.close()
        return {"pid": proc.pid}

    def rollback(self, state):
        kill_marked(state["marker"], state.get("pid"))
        if state.get("workdir"):
            shutil.rmtree(state["workdir"], ignore_errors=True)
        return None

    def detection(self, args, state=None):
        sel = f'{{cgroup="{args["cgroup"]}"}}'
        kind = args.get("kind", "cpu")
        if kind == "cpu":
            # each worker spins one CPU: at least half of what they can get
            cpus = 0.5 * min(args.get("workers", 1), os.cpu_count() or 1)
            q = "tracehound_cgroup_cpu_seconds_total" + sel
            return Detection(query=q, signal="rate", predicate=f"> {cpus:g}",
                             promql=f"sum(rate({q}[15s]))",
                             note=f"the cgroup burns more than {cpus:g} CPUs (its neighbours' "
                                  "cost shows as tracehound_pressure_stalled_seconds_total)")
        if kind == "memory":
            grown = args.get("workers", 1) * args.get("memory_bytes", 256 << 20) // 2
            q = "tracehound_cgroup_memory_rss_bytes" + sel
            return Detection(query=q, signal="increase", predicate=f"> {grown}",
                             promql=grown_promql(q, counter=False),
                             note="the resident memory of the cgroup's processes grows by half "
                                  "of what the workers hold (reclaim it forces shows as memory "
                                  "pressure)")
        return Detection(query="tracehound_io_write_bytes_total" + sel, signal="rate",
                         predicate="> 1000000",
                         promql=f"sum(rate(tracehound_io_write_bytes_total{sel}[15s]))",
                         note="the cgroup writes more than 1 MB/s")


def marked_pids(marker: str) -> list[int]:
    """Processes carrying the fault's marker in their environment: the
    stressor and every worker it forked, found even after a crash."""
    needle = f"{MARKER}={marker}".encode()
    out = []
    for pid in all_pids():
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                if needle in f.read().split(b"\0"):
                    out.append(pid)
        except OSError:
            continue
    return out


def kill_marked(marker: str, child: int | None) -> None:
    # TERM first: stress-ng removes its temporary files when asked politely.
    for sig, wait in ((signal.SIGTERM, 3.0), (signal.SIGKILL, 3.0)):
        pids = marked_pids(marker)
        if not pids:
            return
        for pid in pids:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline and marked_pids(marker):
            _reap(child)
            time.sleep(0.05)
    survivors = marked_pids(marker)
    if survivors:
        raise FaultError(f"stressor processes {survivors} survive SIGKILL")


def _reap(child: int | None) -> None:
    """Collect the stressor if this process started it, so it does not
    linger as a zombie of the chaos run."""
    if child is None:
        return
    try:
        os.waitpid(child, os.WNOHANG)
    except ChildProcessError:
        pass


FAULTS = [ProcKill(), ProcStop(), ProcStress()]
