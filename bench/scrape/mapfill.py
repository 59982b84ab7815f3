#!/usr/bin/env python3
"""The workloads of bench/scrape: N cgroups x M private tmpfs mounts, and
two ways to give every (cgroup, mount) pair an entry in a running agent's
io_stats map. Run as root:

    python -m bench.scrape.mapfill io PARENT MOUNT...
        real I/O: one process joins each cgroup under PARENT in turn and
        opens, writes, reads (in every 4th cgroup also fsyncs) a file on
        every mount, then returns to PARENT

Workload.fill writes the entries straight into the agent's maps instead
(bench/scrape/fill.py, in the measured tree's own layout), for sizes real
I/O would take too long to reach.

A cgroup's id is the inode of its directory on cgroup v2; a mount's id is
field 1 of /proc/self/mountinfo, which the agent resolves to its mountpoint.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

from bench.common import REPO
from bench.scrape.fill import open_map
from tracehound.bpf.held import held_ids
from tracehound.host.mounts import MountTable


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
        """The agent's maps found here, written by bench.scrape.fill run with
        TREE's own tracehound (PYTHONPATH) and nothing of this tree's."""
        maps = find_maps(pid)
        cmd = [sys.executable, "-m", "bench.scrape.fill", "--stats", str(maps["io_stats"]),
               "--cgroups", str(self.cg_parent), "--mnt-ids", ",".join(map(str, self.mnt_ids()))]
        if "io_slots" in maps and ".bss" in maps:
            cmd += ["--slots", str(maps["io_slots"]), "--bss", str(maps[".bss"]),
                    "--next-slot-at", str(var_offset(maps[".bss"], ".bss", "next_slot"))]
        out = subprocess.run(cmd, check=True, capture_output=True, text=True, timeout=600, cwd=REPO,
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


def find_maps(pid: int) -> dict[str, int]:
    """The ids of the io maps process `pid` holds, by the holder rather than by
    name alone (another agent's io_stats stays out): io_stats always, io_slots
    and the .bss where the probe's layout is slotted."""
    found: dict[str, list[int]] = {}
    for map_id in sorted(held_ids(pid)["map"]):
        fd, info = open_map(map_id)
        os.close(fd)
        name = info.name.decode()
        # global-data maps are named after the object, e.g. io.bss
        name = ".bss" if name.endswith(".bss") and name.startswith("io") else name
        found.setdefault(name, []).append(map_id)
    if len(found.get("io_stats", [])) != 1:
        raise RuntimeError(f"process {pid} holds {len(found.get('io_stats', []))} maps named io_stats, "
                           "expected 1")
    return {name: ids[0] for name, ids in found.items()
            if name in ("io_stats", "io_slots", ".bss") and len(ids) == 1}


def var_offset(map_id: int, section: str, var: str) -> int:
    """Where `var` sits in a global-data map, from the BTF the map was
    created with (the object file's own DATASEC gives 0 before libbpf lays
    the section out)."""
    btf_id = json.loads(subprocess.run(["bpftool", "-j", "map", "show", "id", str(map_id)],
                                       check=True, capture_output=True, text=True).stdout)["btf_id"]
    dump = subprocess.run(["bpftool", "btf", "dump", "id", str(btf_id)],
                          check=True, capture_output=True, text=True).stdout
    inside = False
    for line in dump.splitlines():
        if line.startswith("["):
            inside = f"DATASEC '{section}'" in line
        elif inside and (m := re.search(r"offset=(\d+) size=\d+ \(VAR '([^']+)'\)", line)):
            if m.group(2) == var:
                return int(m.group(1))
    raise RuntimeError(f"no variable {var} in the {section} of map {map_id}")


def main() -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.scrape.mapfill",
                                 description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="how", required=True)
    io = sub.add_parser("io", help="real I/O from inside every cgroup")
    io.add_argument("parent", help="directory whose subdirectories are the cgroups")
    io.add_argument("mounts", nargs="+")
    args = ap.parse_args()
    return io_worker(args.parent, args.mounts)


if __name__ == "__main__":
    sys.exit(main())
