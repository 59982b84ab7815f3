"""Where the application probe attaches: libibverbs files and their verbs.

uprobes attach to a file (its inode), not to a name, so every distinct
libibverbs on the node needs its own set: the system's, found through the
dynamic loader's cache, and each copy a running process has mapped from
another mount namespace (a container image's rdma-core), opened through
/proc/PID/root. Those files are data a container user controls: each is
opened only as a regular file inside the process's own root, only if it is
the inode the process maps, opened and read on a thread of its own for a
bounded time (BoundedOpener), and parsed within bounds (elf_exports.py);
one that cannot be used is refused with its reason, and the scan goes on
within its time budget. Offsets come from the library's own dynamic symbol table:
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
import threading
import time
from dataclasses import dataclass, replace

from ..errors import TracehoundError
from ..host.rooted_open import OVERLAYFS, RootedOpenError, fs_type, open_regular
from ..regular_file import read_upto
from .elf_exports import LIMITS as ELF_LIMITS, ElfOverBudget, ElfRefused, default_function_offsets

log = logging.getLogger(__name__)

SONAME = "libibverbs.so.1"
# each has an entry (up_<verb>) and a return (ur_<verb>) program in rdma_app.bpf.h
VERBS = ("ibv_open_device", "ibv_close_device", "ibv_alloc_pd", "ibv_dealloc_pd",
         "ibv_create_cq", "ibv_destroy_cq", "ibv_create_qp", "ibv_destroy_qp",
         "ibv_create_srq", "ibv_destroy_srq", "ibv_reg_mr", "ibv_reg_mr_iova",
         "ibv_reg_mr_iova2", "ibv_dereg_mr", "ibv_modify_qp")
# verbs added to rdma-core later than the others: absent from old libraries
OPTIONAL_VERBS = frozenset({"ibv_reg_mr_iova", "ibv_reg_mr_iova2"})
_MAPS_LINE = re.compile(rb"^([0-9a-f]+-[0-9a-f]+) \S+ \S+ ([0-9a-f]+):([0-9a-f]+) (\d+) +"
                        rb"(/.*libibverbs\.so[.\d]*)(?: \(deleted\))?$")
MAX_MAPS_BYTES = 4 << 20
MAX_LIBRARIES = 32               # distinct files; each costs 30 uprobes
MAX_REFUSALS_KEPT = 1024         # beyond, a refusal is counted and may be tried again
SCAN_BUDGET_S = 5.0              # one scan's wall-clock time; what is left waits for the next
OPEN_TIMEOUT_S = 2.0             # opening and reading one file (a local file takes milliseconds)
PARSE_TRIES = 3                  # parses of one file over its CPU budget, each with twice the last


@dataclass(frozen=True)
class Candidate:
    """A libibverbs file to look at: `path` resolved inside `root`, and the
    inode a process maps there when it came from that process's maps."""
    root: str                    # "/" (this host) or /proc/PID/root
    path: bytes
    dev: int | None = None
    ino: int | None = None
    mapped_as: str | None = None  # /proc/PID/map_files/START-END: the mapped file itself

    @property
    def name(self) -> str:
        """As an operator reads it (bytes that are not UTF-8 shown as U+FFFD)."""
        inside = self.path.decode(errors="replace")
        return inside if self.root == "/" else self.root + inside


@dataclass(frozen=True)
class Library:
    path: str                    # Candidate.name
    dev: int
    ino: int
    offsets: dict                # verb -> file offset of its default version


class LibraryError(Exception):
    pass


class ParseOverBudget(LibraryError):
    """The file's parse ran out of its CPU budget: maybe tried again."""


def file_offsets(data: bytes, name: str, verbs=VERBS, limits=ELF_LIMITS) -> dict[str, int]:
    """verb -> file offset of its default-version definition in `data`, the
    bytes of the file called `name`."""
    try:
        found = default_function_offsets(data, verbs, limits)
    except ElfOverBudget as exc:
        raise ParseOverBudget(f"cannot read {name}: {exc}") from None
    except ElfRefused as exc:
        raise LibraryError(f"cannot read {name}: {exc}") from None
    missing = set(verbs) - set(found) - OPTIONAL_VERBS
    if missing:
        raise LibraryError(f"{name} lacks {', '.join(sorted(missing))}: not a libibverbs 1.1+")
    return found


def open_library(cand: Candidate) -> tuple[int, os.stat_result]:
    """A descriptor of the regular file `cand` names inside its root, and its
    status; when `cand` came from a process's maps, only the very file that
    process maps (a path replaced since, by anything, is refused)."""
    try:
        fd = open_regular(cand.root, cand.path)
    except RootedOpenError as exc:
        raise LibraryError(f"cannot open {cand.name}: {exc}") from None
    try:
        st = os.fstat(fd)
        if cand.ino is not None and not _maps_this(fd, st, cand):
            raise LibraryError(f"{cand.name} is not the file the process maps (replaced since)")
        if st.st_size > ELF_LIMITS.max_file_bytes:
            raise LibraryError(f"{cand.name} is larger than {ELF_LIMITS.max_file_bytes} bytes")
    except BaseException:
        os.close(fd)
        raise
    return fd, st


