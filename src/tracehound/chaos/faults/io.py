"""I/O faults: cgroup throttling (io_space.py: a full file system and failing
block I/O)."""
from __future__ import annotations

import os
import re
import stat
import time

from ...host.procs import cgroup_v2_path, proc_cgroups, read_pids
from . import Arg, Availability, Detection, Fault, FaultError, Prepared, cgroupctl, names
from .targets import (cgroup2_root, cgroup_dir, cgroup_procs, common_job, job_pids, proc_of,
                      same_process)

THROTTLE_KEYS = ("rbps", "wbps", "riops", "wiops")
V1_FILES = {"rbps": "blkio.throttle.read_bps_device", "wbps": "blkio.throttle.write_bps_device",
            "riops": "blkio.throttle.read_iops_device",
            "wiops": "blkio.throttle.write_iops_device"}
V1_PARENT = "tracehound-chaos"


def block_device(spec: str) -> str:
    """'MAJ:MIN' of the whole disk behind a device node, a MAJ:MIN string,
    or any path on a disk-backed file system (throttles act on disks)."""
    if re.fullmatch(r"\d+:\d+", spec):
        devnum = spec
    else:
        try:
            st = os.stat(spec)
        except OSError as exc:
            raise FaultError(f"device {spec}: {exc.strerror}") from None
        dev = st.st_rdev if stat.S_ISBLK(st.st_mode) else st.st_dev
        devnum = f"{os.major(dev)}:{os.minor(dev)}"
    sysdir = f"/sys/dev/block/{devnum}"
    if not os.path.exists(sysdir):
        raise FaultError(f"{spec} is not on a block device ({devnum}): tmpfs, overlay and "
                         "network file systems have no disk to throttle")
    if os.path.exists(os.path.join(sysdir, "partition")):
        with open(os.path.join(os.path.realpath(sysdir), "..", "dev")) as f:
            devnum = f.read().strip()
    return devnum


def _blkio_root() -> str | None:
    from ...host.mounts import MountTable
    for m in MountTable().mounts:
        if m.fstype == "cgroup" and os.path.exists(os.path.join(m.mountpoint, V1_FILES["wbps"])):
            return m.mountpoint
    return None


class IoThrottle(Fault):
    name = "io.throttle"
    summary = "limit a cgroup's bandwidth/IOPS on a disk (cgroup v2 io.max; v1 blkio fallback)"
    args = {
        "cgroup": Arg(str, "cgroup v2 path of the workload, e.g. /thtest/job1",
                      grammar=names.cgroup_path),
        "job_id": Arg(str, "or a Slurm job: its processes on this node (one slow rank); v2 "
                           "throttles their common cgroup, v1 moves them", grammar=names.slurm_job_id),
        "device": Arg(str, "block device (/dev/vda), MAJ:MIN, or a path on the file system "
                           "to throttle", required=True),
        "rbps": Arg(int, "read bytes per second", minimum=1),
        "wbps": Arg(int, "write bytes per second", minimum=1),
        "riops": Arg(int, "read operations per second", minimum=1),
        "wiops": Arg(int, "write operations per second", minimum=1),
        "mode": Arg(str, "v2 (io.max), v1 (blkio, moves the cgroup's processes into a "
                         "throttled blkio cgroup) or auto", default="auto",
                    choices=("auto", "v2", "v1")),
    }

    def check(self, args):
        problems = []
        if (args.get("cgroup") is None) == (args.get("job_id") is None):
            problems.append("give exactly one target: cgroup or job_id")
        if not any(args.get(k) for k in THROTTLE_KEYS):
            problems.append("give at least one limit: rbps, wbps, riops or wiops")
        return problems

    def availability(self):
        try:
            if "io" in cgroupctl.controllers(cgroup2_root()):
                return Availability(True, "cgroup v2 io controller")
        except FaultError as exc:
            return Availability(False, str(exc))
        if _blkio_root():
            return Availability(True, "cgroup v1 blkio throttling (io is bound to v1 here)")
        return Availability(False, "neither the cgroup v2 io controller nor v1 blkio is mounted")

    def prepare(self, args, fault_id):
        root = cgroup2_root()
        dev = block_device(args["device"])
        limits = {k: args[k] for k in THROTTLE_KEYS if args.get(k)}
        directory, pids, target = _throttle_target(args, root)
        mode = args.get("mode", "auto")
        if mode == "auto":
            mode = "v2" if directory and "io" in cgroupctl.controllers(root) else "v1"
        if mode == "v2" and directory is None:
            raise FaultError(f"job {args['job_id']}'s processes share no cgroup v2 below the "
                             "root (Slurm's cgroup/v1 plugin): throttle them with mode v1")
        target = [f"{target} on {dev}"]
        job = args.get("job_id") or common_job(pids)
        if mode == "v2":
            enable = cgroupctl.ancestors_to_enable(root, directory, "io")
            previous = cgroupctl.read_keyed(os.path.join(directory, "io.max")).get(dev)
            return Prepared(target, {"mode": "v2", "dir": directory, "device": dev,
                                     "limits": limits, "enable": enable,
                                     "previous": previous, "job_id": job})
        blkio = _blkio_root()
        if blkio is None:
            raise FaultError("cgroup v1 blkio is not mounted and v2 has no io controller")
        moved = {}
        for pid in pids:
            p = proc_of(pid)
            if p is not None:
                moved[str(pid)] = [p.start, proc_cgroups(pid).get("blkio", "/")]
        if not moved:
            raise FaultError(f"{target[0]}: no processes to throttle (v1 blkio throttles the "
                             "processes present when it is applied)")
        parent = os.path.join(blkio, V1_PARENT)
        state = {"mode": "v1", "blkio": blkio, "dir": os.path.join(parent, fault_id),
                 "parent": parent, "created_parent": not os.path.isdir(parent),
                 "device": dev, "limits": limits, "moved": moved, "job_id": job}
        why = ("the job's processes share no cgroup v2 below the root" if directory is None
               else "cgroup v2 has no io controller here")
        notes = [f"{why}: throttled through cgroup v1 blkio; processes that start later "
                 "are not throttled"]
        return Prepared(target + [f"{len(moved)} process(es)"], state, notes)

    def apply(self, state):
        dev, limits = state["device"], state["limits"]
        if state["mode"] == "v2":
            cgroupctl.enable(state["enable"], "io")
            line = dev + " " + " ".join(f"{k}={v}" for k, v in limits.items())
            cgroupctl.write_line(os.path.join(state["dir"], "io.max"), line)
            return None
        os.makedirs(state["dir"], exist_ok=True)
        for key, value in limits.items():
            cgroupctl.write_line(os.path.join(state["dir"], V1_FILES[key]), f"{dev} {value}")
        procs = os.path.join(state["dir"], "cgroup.procs")
        for pid, (start, _old) in state["moved"].items():
            if same_process(int(pid), start):
                cgroupctl.write_line(procs, pid)
        return None

    def rollback(self, state):
        dev = state["device"]
        if state["mode"] == "v2":
            cgroupctl.restore_keyed(os.path.join(state["dir"], "io.max"), dev, state["previous"],
                                    f"{dev} rbps=max wbps=max riops=max wiops=max",
                                    state["enable"], "io")
            return None
        return _rollback_v1(state)

    def detection(self, args, state=None):
        op = "write" if (args.get("wbps") or args.get("wiops")) else "read"
        job = (state or {}).get("job_id")
        if not job:
            # A cgroup of no workload has no latency histogram of its own by
            # default (--latency-histograms workload-mount sums those per
            # mount); its I/O pressure is its own under every setting.
            sel = f'{{cgroup="{args["cgroup"]}",resource="io",kind="some"}}'
            name = "tracehound_pressure_stalled_seconds_total"
            return Detection(query=name + sel, signal="rate", predicate="> 0.5",
                             promql=f"sum(rate({name}{sel}[30s]))",
                             note="the cgroup's tasks wait on I/O more than half of the time")
        # a Slurm job's processes: the job's series, whatever cgroup the agent counts by
        sel = f'{{job_id="{job}"}}'
        name = f"tracehound_io_{op}_latency_seconds"
        return Detection(
            query=name + sel, signal="mean", predicate="> 0.005",
            promql=f"sum(rate({name}_sum{sel}[30s])) / sum(rate({name}_count{sel}[30s]))",
            note=f"mean {op} latency of the job {job}'s calls rises above 5 ms")


