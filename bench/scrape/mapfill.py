#!/usr/bin/env python3
"""The workloads of bench/scrape: N cgroups x M private tmpfs mounts, and
two ways to give every (cgroup, mount) pair an entry in a running agent's
io_stats map. Run as root:

    python -m bench.scrape.mapfill io PARENT MOUNT...
        real I/O: one process joins each cgroup under PARENT in turn and
        opens, writes, reads (in every 4th cgroup also fsyncs) a file on
        every mount, then returns to PARENT
    python -m bench.scrape.mapfill fill --pid PID --cgroups PARENT --mnt-ids 101,102
        writes the entries straight into the map, for sizes real I/O would
        take too long to reach. PYTHONPATH must point at the tree whose agent
        runs: key and value bytes come from that tree's own
        tracehound.probes.io layout, so a baseline agent is filled in the
        baseline's layout. Prints one JSON line with what it wrote.

A cgroup's id is the inode of its directory on cgroup v2; a mount's id is
field 1 of /proc/self/mountinfo, which the agent resolves to its mountpoint.
"""
from __future__ import annotations

import argparse
import contextlib
import ctypes
import errno
import json
import os
import platform
import struct
import subprocess
import sys
import time
from pathlib import Path

from bench.common import REPO
from tracehound.bpf.held import held_ids
from tracehound.host.mounts import MountTable

# bpf(2) commands, uapi linux/bpf.h
BPF_MAP_LOOKUP_ELEM = 1
BPF_MAP_UPDATE_ELEM = 2
BPF_MAP_GET_FD_BY_ID = 14
BPF_OBJ_GET_INFO_BY_FD = 15
BPF_MAP_UPDATE_BATCH = 26
NR_BPF = {"x86_64": 321, "aarch64": 280}

_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long


class _GetFdById(ctypes.Structure):
    _fields_ = [("map_id", ctypes.c_uint32), ("next_id", ctypes.c_uint32),
                ("open_flags", ctypes.c_uint32)]


class _InfoByFd(ctypes.Structure):
    _fields_ = [("bpf_fd", ctypes.c_uint32), ("info_len", ctypes.c_uint32),
                ("info", ctypes.c_uint64)]


class _MapInfo(ctypes.Structure):
    # the leading part of struct bpf_map_info; the kernel fills what fits
    _fields_ = [("type", ctypes.c_uint32), ("id", ctypes.c_uint32),
                ("key_size", ctypes.c_uint32), ("value_size", ctypes.c_uint32),
                ("max_entries", ctypes.c_uint32), ("map_flags", ctypes.c_uint32),
                ("name", ctypes.c_char * 16)]


class _Batch(ctypes.Structure):
    _fields_ = [("in_batch", ctypes.c_uint64), ("out_batch", ctypes.c_uint64),
                ("keys", ctypes.c_uint64), ("values", ctypes.c_uint64),
                ("count", ctypes.c_uint32), ("map_fd", ctypes.c_uint32),
                ("elem_flags", ctypes.c_uint64), ("flags", ctypes.c_uint64)]


class _Elem(ctypes.Structure):
    _fields_ = [("map_fd", ctypes.c_uint32), ("pad", ctypes.c_uint32),
                ("key", ctypes.c_uint64), ("value", ctypes.c_uint64),
                ("flags", ctypes.c_uint64)]


def bpf(cmd: int, attr: ctypes.Structure) -> int:
    nr = NR_BPF.get(platform.machine())
    if nr is None:
        raise OSError(errno.ENOSYS, f"bpf(2) number unknown on {platform.machine()}")
    ret = _libc.syscall(ctypes.c_long(nr), ctypes.c_long(cmd),
                        ctypes.c_void_p(ctypes.addressof(attr)),
                        ctypes.c_long(ctypes.sizeof(attr)))
    if ret < 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))
    return ret


def remove_cgroup(path: Path, tries: int = 100) -> bool:
    """rmdir, children first; a cgroup stays busy until its last process is reaped."""
    for child in [p for p in path.iterdir() if p.is_dir()] if path.is_dir() else []:
        remove_cgroup(child, tries)
    for _ in range(tries):
        try:
            path.rmdir()
            return True
        except FileNotFoundError:
            return True
        except OSError:
            time.sleep(0.05)
    print(f"left cgroup {path} behind", file=sys.stderr)
    return False


def unmount_under(top: Path) -> None:
    """Whatever is still mounted below `top`, deepest first, before it is deleted."""
    for m in sorted(MountTable().mounts, key=lambda m: -len(m.mountpoint)):
        if m.mountpoint.startswith(f"{top}/"):
            subprocess.run(["umount", "-l", m.mountpoint], capture_output=True)


