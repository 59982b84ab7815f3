"""Writes one io_stats entry per (cgroup, mount) straight into a running
agent's maps, for sizes real I/O would take too long to reach:

    python -m bench.scrape.fill --stats ID [--slots ID --bss ID --next-slot-at OFF]
                                --cgroups PARENT --mnt-ids 101,102

It runs with only the measured tree's src/ on PYTHONPATH: key and value
bytes come from that tree's own layout module, so a baseline agent is filled
in the baseline's layout. That is why this module imports nothing but the
standard library and that layout. Two layouts are known:
  * slotted (io_maps.COUNTERS_AT exists): io_slots maps key -> slot, the
    slot's io_stats value starts with the owner key, and the .bss variable
    next_slot is moved past the slots written;
  * keyed: io_stats is a hash from key to counters.
The map ids come from the caller, which finds them by the agent's pid.
Prints one JSON line with what it wrote.
"""
from __future__ import annotations

import argparse
import ctypes
import errno
import importlib
import json
import os
import platform
import struct
import sys
import time

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


class MapInfo(ctypes.Structure):
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


def open_map(map_id: int) -> tuple[int, MapInfo]:
    fd = bpf(BPF_MAP_GET_FD_BY_ID, _GetFdById(map_id=map_id))
    info = MapInfo()
    try:
        bpf(BPF_OBJ_GET_INFO_BY_FD, _InfoByFd(bpf_fd=fd, info_len=ctypes.sizeof(info),
                                              info=ctypes.addressof(info)))
    except OSError:
        os.close(fd)
        raise
    return fd, info


def layout():
    """The measured tree's io layout: io_maps where it has one, else io."""
    try:
        return importlib.import_module("tracehound.probes.io_maps")
    except ModuleNotFoundError:
        return importlib.import_module("tracehound.probes.io")


def value(io, seed: int) -> bytes:
    """Counters of one entry in the layout of `io`: every read, write and
    fsync call sits in a histogram slot (the kernel counts those calls only
    there), a few opens, some of them not found, now and then an error, so
    each exported family has non-zero samples. Fields a layout lacks are
    left out (a field this does not know fails loudly); in the slotted layout the owner key is not part of it."""
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
              "errors": errors, "not_found": not_found, "lat_sum_ns": lat, "hist": hist,
              # a cold first read of each page brings it into the cache
              "cache_fill": (reads // 2) * 4096}
    packed = io.IO_STATS.pack(*(fields[f.name] for f in io.IO_STATS.fields))
    return packed[getattr(io, "COUNTERS_AT", 0):]


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


def claim_slots(bss_id: int, at: int, n: int, max_entries: int) -> int:
    """Move the probe's next_slot (at byte `at` of its .bss) past n slots and
    return the first. The whole section is read and written back: it holds
    more than next_slot, and the kernel copies value_size bytes both ways."""
    fd, info = open_map(bss_id)
    try:
        zero = ctypes.create_string_buffer(4)
        section = ctypes.create_string_buffer(info.value_size)
        bpf(BPF_MAP_LOOKUP_ELEM, _Elem(map_fd=fd, key=ctypes.addressof(zero),
                                       value=ctypes.addressof(section)))
        base = struct.unpack_from("=Q", section.raw, at)[0]
        if base + n > max_entries:
            raise RuntimeError(f"{n} entries do not fit: {base} of {max_entries} slots are in use")
        struct.pack_into("=Q", section, at, base + n)
        bpf(BPF_MAP_UPDATE_ELEM, _Elem(map_fd=fd, key=ctypes.addressof(zero),
                                       value=ctypes.addressof(section)))
        return base
    finally:
        os.close(fd)


def fill(args) -> dict:
    """One entry per (cgroup, mount). Slots the probe hands out while this
    runs would be overwritten: fill an agent that is otherwise idle."""
    io = layout()
    started = time.monotonic()
    cgroup_ids = sorted(e.inode() for e in os.scandir(args.cgroups) if e.is_dir(follow_symlinks=False))
    mnt_ids = [int(m) for m in args.mnt_ids.split(",") if m]
    n = len(cgroup_ids) * len(mnt_ids)
    stats_fd, info = open_map(args.stats)
    try:
        if info.value_size != io.IO_STATS.size:
            raise RuntimeError(f"io_stats values are {info.value_size} bytes, this tree's "
                               f"layout {io.IO_STATS.size}")
        # a few dozen distinct values are as good as n of them for the exporter
        variants = [value(io, s) for s in range(97)]
        keys = [io.KEY.pack(c, m, 0) for c in cgroup_ids for m in mnt_ids]
        if hasattr(io, "COUNTERS_AT"):
            if args.slots is None or args.bss is None or args.next_slot_at is None:
                raise RuntimeError("this tree's layout is slotted: --slots, --bss and --next-slot-at are needed")
            base = claim_slots(args.bss, args.next_slot_at, n, info.max_entries)
            slots = b"".join(struct.pack("=I", base + i) for i in range(n))
            # each slot's value starts with its owner key
            update(stats_fd, slots, b"".join(k + variants[i % 97] for i, k in enumerate(keys)), n)
            slots_fd, _ = open_map(args.slots)
            try:
                how = update(slots_fd, b"".join(keys), slots, n)
            finally:
                os.close(slots_fd)
            layout_name = "slotted"
        else:
            base, layout_name = None, "keyed"
            how = update(stats_fd, b"".join(keys), b"".join(variants[i % 97] for i in range(n)), n)
    finally:
        os.close(stats_fd)
    return {"max_entries": info.max_entries, "entries": n, "first_slot": base, "layout": layout_name,
            "cgroups": len(cgroup_ids), "mounts": len(mnt_ids), "value_size": info.value_size,
            "update": how, "seconds": round(time.monotonic() - started, 3)}


def main() -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.scrape.fill", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--stats", type=int, required=True, help="id of the agent's io_stats map")
    ap.add_argument("--slots", type=int, help="id of its io_slots map (slotted layout)")
    ap.add_argument("--bss", type=int, help="id of its .bss map (slotted layout)")
    ap.add_argument("--next-slot-at", type=int, help="byte offset of next_slot in .bss")
    ap.add_argument("--cgroups", required=True, help="directory whose subdirectories are the cgroups")
    ap.add_argument("--mnt-ids", required=True, help="comma-separated mount ids")
    print(json.dumps(fill(ap.parse_args())))
    return 0


if __name__ == "__main__":
    sys.exit(main())
