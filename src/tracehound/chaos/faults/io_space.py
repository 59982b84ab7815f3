"""I/O faults on storage itself: a full file system, failing block I/O
(device-mapper's error and flakey targets)."""
from __future__ import annotations

import errno
import os
import shutil
import subprocess

from . import Arg, Availability, Detection, Fault, FaultError, Prepared, names
from .targets import run_cmd


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


# how long a suspend, load or resume may take: a suspend waits out the I/O in
# flight and a busy node's resume waits its turn; past this the device's own
# state says whether it was done
DM_WAIT_S = 120


def _dm_load(name: str, table: str) -> None:
    """Swap the table without freezing the file system on it: a freeze
    starts with a sync, which fails over a failing table and, once, after
    one (the block device still holds the write error), and a real disk
    does not wait for a clean file system before it fails either. The
    suspend still waits for I/O in flight, so the swap is atomic. Neither
    waits for udev's rules (--noudevsync): the device keeps its name and
    node, and on a busy node udev's probe of it can take long."""
    run_cmd(["dmsetup", "suspend", "--nolockfs", "--noudevsync", name], timeout=DM_WAIT_S)
    try:
        out = subprocess.run(["dmsetup", "load", name], input=table + "\n", text=True,
                             capture_output=True, timeout=DM_WAIT_S)
        if out.returncode != 0:
            raise FaultError(f"dmsetup load {name}: {out.stderr.strip()}")
    finally:
        _resume(name)


def _resume(name: str) -> None:
    """Resume NAME; a resume that outlived its wait may still have been done
    (the kernel finishes the call): only a device still suspended fails."""
    try:
        run_cmd(["dmsetup", "resume", "--noudevsync", name], timeout=DM_WAIT_S)
    except FaultError:
        if _dm_state(name) != "ACTIVE":
            raise


def _dm_state(name: str) -> str | None:
    """ACTIVE or SUSPENDED, as `dmsetup info` says; None if it cannot say."""
    try:
        out = run_cmd(["dmsetup", "info", name])
    except FaultError:
        return None
    for line in out.stdout.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "State" and value.split():
            return value.split()[0]         # "ACTIVE (READ-ONLY)" is active
    return None


FAULTS = [IoFill(), IoErrors()]
