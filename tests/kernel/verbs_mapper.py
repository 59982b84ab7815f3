"""A process in a container of its own making that maps a library and waits.

    unshare -m --propagation private python verbs_mapper.py ROOT PATH

Bind-mounts ROOT on itself and pivots into it (so the kernel names its
mappings as a container's: PATH inside ROOT), maps PATH read-only, drops to
uid/gid 65534, prints "mapped" and waits until its stdin closes."""
import ctypes
import mmap
import os
import sys

MS_BIND, MS_REC, MNT_DETACH, SYS_PIVOT_ROOT = 0x1000, 0x4000, 2, 155


def check(ret: int, what: str) -> None:
    if ret != 0:
        err = ctypes.get_errno()
        sys.exit(f"verbs_mapper: {what}: {os.strerror(err)}")


def main() -> None:
    root, path = sys.argv[1], sys.argv[2]
    libc = ctypes.CDLL(None, use_errno=True)
    check(libc.mount(root.encode(), root.encode(), None, MS_BIND | MS_REC, None), "bind mount")
    os.makedirs(os.path.join(root, ".old"), exist_ok=True)
    check(libc.syscall(SYS_PIVOT_ROOT, root.encode(), os.path.join(root, ".old").encode()),
          "pivot_root")
    os.chdir("/")
    check(libc.umount2(b"/.old", MNT_DETACH), "umount the old root")
    fd = os.open(path, os.O_RDONLY)
    mapping = mmap.mmap(fd, 4096, prot=mmap.PROT_READ)
    os.close(fd)
    os.setgroups([])
    os.setgid(65534)
    os.setuid(65534)
    print("mapped", flush=True)
    sys.stdin.read()
    mapping.close()


if __name__ == "__main__":
    main()
