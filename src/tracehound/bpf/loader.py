"""Typed wrappers over libbpf objects: BpfObject, Program, Map, Link.

Errors say which program, which hook and why (errno and the tail of the
verifier log), in the spirit of cilium/ebpf.
"""
from __future__ import annotations

import ctypes
import errno as errno_mod
import mmap
import os
import sys
from typing import Iterator

from ..errors import ProbeError, TracehoundError
from . import libbpf


def _log_excerpt(log: str, program: str | None = None, lines: int = 25) -> str:
    """The part of libbpf's output that explains a failure, kept short."""
    rows = [r for r in log.splitlines() if r.strip()]
    if program:
        mine = [i for i, r in enumerate(rows) if f"'{program}'" in r]
        if mine:
            start = max(0, mine[0] - lines)
            rows = rows[start:mine[-1] + 1]
    return "\n".join("    " + r for r in rows[-lines:])


class Program:
    def __init__(self, obj: "BpfObject", ptr: int):
        self._obj = obj
        self._ptr = ptr
        lb = libbpf.lib()
        self.name: str = lb.bpf_program__name(ptr).decode()
        self.section: str = lb.bpf_program__section_name(ptr).decode()
        self._target: str | None = None

    @property
    def hook(self) -> str:
        """Human name of the attach point, e.g. 'fentry/vfs_read'."""
        return self._hook_for(self._target) if self._target else self.section

    def _hook_for(self, function: str) -> str:
        return f"{self.section.split('/', 1)[0]}/{function}"

    @property
    def autoload(self) -> bool:
        return bool(libbpf.lib().bpf_program__autoload(self._ptr))

    @autoload.setter
    def autoload(self, value: bool) -> None:
        libbpf.lib().bpf_program__set_autoload(self._ptr, bool(value))

    def set_attach_target(self, function: str) -> None:
        ret = libbpf.lib().bpf_program__set_attach_target(self._ptr, 0, function.encode())
        if ret < 0:
            err = libbpf.errno_of(ret)
            why = "no such function in the kernel's BTF" if err == errno_mod.ESRCH else \
                "cannot retarget"
            raise ProbeError(self.name, self._hook_for(function),
                             f"{why}: {libbpf.strerror(err)}")
        self._target = function

    @property
    def fd(self) -> int:
        return libbpf.lib().bpf_program__fd(self._ptr)

    def attach(self) -> "Link":
        lb = libbpf.lib()
        ctypes.set_errno(0)
        link = lb.bpf_program__attach(self._ptr)
        if not link:
            err = libbpf.errno_of()
            raise ProbeError(self.name, self.hook, "attach failed: " + libbpf.strerror(err),
                             _log_excerpt(libbpf.take_log(), self.name, 8))
        return Link(link, self)

    def attach_uprobe(self, path: str, offset: int, retprobe: bool = False) -> "Link":
        """Attach to the function at file `offset` of `path`, in every process."""
        lb = libbpf.lib()
        ctypes.set_errno(0)
        link = lb.bpf_program__attach_uprobe(self._ptr, retprobe, -1, os.fsencode(path), offset)
        if not link:
            err = libbpf.errno_of()
            hook = f"{'uretprobe' if retprobe else 'uprobe'}/{path}:{offset:#x}"
            raise ProbeError(self.name, hook, "attach failed: " + libbpf.strerror(err),
                             _log_excerpt(libbpf.take_log(), self.name, 8))
        return Link(link, self)


class Link:
    def __init__(self, ptr: int, program: Program):
        self._ptr = ptr
        self.program = program

    def destroy(self) -> None:
        if self._ptr:
            libbpf.lib().bpf_link__destroy(self._ptr)
            self._ptr = None


