"""Where the application probe attaches: libibverbs files and their verbs.

uprobes attach to a file (its inode), not to a name, so every distinct
libibverbs on the node needs its own set: the system's, found through the
dynamic loader's cache, and each copy a running process has mapped from
another mount namespace (a container image's rdma-core), opened through
/proc/PID/root. Offsets come from the library's own dynamic symbol table:
the default version of each verb (``ibv_reg_mr@@IBVERBS_1.1``), the one
every program linked since rdma-core 1.1 calls.

Not covered, and said so in the docs: programs linked statically against
libibverbs, the 1.0 compatibility symbols, extended verbs that are inline
in <infiniband/verbs.h> and call the provider directly (ibv_create_qp_ex,
ibv_create_cq_ex), and provider-specific verbs (mlx5dv_*).
"""
from __future__ import annotations

import logging
import os
import re
import subprocess
import time
from dataclasses import dataclass

from elftools.common.exceptions import ELFError
from elftools.elf.elffile import ELFFile

from ..errors import TracehoundError

log = logging.getLogger(__name__)

SONAME = "libibverbs.so.1"
# each has an entry (up_<verb>) and a return (ur_<verb>) program in rdma_app.bpf.h
VERBS = ("ibv_open_device", "ibv_close_device", "ibv_alloc_pd", "ibv_dealloc_pd",
         "ibv_create_cq", "ibv_destroy_cq", "ibv_create_qp", "ibv_destroy_qp",
         "ibv_create_srq", "ibv_destroy_srq", "ibv_reg_mr", "ibv_reg_mr_iova",
         "ibv_reg_mr_iova2", "ibv_dereg_mr", "ibv_modify_qp")
# verbs added to rdma-core later than the others: absent from old libraries
OPTIONAL_VERBS = frozenset({"ibv_reg_mr_iova", "ibv_reg_mr_iova2"})
_HIDDEN = 0x8000                 # versym bit of a non-default (compatibility) version
_MAPS_LINE = re.compile(rb"^\S+ \S+ \S+ \S+ \d+ +(/.*libibverbs\.so[.\d]*)(?: \(deleted\))?$")
MAX_MAPS_BYTES = 4 << 20


@dataclass(frozen=True)
class Library:
    path: str                    # as this process can open it
    dev: int
    ino: int
    offsets: dict                # verb -> file offset of its default version


class LibraryError(Exception):
    pass


def file_offsets(path: str, verbs=VERBS) -> dict[str, int]:
    """verb -> file offset of its default-version definition in `path`."""
    wanted = set(verbs)
    found: dict[str, int] = {}
    try:
        with open(path, "rb") as f:
            elf = ELFFile(f)
            dynsym = elf.get_section_by_name(".dynsym")
            versym = elf.get_section_by_name(".gnu.version")
            if dynsym is None:
                raise LibraryError(f"{path} has no dynamic symbol table")
            loads = [s for s in elf.iter_segments() if s["p_type"] == "PT_LOAD"]
            for i, sym in enumerate(dynsym.iter_symbols()):
                if sym.name not in wanted or sym["st_info"]["type"] != "STT_FUNC" \
                        or sym["st_shndx"] == "SHN_UNDEF":
                    continue
                ndx = versym.get_symbol(i).entry["ndx"] if versym is not None else 1
                if isinstance(ndx, int) and ndx & _HIDDEN:
                    continue
                addr = sym["st_value"]
                seg = next((s for s in loads
                            if s["p_vaddr"] <= addr < s["p_vaddr"] + s["p_memsz"]), None)
                if seg is not None:
                    found[sym.name] = addr - seg["p_vaddr"] + seg["p_offset"]
    except (OSError, ELFError, ValueError) as exc:
        raise LibraryError(f"cannot read {path}: {exc}") from None
    missing = wanted - set(found) - OPTIONAL_VERBS
    if missing:
        raise LibraryError(f"{path} lacks {', '.join(sorted(missing))}: not a libibverbs 1.1+")
    return found


def library(path: str) -> Library:
    try:
        st = os.stat(path)
    except OSError as exc:
        raise LibraryError(f"cannot open {path}: {exc.strerror}") from None
    return Library(path, st.st_dev, st.st_ino, file_offsets(path))


def system_library() -> str | None:
    """The path the dynamic loader resolves libibverbs.so.1 to, on this host."""
    try:
        out = subprocess.run(["ldconfig", "-p"], capture_output=True, text=True, timeout=10,
                             check=False).stdout
    except (OSError, subprocess.SubprocessError):
        out = ""
    for line in out.splitlines():
        name, _, rest = line.strip().partition(" ")
        if name == SONAME and "=>" in rest:
            path = rest.rsplit("=>", 1)[1].strip()
            if os.path.exists(path):
                return os.path.realpath(path)
    for d in ("/usr/lib/x86_64-linux-gnu", "/usr/lib64", "/usr/lib", "/lib64", "/lib"):
        path = os.path.join(d, SONAME)
        if os.path.exists(path):
            return os.path.realpath(path)
    return None


def mapped_by(pid: int, proc: str = "/proc") -> set[str]:
    """libibverbs files process `pid` has mapped, as paths this process can
    open (through its root, so a container's copy is found)."""
    try:
        with open(f"{proc}/{pid}/maps", "rb") as f:
            text = f.read(MAX_MAPS_BYTES)
    except OSError:
        return set()
    paths = set()
    for line in text.splitlines():
        m = _MAPS_LINE.match(line)
        if m:
            inner = m.group(1).decode(errors="surrogateescape")
            paths.add(f"{proc}/{pid}/root{inner}")
    return paths


def mapping_processes(proc: str = "/proc") -> dict[int, set[str]]:
    """pid -> libibverbs paths, for every process that has one mapped."""
    out = {}
    for name in os.listdir(proc):
        if name.isdigit():
            paths = mapped_by(int(name), proc)
            if paths:
                out[int(name)] = paths
    return out


class Attachments:
    """The libibverbs files the application probe is attached to, one set of
    uprobes per inode whatever path names it, and those that were refused."""

    def __init__(self):
        self.libraries: dict[tuple[int, int], Library] = {}
        self.refused: dict[tuple[int, int], str] = {}
        self.since_ns = 0            # CLOCK_MONOTONIC of the first attach

    def attach(self, obj, paths) -> list[str]:
        """Attach `obj`'s up_/ur_ programs to each new library; returns the
        paths attached now."""
        added = []
        for path in sorted(paths):
            try:
                st = os.stat(path)
            except OSError:
                continue
            ident = (st.st_dev, st.st_ino)
            if ident in self.libraries or ident in self.refused:
                continue
            try:
                lib = library(path)
                _attach(obj, lib)
            except (LibraryError, TracehoundError) as exc:
                self.refused[ident] = str(exc).splitlines()[0]
                log.warning("rdma probe: no application view through %s: %s", path,
                            self.refused[ident])
                continue
            self.libraries[ident] = lib
            self.since_ns = self.since_ns or time.monotonic_ns()
            added.append(path)
            log.info("rdma probe: application view through %s (%d verbs)", path, len(lib.offsets))
        return added

    def why_none(self) -> str:
        return "; ".join(sorted(set(self.refused.values()))) or \
            f"no {SONAME} on this host or in any process"


def _attach(obj, lib: Library) -> None:
    links = []
    try:
        for verb, offset in lib.offsets.items():
            for side, ret in (("up", False), ("ur", True)):
                links.append(obj.programs[f"{side}_{verb}"].attach_uprobe(lib.path, offset,
                                                                           retprobe=ret))
    except BaseException:
        for link in links:
            link.destroy()
        raise
    obj.links.extend(links)