def _maps_this(fd: int, st: os.stat_result, cand: Candidate) -> bool:
    if (st.st_dev, st.st_ino) == (cand.dev, cand.ino):
        return True
    # overlayfs before Linux 6.8 shows the inode underneath in maps: the
    # mapped file itself, named by map_files, decides. Only there: the
    # mapped file may be anywhere, a FUSE file whose daemon never answers too
    if not cand.mapped_as or fs_type(fd) != OVERLAYFS:
        return False
    try:
        mapped = os.stat(cand.mapped_as)
    except OSError:
        return False
    return (st.st_dev, st.st_ino) == (mapped.st_dev, mapped.st_ino)


def read_whole(fd: int, most: int) -> bytes:
    data = read_upto(fd, most)
    if len(data) > most:
        raise LibraryError(f"grew past {most} bytes while read")
    return data


class BoundedOpener:
    """Opens and reads candidates on a thread of its own, for at most
    `timeout_s` each. A path lookup that enters a file system a user's
    process serves (FUSE) waits for that process, which may never answer;
    the thread is then left behind, and until it returns nothing else is
    opened (one such thread at most, and the scan goes on)."""

    def __init__(self, timeout_s: float):
        self.timeout_s = timeout_s
        self._stuck: tuple[threading.Thread, str] | None = None

    def open(self, cand: Candidate) -> tuple[int, os.stat_result, bytes]:
        if self._stuck is not None:
            thread, name = self._stuck
            if thread.is_alive():
                raise LibraryError(f"{cand.name}: not opened while the open of {name} has not "
                                   "returned")
            self._stuck = None
        result: dict = {}
        lock = threading.Lock()

        def work():
            try:
                fd, st = open_library(cand)
                try:
                    data = read_whole(fd, ELF_LIMITS.max_file_bytes)
                except BaseException:
                    os.close(fd)
                    raise
            except BaseException as exc:  # noqa: BLE001 - handed to the scan
                result["error"] = exc
                return
            with lock:
                if result.get("abandoned"):
                    os.close(fd)     # answered too late: nobody holds it
                else:
                    result["done"] = (fd, st, data)

        thread = threading.Thread(target=work, name="rdma-app-open", daemon=True)
        thread.start()
        thread.join(self.timeout_s)
        with lock:
            if "done" not in result and "error" not in result:
                result["abandoned"] = True
                self._stuck = (thread, cand.name)
                raise LibraryError(f"{cand.name}: not opened within {self.timeout_s:g} s (its "
                                   "file system does not answer)")
        if "error" in result:
            raise result["error"]
        return result["done"]


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


def mapped_by(pid: int, proc: str = "/proc") -> set[Candidate]:
    """libibverbs files process `pid` has mapped: each path as the process
    names it (inside its root: a container's copy is found) with the inode
    it maps there."""
    try:
        with open(f"{proc}/{pid}/maps", "rb") as f:
            text = f.read(MAX_MAPS_BYTES)
    except OSError:
        return set()
    found: dict[tuple, Candidate] = {}
    for line in text.splitlines():
        m = _MAPS_LINE.match(line)
        if not m:
            continue
        span, major, minor, ino, path = m.groups()
        dev = os.makedev(int(major, 16), int(minor, 16))
        key = (path, dev, int(ino))
        if key not in found:
            found[key] = Candidate(f"{proc}/{pid}/root", path, dev, int(ino),
                                   f"{proc}/{pid}/map_files/{span.decode()}")
    return set(found.values())


def mapping_processes(proc: str = "/proc") -> dict[int, set[Candidate]]:
    """pid -> libibverbs files, for every process that has one mapped."""
    out = {}
    for name in os.listdir(proc):
        if name.isdigit():
            found = mapped_by(int(name), proc)
            if found:
                out[int(name)] = found
    return out


def candidates(proc: str = "/proc") -> set[Candidate]:
    """The system's libibverbs and every copy a running process maps."""
    found = set()
    system = system_library()
    if system:
        found.add(Candidate("/", os.fsencode(system)))
    for mapped in mapping_processes(proc).values():
        found |= mapped
    return found