class Map:
    def __init__(self, name: str, ptr: int):
        lb = libbpf.lib()
        self.name = name
        self._ptr = ptr
        self._fd: int | None = None
        self.key_size = lb.bpf_map__key_size(ptr)
        self.value_size = lb.bpf_map__value_size(ptr)
        self._batch_ok = True

    @classmethod
    def from_fd(cls, name: str, fd: int, key_size: int, value_size: int) -> "Map":
        """A map this process did not load (a pinned one, opened by path)."""
        self = cls.__new__(cls)
        self.name, self._ptr, self._fd = name, None, fd
        self.key_size, self.value_size = key_size, value_size
        self._batch_ok = True
        return self

    @property
    def fd(self) -> int:
        if self._fd is not None:
            return self._fd
        return libbpf.lib().bpf_map__fd(self._ptr)

    def set_max_entries(self, n: int) -> None:
        ret = libbpf.lib().bpf_map__set_max_entries(self._ptr, n)
        if ret < 0:
            raise TracehoundError(f"map {self.name}: cannot set max_entries={n}: "
                                  + libbpf.strerror(libbpf.errno_of(ret)))

    @property
    def stride(self) -> int:
        """Bytes between consecutive values of an array map in memory."""
        return (self.value_size + 7) & ~7

    def memory(self) -> mmap.mmap:
        """A loaded array map created with BPF_F_MMAPABLE, mapped read-only:
        values are read without a system call each. Close it before the
        object: the mapping keeps the map alive."""
        n = libbpf.lib().bpf_map__max_entries(self._ptr)
        try:
            return mmap.mmap(self.fd, self.stride * n, mmap.MAP_SHARED, mmap.PROT_READ)
        except OSError as e:
            raise TracehoundError(f"map {self.name}: cannot map its memory: "
                                  f"{os.strerror(e.errno)}") from None

    def push(self, value: bytes) -> None:
        """Add a value to a queue or stack map."""
        ret = libbpf.lib().bpf_map_update_elem(self.fd, None, value, 0)
        if ret < 0:
            raise TracehoundError(f"map {self.name}: push failed: "
                                  + libbpf.strerror(libbpf.errno_of(ret)))

    def set_initial_value(self, data: bytes) -> None:
        """Contents of a global-data map (.rodata.*, .data.*) at load; before
        load only, and exactly the section's size."""
        ret = libbpf.lib().bpf_map__set_initial_value(self._ptr, data, len(data))
        if ret < 0:
            raise TracehoundError(f"map {self.name}: cannot set its {len(data)}-byte initial "
                                  f"value: " + libbpf.strerror(libbpf.errno_of(ret)))

    def update(self, key: bytes, value: bytes, flags: int = 0) -> None:
        ret = libbpf.lib().bpf_map_update_elem(self.fd, key, value, flags)
        if ret < 0:
            raise TracehoundError(f"map {self.name}: update failed: "
                                  + libbpf.strerror(libbpf.errno_of(ret)))

    def lookup(self, key: bytes) -> bytes | None:
        buf = ctypes.create_string_buffer(self.value_size)
        ret = libbpf.lib().bpf_map_lookup_elem(self.fd, key, buf)
        if ret < 0:
            return None
        return buf.raw

    def lookup_percpu(self, key: bytes) -> list[bytes]:
        """Per-CPU map: each possible CPU's value (the kernel pads each to 8
        bytes); [] when the key is absent."""
        ncpu = libbpf.lib().libbpf_num_possible_cpus()
        stride = (self.value_size + 7) & ~7
        buf = ctypes.create_string_buffer(stride * ncpu)
        if libbpf.lib().bpf_map_lookup_elem(self.fd, key, buf) < 0:
            return []
        raw = buf.raw
        return [raw[i * stride:i * stride + self.value_size] for i in range(ncpu)]

    def lookup_percpu_u64(self, key: bytes) -> list[int]:
        """Per-CPU map with u64 values: one value per possible CPU."""
        return [int.from_bytes(v[:8], sys.byteorder) for v in self.lookup_percpu(key)]

    def delete(self, key: bytes) -> bool:
        return libbpf.lib().bpf_map_delete_elem(self.fd, key) == 0

    def keys(self) -> Iterator[bytes]:
        lb = libbpf.lib()
        prev = None
        nxt = ctypes.create_string_buffer(self.key_size)
        while lb.bpf_map_get_next_key(self.fd, prev, nxt) == 0:
            yield nxt.raw
            prev = ctypes.create_string_buffer(nxt.raw, self.key_size)

    def items(self, chunk: int = 1024) -> list[tuple[bytes, bytes]]:
        """All (key, value) pairs, with batch lookups where the kernel has them."""
        return list(self.iter_items(chunk))

    def iter_items(self, chunk: int = 1024) -> Iterator[tuple[bytes, bytes]]:
        """(key, value) pairs one batch at a time, so a reader that decodes
        as it goes never holds the whole map's raw bytes at once."""
        if self._batch_ok:
            try:
                yield from self._items_batch(chunk)
                return
            except _NoBatch:
                self._batch_ok = False
        for k in self.keys():
            v = self.lookup(k)
            if v is not None:
                yield k, v

    def _items_batch(self, chunk: int) -> Iterator[tuple[bytes, bytes]]:
        lb = libbpf.lib()
        ks, vs = self.key_size, self.value_size
        keys = ctypes.create_string_buffer(ks * chunk)
        values = ctypes.create_string_buffer(vs * chunk)
        # Hash maps use a bucket index as the batch token; 8 bytes covers all.
        token_in = ctypes.create_string_buffer(max(8, ks))
        token_out = ctypes.create_string_buffer(max(8, ks))
        first = True
        while True:
            count = ctypes.c_uint32(chunk)
            ret = lb.bpf_map_lookup_batch(self.fd, None if first else token_in, token_out,
                                          keys, values, ctypes.byref(count), None)
            err = libbpf.errno_of(ret) if ret < 0 else 0
            if ret < 0 and err not in (errno_mod.ENOENT,):
                if first and err in (errno_mod.EINVAL, errno_mod.ENOTSUP, 524):
                    raise _NoBatch()
                if err == errno_mod.ENOSPC:  # bucket bigger than chunk
                    chunk *= 2
                    keys = ctypes.create_string_buffer(ks * chunk)
                    values = ctypes.create_string_buffer(vs * chunk)
                    continue
                raise TracehoundError(f"map {self.name}: batch lookup failed: "
                                      + libbpf.strerror(err))
            kraw, vraw = keys.raw, values.raw
            # a no-batch kernel fails the first call, before anything is yielded
            first = False
            for i in range(count.value):
                yield kraw[i * ks:(i + 1) * ks], vraw[i * vs:(i + 1) * vs]
            if ret < 0:  # ENOENT: that was the last batch
                return
            ctypes.memmove(token_in, token_out, len(token_out))