class Workload:
    """N cgroups under the bench parent and M tmpfs mounts, for one size."""

    def __init__(self, cg_parent: Path, tmp: Path, n: int, m: int):
        self.cg_parent, self.n, self.m = cg_parent, n, m
        self.mounts = [tmp / f"m{j}" for j in range(m)]

    def __enter__(self) -> "Workload":
        self.cg_parent.mkdir(exist_ok=True)
        for i in range(1, self.n + 1):
            (self.cg_parent / f"c{i:05d}").mkdir()
        for mnt in self.mounts:
            mnt.mkdir(exist_ok=True)
            subprocess.run(["mount", "-t", "tmpfs", "-o", "size=16m,mode=0700", "thbench", str(mnt)],
                           check=True, capture_output=True)
        return self

    def mnt_ids(self) -> list[int]:
        table = {m.mountpoint: m.mnt_id for m in MountTable().mounts}
        return [table[str(p)] for p in self.mounts]

    def __exit__(self, *exc) -> None:
        for mnt in self.mounts:
            subprocess.run(["umount", "-l", str(mnt)], capture_output=True)
            with contextlib.suppress(OSError):
                mnt.rmdir()
        remove_cgroup(self.cg_parent)

    def drive_io(self) -> dict:
        """Real I/O from a process of its own: the caller stays in its cgroup."""
        t0 = time.monotonic()
        subprocess.run([sys.executable, "-m", "bench.scrape.mapfill", "io", str(self.cg_parent),
                        *map(str, self.mounts)], check=True, capture_output=True, text=True,
                       timeout=600, cwd=REPO)
        return {"how": "real I/O", "seconds": round(time.monotonic() - t0, 3)}

    def fill(self, tree: Path, pid: int) -> dict:
        # this tree's bench (cwd) with TREE's own tracehound (PYTHONPATH)
        out = subprocess.run([sys.executable, "-m", "bench.scrape.mapfill", "fill", "--pid", str(pid),
                              "--cgroups", str(self.cg_parent),
                              "--mnt-ids", ",".join(map(str, self.mnt_ids()))],
                             check=True, capture_output=True, text=True, timeout=600, cwd=REPO,
                             env=dict(os.environ, PYTHONPATH=str(tree / "src")))
        return {"how": "map fill", **json.loads(out.stdout)}


def io_worker(parent: str, mounts: list[str]) -> int:
    """Join each cgroup in turn and touch every mount from inside it; end in
    the parent so no child is left holding a process."""
    me, data = str(os.getpid()).encode(), os.urandom(4096)

    def join(cg: str) -> None:
        fd = os.open(f"{cg}/cgroup.procs", os.O_WRONLY)
        try:
            os.write(fd, me)
        finally:
            os.close(fd)
    for i, cg in enumerate(sorted(e.path for e in os.scandir(parent) if e.is_dir())):
        join(cg)
        for mnt in mounts:
            fd = os.open(f"{mnt}/data", os.O_RDWR | os.O_CREAT, 0o600)
            os.pwrite(fd, data, 0)
            os.pread(fd, len(data), 0)
            if i % 4 == 0:
                os.fsync(fd)
            os.close(fd)
    join(parent)
    return 0


def open_map(map_id: int) -> tuple[int, _MapInfo]:
    fd = bpf(BPF_MAP_GET_FD_BY_ID, _GetFdById(map_id=map_id))
    info = _MapInfo()
    try:
        bpf(BPF_OBJ_GET_INFO_BY_FD, _InfoByFd(bpf_fd=fd, info_len=ctypes.sizeof(info),
                                              info=ctypes.addressof(info)))
    except OSError:
        os.close(fd)
        raise
    return fd, info


def find_map(pid: int, name: str, suffix: bool = False) -> tuple[int, _MapInfo]:
    """`suffix`: match the end of the kernel's name (global-data maps are
    named after the object, e.g. io.bss)."""
    found = []
    # by the holder, not by name alone: another agent's io_stats stays out
    for map_id in sorted(held_ids(pid)["map"]):
        fd, info = open_map(map_id)
        got = info.name.decode()
        if got == name or (suffix and got.endswith(name)):
            found.append((fd, info))
        else:
            os.close(fd)
    if len(found) != 1:
        for fd, _ in found:
            os.close(fd)
        raise RuntimeError(f"process {pid} holds {len(found)} maps named {name}, expected 1")
    return found[0]


