"""Test workload: joins a cgroup, then performs exactly the file operations it
is given and prints what each returned, as JSON.

Everything Python needs is imported before joining the cgroup, so nothing but
the listed operations happens inside it.
"""
import errno
import json
import mmap
import os
import sys
import time


def run(ops):
    results = []
    fds = {}
    for op in ops:
        name, args = op[0], op[1:]
        try:
            if name == "write":            # path, total, chunk[, pause between calls, s]
                path, total, chunk, *pause = args
                fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
                buf = b"x" * chunk
                done = 0
                while done < total:
                    if done and pause:
                        time.sleep(pause[0])
                    done += os.write(fd, buf[:min(chunk, total - done)])
                os.close(fd)
                results.append(done)
            elif name == "read":           # path, chunk[, pause] -> bytes read until EOF
                path, chunk, *pause = args
                fd = os.open(path, os.O_RDONLY)
                done = 0
                while True:
                    if done and pause:
                        time.sleep(pause[0])
                    n = len(os.read(fd, chunk))
                    if n == 0:
                        break
                    done += n
                os.close(fd)
                results.append(done)
            elif name == "pread":
                path, size, offset = args
                fd = os.open(path, os.O_RDONLY)
                results.append(len(os.pread(fd, size, offset)))
                os.close(fd)
            elif name == "writev":
                path, sizes = args
                fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
                results.append(os.writev(fd, [b"v" * s for s in sizes]))
                os.close(fd)
            elif name == "readv":
                path, sizes = args
                fd = os.open(path, os.O_RDONLY)
                results.append(os.readv(fd, [bytearray(s) for s in sizes]))
                os.close(fd)
            elif name == "fsync":
                fd = os.open(args[0], os.O_WRONLY)
                os.fsync(fd)
                os.fdatasync(fd)
                os.close(fd)
                results.append(0)
            elif name == "read_dir_fd":    # EISDIR
                fd = os.open(args[0], os.O_RDONLY | os.O_DIRECTORY)
                fds["d"] = fd
                os.read(fd, 10)
            elif name == "write_rdonly":   # EBADF
                fd = os.open(args[0], os.O_RDONLY)
                fds["r"] = fd
                os.write(fd, b"nope")
            elif name == "open":
                os.close(os.open(args[0], os.O_RDONLY))
                results.append(0)
            elif name == "create":
                os.close(os.open(args[0], os.O_WRONLY | os.O_CREAT, 0o644))
                results.append(0)
            elif name == "mkdir":
                os.mkdir(args[0])
                results.append(0)
            elif name == "rmdir":
                os.rmdir(args[0])
                results.append(0)
            elif name == "unlink":
                os.unlink(args[0])
                results.append(0)
            elif name == "rename":
                os.rename(args[0], args[1])
                results.append(0)
            elif name == "copy_file_range":    # src, dst -> bytes copied
                results.append(_copy(args[0], args[1], lambda i, o, n: os.copy_file_range(i, o, n)))
            elif name == "sendfile":           # src, dst (a file, or /dev/null)
                results.append(_copy(args[0], args[1], lambda i, o, n: os.sendfile(o, i, None, n)))
            elif name == "splice":             # src -> pipe -> dst
                r, w = os.pipe()
                results.append(_copy(args[0], args[1], lambda i, o, n: _splice_via(i, o, r, w)))
                os.close(r)
                os.close(w)
            elif name == "mmap_read":          # path -> bytes touched, one load per page
                fd = os.open(args[0], os.O_RDONLY)
                size = os.fstat(fd).st_size
                with mmap.mmap(fd, size, prot=mmap.PROT_READ) as m:
                    sum(m[i] for i in range(0, size, mmap.PAGESIZE))
                os.close(fd)
                results.append(size)
            elif name == "chdir":
                os.chdir(args[0])
                results.append(0)
            else:
                raise ValueError(name)
        except OSError as exc:
            results.append(-exc.errno)
    for fd in fds.values():
        os.close(fd)
    return results


def _copy(src, dst, step):
    """Move a whole file with `step(fd_in, fd_out, max)` until it returns 0."""
    fd_in = os.open(src, os.O_RDONLY)
    fd_out = os.open(dst, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    done = 0
    try:
        while True:
            n = step(fd_in, fd_out, 1 << 20)
            if n == 0:
                return done
            done += n
    finally:
        os.close(fd_in)
        os.close(fd_out)


def _splice_via(fd_in, fd_out, r, w):
    n = os.splice(fd_in, w, 1 << 16)
    left = n
    while left:
        left -= os.splice(r, fd_out, left)
    return n


def main():
    cgroup_procs, plan = sys.argv[1], json.loads(sys.argv[2])
    with open(cgroup_procs, "w") as f:
        f.write(str(os.getpid()))
    results = run(plan)
    sys.stdout.write(json.dumps(results))
    sys.stdout.flush()


assert errno  # imported up front on purpose
if __name__ == "__main__":
    main()