class _NoBatch(Exception):
    pass


class BpfObject:
    """One compiled .bpf.o: its programs, maps and the links attached."""

    def __init__(self, path: str):
        if not os.path.exists(path):
            raise TracehoundError(f"probe object {path} is missing: reinstall tracehound "
                                  "(pip install .) so the BPF probes are built")
        lb = libbpf.lib()
        libbpf.take_log()
        ctypes.set_errno(0)
        self._ptr = lb.bpf_object__open_file(os.fsencode(path), None)
        if not self._ptr:
            raise TracehoundError(f"cannot open BPF object {path}: "
                                  + libbpf.strerror(libbpf.errno_of()))
        self.path = path
        self.programs: dict[str, Program] = {}
        p = lb.bpf_object__next_program(self._ptr, None)
        while p:
            prog = Program(self, p)
            self.programs[prog.name] = prog
            p = lb.bpf_object__next_program(self._ptr, p)
        self.links: list[Link] = []
        self.loaded = False

    def map(self, name: str) -> Map:
        ptr = libbpf.lib().bpf_object__find_map_by_name(self._ptr, name.encode())
        if not ptr:
            raise TracehoundError(f"{self.path}: no map named {name}")
        return Map(name, ptr)

    def load(self) -> None:
        libbpf.take_log()
        ret = libbpf.lib().bpf_object__load(self._ptr)
        if ret < 0:
            err = libbpf.errno_of(ret)
            log = libbpf.take_log()
            failed = _failed_program(log, [p for p in self.programs.values() if p.autoload])
            name = failed.name if failed else os.path.basename(self.path)
            hook = failed.hook if failed else "load"
            raise ProbeError(name, hook, "load failed: " + libbpf.strerror(err),
                             _log_excerpt(log, failed.name if failed else None))
        self.loaded = True

    def attach_all(self) -> None:
        """Every loaded program whose section names its hook; uprobes name no
        file and are attached by their probe (Program.attach_uprobe)."""
        for prog in self.programs.values():
            if prog.autoload and prog.section not in ("uprobe", "uretprobe"):
                self.links.append(prog.attach())

    def close(self) -> None:
        for link in self.links:
            link.destroy()
        self.links.clear()
        if self._ptr:
            libbpf.lib().bpf_object__close(self._ptr)
            self._ptr = None

    def __enter__(self) -> "BpfObject":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _failed_program(log: str, candidates: list[Program]) -> Program | None:
    """libbpf names the program it failed on as prog 'name': find it."""
    for line in reversed(log.splitlines()):
        for prog in candidates:
            if f"prog '{prog.name}'" in line and ("fail" in line or "error" in line.lower()):
                return prog
    return None