class Attachments:
    """The libibverbs files the application probe is attached to, one set of
    uprobes per inode whatever path names it, and those that were refused.
    A file that cannot be used is refused with its reason and counted, never
    raised: the next one is still looked at. A file whose parse ran out of
    its CPU budget is not refused at once: it is left for a later look, with
    twice the budget, PARSE_TRIES times in all (a genuine library on a CPU
    that slow or that busy is still attached; crafted bytes cost a bounded
    sum)."""

    def __init__(self):
        self.libraries: dict[tuple[int, int], Library] = {}
        self.refused: dict[tuple, str] = {}     # candidate or (dev, ino) -> why
        self.refusals = 0
        self.since_ns = 0            # CLOCK_MONOTONIC of the first attach
        self.over_budget: dict[tuple[int, int], int] = {}   # (dev, ino) -> parses over budget
        # of the last attach: candidates neither attached nor refused, for a later look
        self.unsettled: set[Candidate] = set()
        self._opener = BoundedOpener(OPEN_TIMEOUT_S)

    def attach(self, obj, found, budget_s: float = SCAN_BUDGET_S,
               clock=time.monotonic) -> list[str]:
        """Attach `obj`'s up_/ur_ programs to each new library of `found`
        (Candidates), for at most `budget_s`; returns the names attached now.
        Those left for a later look are in self.unsettled."""
        added = []
        self.unsettled = set()
        end = clock() + budget_s
        # the host's own first, then in a stable order
        todo = sorted(found, key=lambda c: (c.root != "/", c.root, c.path))
        for n, cand in enumerate(todo):
            if (cand.dev, cand.ino) in self.libraries or cand in self.refused:
                continue
            if clock() > end:
                self.unsettled.update(c for c in todo[n:] if (c.dev, c.ino) not in self.libraries
                                      and c not in self.refused)
                log.warning("rdma probe: %d libibverbs files left for a later look: the scan "
                            "took more than %g s", len(self.unsettled), budget_s)
                break
            try:
                lib = self._attach_one(obj, cand)
            except ParseOverBudget as exc:
                self.unsettled.add(cand)
                log.info("rdma probe: %s; looked at again later with twice the time", exc)
                continue
            except Exception as exc:  # noqa: BLE001 - one file never stops the scan
                self._refuse(cand, str(exc).splitlines()[0] if str(exc) else type(exc).__name__)
                continue
            if lib is not None:
                added.append(lib.path)
        return added

    def _attach_one(self, obj, cand: Candidate) -> Library | None:
        if len(self.libraries) >= MAX_LIBRARIES:
            raise LibraryError(f"{cand.name}: already attached to {MAX_LIBRARIES} files")
        fd, st, data = self._opener.open(cand)
        try:
            ident = (st.st_dev, st.st_ino)
            if ident in self.libraries or ident in self.refused:
                return None
            tries = self.over_budget.get(ident, 0)
            limits = replace(ELF_LIMITS, budget_s=ELF_LIMITS.budget_s * 2 ** tries)
            try:
                offsets = file_offsets(data, cand.name, limits=limits)
            except ParseOverBudget:
                if tries + 1 < PARSE_TRIES and len(self.over_budget) < MAX_REFUSALS_KEPT:
                    self.over_budget[ident] = tries + 1
                    raise
                self.over_budget.pop(ident, None)
                self._refuse(ident, f"{cand.name}: not parsed within {PARSE_TRIES} budgets "
                             f"of CPU time (the last {limits.budget_s:g} s)")
                return None
            except LibraryError as exc:
                self._refuse(ident, str(exc))
                return None
            self.over_budget.pop(ident, None)
            lib = Library(cand.name, st.st_dev, st.st_ino, offsets)
            # through the descriptor: the inode checked, whatever the path names now
            try:
                _attach(obj, lib, f"/proc/self/fd/{fd}")
            except TracehoundError as exc:
                raise LibraryError(f"{cand.name}: {exc}") from None
        finally:
            os.close(fd)
        self.libraries[ident] = lib
        self.since_ns = self.since_ns or time.monotonic_ns()
        log.info("rdma probe: application view through %s (%d verbs)", lib.path, len(offsets))
        return lib

    def _refuse(self, key, why: str) -> None:
        self.refusals += 1
        if len(self.refused) < MAX_REFUSALS_KEPT:
            self.refused[key] = why
            log.warning("rdma probe: no application view through it: %s", why)

    def why_none(self) -> str:
        reasons = sorted(set(self.refused.values()))
        if not reasons:
            return f"no {SONAME} on this host or in any process"
        shown = "; ".join(reasons[:3])
        return shown if len(reasons) <= 3 else f"{shown}; ({self.refusals} refusals in all)"


def _attach(obj, lib: Library, path: str) -> None:
    links = []
    try:
        for verb, offset in lib.offsets.items():
            for side, ret in (("up", False), ("ur", True)):
                links.append(obj.programs[f"{side}_{verb}"].attach_uprobe(path, offset,
                                                                           retprobe=ret))
    except BaseException:
        for link in links:
            link.destroy()
        raise
    obj.links.extend(links)
