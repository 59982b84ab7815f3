"""The cgroup churn test's process maker: for each line "cgroup.procs path
size" (tab-separated) on stdin, fork a child that joins the cgroup, writes
`size` bytes to `path` and exits; print the child's exit code.

A fork copies the page tables of the process that forks: this one holds a
few megabytes, the test runner far more once the unit tier has run in it
(a fork from a process holding 100 MB took 11 ms, from this one 2.5 ms).
Only os and sys are imported, so it starts with -I -S."""
import os
import sys


def main() -> None:
    for line in sys.stdin:
        procs, path, size = line.rstrip("\n").split("\t")
        pid = os.fork()
        if pid == 0:
            try:
                with open(procs, "w") as f:
                    f.write(str(os.getpid()))
                fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
                os.write(fd, b"x" * int(size))
                os.close(fd)
                os._exit(0)
            except BaseException:
                os._exit(1)
        _, status = os.waitpid(pid, 0)
        sys.stdout.write(f"{os.waitstatus_to_exitcode(status)}\n")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
