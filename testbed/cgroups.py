"""Running a program inside a cgroup (v2) and removing the cgroup after it."""
import os
import subprocess
import time


def remove_cgroup(path: str, tries: int = 50) -> None:
    """rmdir a cgroup, waiting for its last processes to be reaped."""
    for _ in range(tries):
        try:
            os.rmdir(path)
            return
        except FileNotFoundError:
            return
        except OSError:
            time.sleep(0.1)


def exec_in_cgroup(cgroup_root: str, cgroup: str, argv: list[str]) -> subprocess.CompletedProcess:
    """exec an arbitrary program inside the cgroup (via a shell that joins it first)."""
    procs = cgroup_root + cgroup + "/cgroup.procs"
    return subprocess.run(["sh", "-c", 'echo $$ > "$0" && exec "$@"', procs, *argv],
                          capture_output=True, text=True, timeout=300)
