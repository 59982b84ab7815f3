"""Reading the member processes of cgroups and the cgroups of processes."""
from __future__ import annotations

import os
from collections.abc import Iterator


def read_pids(cgroup_dir: str) -> list[int]:
    """Pids in one cgroup (not its descendants); [] if it is gone.

    cgroup.procs may list a pid twice when it moved out and back while being
    read, so duplicates are dropped, keeping the kernel's order.
    """
    try:
        with open(os.path.join(cgroup_dir, "cgroup.procs")) as f:
            text = f.read()
    except OSError:
        return []
    seen: dict[int, None] = {}
    for tok in text.split():
        if tok.isdigit():
            seen.setdefault(int(tok), None)
    return list(seen)


def walk_pids(cgroup_dir: str, limit: int = 256) -> Iterator[int]:
    """Pids of a cgroup and its descendants, the cgroup itself first.

    Under cgroup v2 only leaves hold processes, so an inner cgroup (a job, a
    pod) is empty and its processes must be looked for below it. At most
    `limit` pids are produced so a huge job costs a bounded amount of work.
    """
    produced = 0
    for dirpath, _dirs, _files in os.walk(cgroup_dir):
        for pid in read_pids(dirpath):
            yield pid
            produced += 1
            if produced >= limit:
                return


def read_text(path: str) -> str | None:
    try:
        with open(path, "rb") as f:
            # a cgroup path keeps the bytes of its name, to be opened again
            return f.read().decode("utf-8", "surrogateescape")
    except OSError:
        return None


def parse_proc_cgroup(text: str) -> dict[str, str]:
    """/proc/<pid>/cgroup as controller -> path.

    Each line is ``hierarchy-id:controller[,controller...]:path``. The v2
    line is ``0::path`` and is returned under the key ``""``; a named v1
    hierarchy (``name=systemd``) is returned under its full name.
    """
    paths: dict[str, str] = {}
    twice: set[str] = set()
    # The kernel writes each path raw: lines end at "\n" only ("\r" and the
    # like are part of a cgroup's name), and a cgroup named with a "\n"
    # and a line of its own must not pass for a membership: a hierarchy
    # named twice is not answered at all.
    for line in text.split("\n"):
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        _hier, controllers, path = parts
        for ctl in controllers.split(",") if controllers else [""]:
            if ctl in paths:
                twice.add(ctl)
            paths[ctl] = path
    for ctl in twice:
        del paths[ctl]
    return paths


def proc_cgroups(pid: int, proc_root: str = "/proc") -> dict[str, str]:
    text = read_text(os.path.join(proc_root, str(pid), "cgroup"))
    return parse_proc_cgroup(text) if text else {}


def cgroup_v2_path(pid: int, proc_root: str = "/proc") -> str | None:
    """The process's cgroup v2 path (its ``0::`` line); None when the
    process is gone or sits in no v2 hierarchy."""
    path = proc_cgroups(pid, proc_root).get("")
    # not stripped: a name may end in a space or "\r", and is then another cgroup
    return None if path is None else (path or "/")
