"""I/O faults: cgroup throttling, a full file system, failing block I/O."""
from __future__ import annotations

import errno
import os
import re
import shutil
import stat
import subprocess
import time

from ...attribution.procs import cgroup_v2_path, proc_cgroups, read_pids
from . import Arg, Availability, Detection, Fault, FaultError, Prepared, cgroupctl, names
from .targets import (cgroup2_root, cgroup_dir, cgroup_procs, common_job, job_pids, proc_of,
                      run_cmd, same_process)

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
        # a Slurm job's processes: the job's series, whatever cgroup the agent counts by
        sel = f'{{job_id="{job}"}}' if job else f'{{cgroup="{args["cgroup"]}"}}'
        name = f"tracehound_io_{op}_latency_seconds"
        return Detection(
            query=name + sel, signal="mean", predicate="> 0.005",
            promql=f"sum(rate({name}_sum{sel}[30s])) / sum(rate({name}_count{sel}[30s]))",
            note=f"mean {op} latency of the " + (f"job {job}'s" if job else "cgroup's")
                 + " calls rises above 5 ms")


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


def mount_of(path: str) -> str:
    path = os.path.realpath(path)
    while not os.path.ismount(path):
        path = os.path.dirname(path)
    return path


class IoFill(Fault):
    name = "io.fill"
    summary = "fill a file system with one preallocated file down to a free-space level"
    args = {
        "path": Arg(str, "a directory on the file system to fill", required=True),
        "free_bytes": Arg(int, "bytes to leave free", minimum=0),
        "free_percent": Arg(float, "percent of the file system to leave free",
                            minimum=0, maximum=100),
        "max_bytes": Arg(int, "blast radius: refuse to write more than this",
                         default=8 << 30, minimum=1),
        "allow_root_fs": Arg(bool, "allow filling the file system mounted at /",
                             default=False),
    }

    def check(self, args):
        if (args.get("free_bytes") is None) == (args.get("free_percent") is None):
            return ["give exactly one of free_bytes or free_percent"]
        return []

    def prepare(self, args, fault_id):
        path = args["path"]
        if not os.path.isdir(path):
            raise FaultError(f"{path} is not a directory")
        mount = mount_of(path)
        if mount == "/" and not args.get("allow_root_fs"):
            raise FaultError(f"{path} is on the root file system: set allow_root_fs: true "
                             "to fill it")
        st = os.statvfs(path)
        avail = st.f_bavail * st.f_frsize
        if args.get("free_bytes") is not None:
            keep = args["free_bytes"]
        else:
            keep = int(st.f_blocks * st.f_frsize * args["free_percent"] / 100)
        size = avail - keep
        if size <= 0:
            raise FaultError(f"{mount} already has only {avail} bytes free (target {keep})")
        if size > args["max_bytes"]:
            raise FaultError(f"filling {mount} needs {size} bytes, more than the blast-radius "
                             f"limit max_bytes={args['max_bytes']}")
        name = os.path.join(os.path.realpath(path), f".tracehound-chaos-fill-{fault_id}")
        return Prepared([f"{mount}: {size} bytes in {name}"],
                        {"file": name, "size": size, "mount": mount})

    def apply(self, state):
        fd = os.open(state["file"], os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
        try:
            done = _allocate(fd, state["size"])
        finally:
            os.close(fd)
        return {"allocated": done}

    def rollback(self, state):
        try:
            os.unlink(state["file"])
        except FileNotFoundError:
            pass
        except OSError as exc:
            raise FaultError(f"cannot delete {state['file']}: {exc.strerror}") from None
        return None

    def detection(self, args, state=None):
        path = args["path"]
        mount = mount_of(path) if os.path.isdir(path) else "<mount of path>"
        sel = f'{{mountpoint="{mount}"}}'
        return Detection.counter_grows("tracehound_io_write_errors_total" + sel,
                                       "writers on the file system get ENOSPC (write errors); "
                                       "tracehound exports no free-space gauge")


def _allocate(fd: int, size: int) -> int:
    """Preallocate up to size bytes in shrinking chunks: other writers keep
    writing meanwhile, so the last megabytes may already be gone; stop
    when even a page no longer fits."""
    done, chunk = 0, 64 << 20
    while done < size and chunk >= 4096:
        step = min(chunk, size - done)
        try:
            os.posix_fallocate(fd, done, step)
            done += step
        except OSError as exc:
            if exc.errno != errno.ENOSPC:
                raise FaultError(f"fallocate: {exc.strerror}") from None
            chunk //= 2
    return done


class IoErrors(Fault):
    name = "io.errors"
    summary = "make a device-mapper device fail I/O (error target) or flap (flakey)"
    args = {
        "dm_name": Arg(str, "an existing device-mapper device with a linear table",
                       required=True, grammar=names.dm_name),
        "mode": Arg(str, "error: every I/O fails; flakey: up/down cycles", default="error",
                    choices=("error", "flakey")),
        "up_seconds": Arg(int, "flakey: seconds of good I/O per cycle", default=1, minimum=0),
        "down_seconds": Arg(int, "flakey: seconds of failing I/O per cycle", default=1,
                            minimum=1),
        "mountpoint": Arg(str, "where the device is mounted (for the detection query)"),
    }

    def availability(self):
        if not shutil.which("dmsetup"):
            return Availability(False, "dmsetup is not installed")
        if not os.path.exists("/dev/mapper/control"):
            return Availability(False, "no device-mapper in this kernel (/dev/mapper/control "
                                       "is missing)")
        out = subprocess.run(["dmsetup", "targets"], capture_output=True, text=True)
        if out.returncode != 0:
            why = (out.stderr.strip().splitlines() or ["dmsetup targets failed"])[0]
            return Availability(False, f"no device-mapper driver in this kernel ({why})")
        have = {ln.split()[0] for ln in out.stdout.splitlines() if ln.strip()}
        if not {"error", "flakey"} <= have:
            return Availability(False, "the device-mapper error and flakey targets are not "
                                       "both available in this kernel")
        return Availability(True)

    def prepare(self, args, fault_id):
        avail = self.availability()
        if not avail.ok:
            raise FaultError(f"not available here: {avail.reason}")
        table = run_cmd(["dmsetup", "table", args["dm_name"]]).stdout.strip()
        lines = [ln.split() for ln in table.splitlines() if ln.strip()]
        if not lines or any(len(f) != 5 or f[2] != "linear" for f in lines):
            raise FaultError(f"{args['dm_name']}: only linear tables can be wrapped "
                             f"(table: {table!r})")
        new = []
        for start, length, _, dev, offset in lines:
            if args["mode"] == "error":
                new.append(f"{start} {length} error")
            else:
                new.append(f"{start} {length} flakey {dev} {offset} {args['up_seconds']} "
                           f"{args['down_seconds']}")
        return Prepared([f"dm device {args['dm_name']}"],
                        {"name": args["dm_name"], "original": table, "table": "\n".join(new)})

    def apply(self, state):
        _dm_load(state["name"], state["table"])
        return None

    def rollback(self, state):
        current = run_cmd(["dmsetup", "table", state["name"]]).stdout.strip()
        if current != state["original"]:
            _dm_load(state["name"], state["original"])
        return None

    def detection(self, args, state=None):
        sel = f'{{mountpoint="{args["mountpoint"]}"}}' if args.get("mountpoint") else ""
        return Detection.counter_grows("tracehound_io_read_errors_total" + sel,
                                       "reads on the device fail with EIO")


def _dm_load(name: str, table: str) -> None:
    """Swap the table without freezing the file system on it: a freeze
    starts with a sync, which fails over a failing table and, once, after
    one (the block device still holds the write error), and a real disk
    does not wait for a clean file system before it fails either. The
    suspend still waits for I/O in flight, so the swap is atomic."""
    run_cmd(["dmsetup", "suspend", "--nolockfs", name])
    try:
        out = subprocess.run(["dmsetup", "load", name], input=table + "\n", text=True,
                             capture_output=True, timeout=30)
        if out.returncode != 0:
            raise FaultError(f"dmsetup load {name}: {out.stderr.strip()}")
    finally:
        run_cmd(["dmsetup", "resume", name])


FAULTS = [IoThrottle(), IoFill(), IoErrors()]
