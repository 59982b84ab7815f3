"""Per-cgroup pressure (PSI) and process states, read from the cgroup v2 tree
and /proc at scrape time.

The walk goes breadth first from the agent's cgroup2 root, children in name
order, what root made before what other users made below their own
directories, and reads at most `max_cgroups` populated cgroups and looks at
four times as many directories, so the cost of a scrape stays bounded
whatever the tree holds; the result says when it stopped short. A cgroup
whose `cgroup.events` says `populated 0` has no process in it or below it:
it is skipped with its whole subtree, uncounted, so the thousands of empty
leftovers a busy node can carry (or a user makes) cost one small read each
and no series. The root is always read.

Every file is read with a size cap and every read may fail: processes exit
and cgroups are removed while we walk, and such an entry is simply left out.
"""
from __future__ import annotations

import os
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

RESOURCES = ("cpu", "memory", "io")
PSI_KINDS = ("some", "full")
STATES = ("running", "sleeping", "disk", "stopped", "zombie", "other")
STATE_OF = {"R": "running", "S": "sleeping", "D": "disk", "T": "stopped", "t": "stopped",
            "Z": "zombie"}

SMALL_FILE_BYTES = 4096          # a pressure file, cgroup.events, /proc/PID/stat
PROCS_FILE_BYTES = 256 * 1024    # cgroup.procs: ~30k pids of 7 digits
PAGE_SIZE = os.sysconf("SC_PAGE_SIZE")
MAX_PIDS = 16384                 # processes of one cgroup whose state is read
PROC_PRESSURE = "pressure"       # /proc/pressure: the root's, on kernels whose root
                                 # cgroup has no pressure files


def _read(path: str, cap: int = SMALL_FILE_BYTES) -> bytes | None:
    try:
        with open(path, "rb") as f:
            return f.read(cap)
    except OSError:
        return None      # gone, or PSI switched off for the cgroup (EOPNOTSUPP)


def parse_pressure(raw: bytes | None) -> dict[str, int]:
    """`some`/`full` -> total stall time in microseconds; a missing or
    malformed line is absent (cpu `full` on kernels before 5.13)."""
    out: dict[str, int] = {}
    if not raw:
        return out
    for line in raw.decode("ascii", errors="replace").splitlines():
        parts = line.split()
        if not parts or parts[0] not in PSI_KINDS or parts[0] in out:
            continue
        for item in parts[1:]:
            name, _, value = item.partition("=")
            if name == "total" and value.isascii() and value.isdigit() and len(value) <= 20:
                out[parts[0]] = int(value)
                break
    return out


def read_pids(cgroup_dir: str, limit: int = MAX_PIDS) -> tuple[list[int], bool]:
    """The cgroup's own processes (not its descendants'), at most `limit`;
    and whether the list was cut."""
    raw = _read(os.path.join(cgroup_dir, "cgroup.procs"), PROCS_FILE_BYTES)
    if not raw:
        return [], False
    cut = len(raw) >= PROCS_FILE_BYTES
    if cut:
        raw = raw[:raw.rfind(b"\n") + 1]     # a pid split by the cap is not a pid
    pids = [int(t) for t in raw.split() if t.isdigit() and len(t) <= 10]
    return pids[:limit], cut or len(pids) > limit


def _pid_stat(pid: int, proc_root: str) -> tuple[str, int] | None:
    """(state, resident pages) of a process, or None when it is gone."""
    raw = _read(f"{proc_root}/{pid}/stat")
    if not raw:
        return None
    # the command name may hold spaces and parentheses: the fields follow the last ')'
    rest = raw.rpartition(b")")[2].split()
    if not rest:
        return "other", 0
    state = STATE_OF.get(rest[0].decode("ascii", errors="replace"), "other")
    # rss is field 24 of the line, the 22nd after the command name
    rss = rest[21] if len(rest) > 21 else b""
    return state, int(rss) if rss.isdigit() and len(rss) <= 15 else 0


def process_states(cgroup_dir: str, proc_root: str = "/proc",
                   limit: int = MAX_PIDS) -> dict[str, int]:
    """How many of the cgroup's own processes are in each of STATES (every
    key present). A process's state is its main thread's."""
    return _states(cgroup_dir, proc_root, limit)[0]


def _states(cgroup_dir: str, proc_root: str, limit: int) -> tuple[dict[str, int], bool, int]:
    """Counts by state, whether the pid list was cut, resident pages summed."""
    counts = dict.fromkeys(STATES, 0)
    pids, cut = read_pids(cgroup_dir, limit)
    pages = 0
    for pid in pids:
        got = _pid_stat(pid, proc_root)
        if got is not None:
            counts[got[0]] += 1
            pages += got[1]
    return counts, cut, pages