def _throttle_target(args: dict, root: str) -> tuple[str | None, list[int], str]:
    """(the cgroup v2 directory to throttle or None, the processes, what
    they are called). A job's directory is the deepest cgroup v2 its
    processes share, None where that is the root (Slurm's v1 plugin)."""
    if args.get("job_id") is None:
        directory = cgroup_dir(args["cgroup"], root)
        try:
            pids = cgroup_procs(directory)
        except FaultError:      # none yet: v2 throttles the cgroup all the same
            pids = []
        return directory, pids, f"cgroup {args['cgroup']}"
    job = args["job_id"]
    pids = job_pids(job)
    if not pids:
        raise FaultError(f"job {job} has no process on this node")
    paths = {cgroup_v2_path(pid) for pid in pids} - {None}
    common = os.path.commonpath(sorted(paths)) if paths else "/"
    directory = cgroup_dir(common, root) if common.strip("/") else None
    return directory, pids, f"job {job} ({len(pids)} process(es))"


def _rollback_v1(state: dict) -> str | None:
    directory = state["dir"]
    if os.path.isdir(directory):
        fallback = next(iter(state["moved"].values()), [0, "/"])[1]
        for _ in range(50):
            pids = read_pids(directory)
            if not pids:
                break
            for pid in pids:
                old = state["moved"].get(str(pid), [0, fallback])[1]
                dest = os.path.join(state["blkio"], old.lstrip("/"))
                if not os.path.isdir(dest):
                    dest = state["blkio"]
                try:
                    cgroupctl.write_line(os.path.join(dest, "cgroup.procs"), str(pid))
                except FaultError:
                    pass  # exited meanwhile
            time.sleep(0.02)
        _rmdir(directory)
    if state["created_parent"] and os.path.isdir(state["parent"]):
        try:
            os.rmdir(state["parent"])
        except OSError:
            pass  # another run's throttle still lives there
    return None


def _rmdir(directory: str) -> None:
    for _ in range(100):
        try:
            os.rmdir(directory)
            return
        except FileNotFoundError:
            return
        except OSError:
            time.sleep(0.02)
    raise FaultError(f"cannot remove {directory}: processes are still in it")


FAULTS = [IoThrottle()]