def value(io, seed: int) -> bytes:
    """Counters of one entry in the layout of `io` (a tracehound.probes.io):
    every read, write and fsync call sits in a histogram slot (the kernel
    counts those calls only there), a few opens, some of them not found, now and then an error, so
    each exported family has non-zero samples."""
    ops, hists, slots = io.OPS, io.HISTS, io.HIST_SLOTS
    reads, writes = 1 + seed % 53, 1 + seed % 29
    fsyncs = 1 + seed % 3 if seed % 4 == 0 else 0
    calls, errors = [0] * len(ops), [0] * len(ops)
    calls[ops.index("open")] = 1 + seed % 5 + (seed % 17 == 0)
    calls[ops.index("create")] = seed % 2
    errors[ops.index("open")] = int(seed % 17 == 0)
    not_found = [0] * len(ops)
    not_found[ops.index("open")] = seed % 7
    hist, lat = [0] * (len(hists) * slots), [0] * len(hists)
    for h, (n, slot) in enumerate(((reads, 10 + seed % 4), (writes, 12 + seed % 5),
                                   (fsyncs, 17 + seed % 4))):
        # spread over two neighbouring slots, as real latencies are
        hist[h * slots + slot], hist[h * slots + slot + 1] = n - n // 3, n // 3
        lat[h] = (n - n // 3) * 3 * 2 ** (slot - 1) + (n // 3) * 3 * 2 ** slot
    fields = {"owner": b"", "bytes": (reads * 4096, writes * 4096), "calls": calls,
              "errors": errors, "not_found": not_found, "lat_sum_ns": lat, "hist": hist}
    # the counters only: each slot gets its own key in front
    return io.IO_STATS.pack(*(fields[f.name] for f in io.IO_STATS.fields))[io.COUNTERS_AT:]


def update(fd: int, keys: bytes, values: bytes, n: int, chunk: int = 4096) -> str:
    """Write n packed entries: batched where the kernel takes it (5.6+),
    else one bpf() call per entry."""
    ks, vs = len(keys) // n, len(values) // n
    kbuf = ctypes.create_string_buffer(keys, len(keys))
    vbuf = ctypes.create_string_buffer(values, len(values))
    base_k, base_v = ctypes.addressof(kbuf), ctypes.addressof(vbuf)
    done = 0
    try:
        while done < n:
            attr = _Batch(keys=base_k + done * ks, values=base_v + done * vs,
                          count=min(chunk, n - done), map_fd=fd)
            bpf(BPF_MAP_UPDATE_BATCH, attr)
            done += attr.count
        return "batch"
    except OSError as e:
        if done or e.errno not in (errno.EINVAL, errno.ENOTSUP, 524):
            raise
    for i in range(n):
        bpf(BPF_MAP_UPDATE_ELEM, _Elem(map_fd=fd, key=base_k + i * ks, value=base_v + i * vs))
    return "per-key"


def fill_map(args) -> dict:
    """Register one slot per (cgroup, mount) the way the probe's new_slot
    does: counters (owner key first) in io_stats, key -> slot in io_slots,
    and next_slot moved past them. Slots the probe hands out while this runs
    would be overwritten: fill an agent that is otherwise idle."""
    # imported here: the tree under test is on PYTHONPATH only in this process
    from tracehound.probes import io_maps as io
    started = time.monotonic()
    cgroup_ids = sorted(e.inode() for e in os.scandir(args.cgroups) if e.is_dir(follow_symlinks=False))
    mnt_ids = [int(m) for m in args.mnt_ids.split(",") if m]
    fds = []
    try:
        stats_fd, info = find_map(args.pid, "io_stats")
        fds.append(stats_fd)
        slots_fd, _ = find_map(args.pid, "io_slots")
        fds.append(slots_fd)
        bss_fd, _ = find_map(args.pid, ".bss", suffix=True)
        fds.append(bss_fd)
        if info.value_size != io.IO_STATS.size:
            raise RuntimeError(f"io_stats values are {info.value_size} bytes, this tree's "
                               f"layout {io.IO_STATS.size}")
        zero = struct.pack("=I", 0)
        key, next_slot = ctypes.create_string_buffer(zero, 4), ctypes.create_string_buffer(8)
        bpf(BPF_MAP_LOOKUP_ELEM, _Elem(map_fd=bss_fd, key=ctypes.addressof(key),
                                       value=ctypes.addressof(next_slot)))
        base = struct.unpack("=Q", next_slot.raw)[0]
        n = len(cgroup_ids) * len(mnt_ids)
        if base + n > info.max_entries:
            raise RuntimeError(f"{n} entries do not fit: {base} of {info.max_entries} slots "
                               "are in use")
        update(bss_fd, zero, struct.pack("=Q", base + n), 1)
        # a few dozen distinct values are as good as n of them for the exporter
        variants = [value(io, s) for s in range(97)]
        keys = [io.KEY.pack(c, m, 0) for c in cgroup_ids for m in mnt_ids]
        slots = b"".join(struct.pack("=I", base + i) for i in range(n))
        update(stats_fd, slots, b"".join(k + variants[i % 97] for i, k in enumerate(keys)), n)
        how = update(slots_fd, b"".join(keys), slots, n)
    finally:
        for fd in fds:
            os.close(fd)
    return {"max_entries": info.max_entries, "entries": n, "first_slot": base,
            "cgroups": len(cgroup_ids), "mounts": len(mnt_ids), "value_size": info.value_size,
            "update": how, "seconds": round(time.monotonic() - started, 3)}


def main() -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.scrape.mapfill",
                                 description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="how", required=True)
    io = sub.add_parser("io", help="real I/O from inside every cgroup")
    io.add_argument("parent", help="directory whose subdirectories are the cgroups")
    io.add_argument("mounts", nargs="+")
    fill = sub.add_parser("fill", help="write the entries into the agent's map")
    fill.add_argument("--pid", type=int, required=True, help="the agent's process")
    fill.add_argument("--cgroups", required=True, help="directory whose subdirectories are the cgroups")
    fill.add_argument("--mnt-ids", required=True, help="comma-separated mount ids")
    args = ap.parse_args()
    if args.how == "io":
        return io_worker(args.parent, args.mounts)
    print(json.dumps(fill_map(args)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