def cpu_usec(cgroup_dir: str) -> int | None:
    """CPU time of the cgroup and its descendants (cpu.stat usage_usec: the
    v2 core file, there whichever hierarchy the cpu controller is bound to)."""
    raw = _read(os.path.join(cgroup_dir, "cpu.stat"))
    for line in (raw or b"").splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[0] == b"usage_usec" and parts[1].isdigit():
            return int(parts[1])
    return None


def populated(cgroup_dir: str) -> bool:
    """False only when cgroup.events says so: the root has no such file."""
    raw = _read(os.path.join(cgroup_dir, "cgroup.events"))
    if raw is None:
        return True
    for line in raw.splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[0] == b"populated":
            return parts[1] != b"0"
    return True


@dataclass
class CgroupState:
    cgroup_id: int          # the directory's inode: what bpf_get_current_cgroup_id returns
    path: str               # relative to the root, "/" for the root
    pressure: dict[tuple[str, str], int] = field(default_factory=dict)  # (resource, kind) -> usec
    states: dict[str, int] = field(default_factory=dict)
    pids_cut: bool = False  # more processes than MAX_PIDS: the states count the first ones
    cpu_usec: int | None = None     # the cgroup's and its descendants'
    rss_bytes: int = 0              # resident memory of its own processes (shared pages in each)


@dataclass
class Walk:
    cgroups: list[CgroupState] = field(default_factory=list)
    truncated: bool = False     # stopped at its bound with directories left
    visited: int = 0            # populated cgroups met


def read_cgroup(directory: str, rel: str, cgroup_id: int, proc_root: str = "/proc",
                pid_limit: int = MAX_PIDS) -> CgroupState:
    st = CgroupState(cgroup_id, rel)
    for res in RESOURCES:
        raw = _read(os.path.join(directory, f"{res}.pressure"))
        if raw is None and rel == "/":
            raw = _read(os.path.join(proc_root, PROC_PRESSURE, res))
        for kind, usec in parse_pressure(raw).items():
            st.pressure[(res, kind)] = usec
    st.states, st.pids_cut, pages = _states(directory, proc_root, pid_limit)
    st.rss_bytes = pages * PAGE_SIZE
    st.cpu_usec = cpu_usec(directory)
    return st


# directories looked at, per cgroup a walk may yield: empty ones cost a look
LOOKS_PER_CGROUP = 4


def populated_cgroups(root: str, max_cgroups: int, out: Walk,
                      children_first: Callable[[str, int], bool] | None = None):
    """(directory, path, cgroup id) of every populated cgroup under ROOT
    (itself included), breadth first, at most MAX_CGROUPS of them and
    LOOKS_PER_CGROUP times as many directories looked at; OUT counts and
    says whether it stopped short.

    Anyone with a delegated subtree makes directories, as many as they
    like: an empty subtree is passed over uncounted (cgroup.events), and
    the children of a directory root does not own are walked after all the
    others, unless children_first(path, owner uid) says they are wanted
    (by default: only root's). What root made is thus walked first."""
    first = children_first or (lambda _path, uid: uid == 0)
    try:
        root_st = os.stat(root)
    except OSError:
        return
    queue: deque = deque([(root.rstrip("/") or "/", "/", root_st.st_ino)])
    later: deque = deque()
    looks = 0
    while queue or later:
        if out.visited >= max_cgroups or looks >= max_cgroups * LOOKS_PER_CGROUP:
            out.truncated = True
            return
        directory, rel, cgid = (queue or later).popleft()
        looks += 1
        if rel != "/" and not populated(directory):
            continue
        try:
            uid = os.stat(directory).st_uid
            children = sorted((e.name, e.inode()) for e in os.scandir(directory)
                              if e.is_dir(follow_symlinks=False))
        except OSError:
            continue        # removed while we walk
        out.visited += 1
        yield directory, rel, cgid
        (queue if first(rel, uid) else later).extend(
            (os.path.join(directory, name), rel.rstrip("/") + "/" + name, ino)
            for name, ino in children)


def walk(root: str, max_cgroups: int, proc_root: str = "/proc",
         pid_limit: int = MAX_PIDS, read_if=None) -> Walk:
    """Every populated cgroup under `root` (itself included), as
    populated_cgroups walks them; with `read_if(path)`, only the cgroups it
    wants are read (a v1 root holds every other process of the host:
    reading their states would be wasted)."""
    out = Walk()
    for directory, rel, cgid in populated_cgroups(root, max_cgroups, out):
        if read_if is None or read_if(rel):
            out.cgroups.append(read_cgroup(directory, rel, cgid, proc_root, pid_limit))
    return out


def psi_absent(root: str, proc_root: str = "/proc") -> str | None:
    """Why this host has no pressure stall information, or None."""
    for path in (os.path.join(root, "cpu.pressure"), os.path.join(proc_root, PROC_PRESSURE, "cpu")):
        if parse_pressure(_read(path)):
            return None
    return (f"no pressure stall information: {root}/cpu.pressure is missing or unreadable "
            "(kernel without CONFIG_PSI, or booted with psi=0)")
