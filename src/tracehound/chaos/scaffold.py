"""Small stand-in workloads and scaffolding for the example experiments
(called through the python provider): a writer in its own cgroup, a pair
of network namespaces joined by a veth, a scratch tmpfs. Each has its
undo, meant for the experiment's rollbacks."""
from __future__ import annotations

import mmap
import os
import select
import signal
import subprocess
import sys
import time

from ..host.procs import read_pids
from .faults import workload_cgroup
from .faults.targets import cgroup_procs


def _cgroup_path(cgroup: str) -> str:
    """The workload's v2 directory: what faults and rollbacks read."""
    return workload_cgroup.v2_dir(cgroup)


def _data_file(directory: str, cgroup: str) -> str:
    return os.path.join(directory, f"tracehound-workload-{cgroup.strip('/').replace('/', '-')}.dat")


def start_writer(cgroup: str, directory: str, block_size: int = 262144, direct: bool = True,
                 file_bytes: int = 4 << 20, interval: float = 0.01,
                 ready_timeout: float = 60.0) -> dict:
    """Start a detached process in a new cgroup (workload_cgroup: where any
    agent counts it) that writes block_size bytes every `interval` seconds
    to one file, truncating it every file_bytes. Returns its pid once it has
    made its first write (done or failed): a fault applied after this acts
    on a writer that writes, however long its interpreter took to start on
    a busy node."""
    path = _cgroup_path(cgroup)
    ready_r, ready_w = os.pipe()
    try:
        argv = workload_cgroup.join_argv(
            workload_cgroup.make(cgroup),
            [sys.executable, "-m", __name__, "write", _data_file(directory, cgroup),
             str(block_size), "1" if direct else "0", str(file_bytes), str(interval),
             str(ready_w)])
        # Through a shell that exits at once: the writer is re-parented, so no
        # zombie of it is ever left to the chaos run (or confuses a state check).
        subprocess.run(["sh", "-c", '"$@" </dev/null >/dev/null 2>&1 &', "sh", *argv],
                       check=True, pass_fds=(ready_w,))
        os.close(ready_w)
        ready_w = -1
        # one byte after its first write; end of file if it died first
        if not select.select([ready_r], [], [], ready_timeout)[0]:
            raise RuntimeError(f"the writer in {cgroup} made no write within {ready_timeout:g} s")
        if not os.read(ready_r, 1):
            raise RuntimeError(f"the writer in {cgroup} exited before its first write")
    finally:
        os.close(ready_r)
        if ready_w >= 0:
            os.close(ready_w)
    pids = cgroup_procs(path)
    if not pids:
        raise RuntimeError(f"the writer did not stay in {cgroup}")
    return {"pid": pids[0], "cgroup": cgroup}


def make_cgroup(cgroup: str) -> dict:
    """An empty cgroup for a fault to put its processes in (in every
    hierarchy an agent may key by: workload_cgroup)."""
    workload_cgroup.make(cgroup)
    return {"cgroup": cgroup}


def stop_workload(cgroup: str, directory: str | None = None) -> dict:
    """Kill everything in the cgroup (stopped processes included), remove
    the cgroup and the writer's file."""
    path = _cgroup_path(cgroup)
    killed = []
    for _ in range(100):
        pids = read_pids(path)
        # also the way out once the cgroup is gone: rmdir finds nothing
        if not pids and workload_cgroup.removed(path):
            break
        for pid in pids:
            for sig in (signal.SIGKILL, signal.SIGCONT):
                try:
                    os.kill(pid, sig)
                except ProcessLookupError:
                    pass
            killed.append(pid)
        time.sleep(0.05)
    else:
        raise RuntimeError(f"cgroup {cgroup} still busy after killing {sorted(set(killed))}")
    workload_cgroup.remove(cgroup)
    if directory:
        try:
            os.unlink(_data_file(directory, cgroup))
        except FileNotFoundError:
            pass
    return {"killed": sorted(set(killed))}


def write_loop(path: str, block_size: int, direct: bool, file_bytes: int,
               interval: float, ready_fd: int = -1) -> None:
    flags = os.O_WRONLY | os.O_CREAT | (os.O_DIRECT if direct else 0)
    fd = os.open(path, flags, 0o600)
    buf = mmap.mmap(-1, block_size)       # page-aligned, as O_DIRECT needs
    buf.write(b"\xa5" * block_size)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    offset = 0
    try:
        while True:
            try:
                if offset == 0:
                    os.ftruncate(fd, 0)
                os.pwrite(fd, buf, offset)
                offset = (offset + block_size) % file_bytes
            except OSError:
                time.sleep(0.05)          # ENOSPC, EIO: keep trying, as a job would
            if ready_fd >= 0:             # start_writer waits for the first write
                os.write(ready_fd, b"1")
                os.close(ready_fd)
                ready_fd = -1
            if interval:
                time.sleep(interval)
    finally:
        os.close(fd)
        try:
            os.unlink(path)
        except OSError:
            pass


def _ip(*args: str) -> None:
    out = subprocess.run(["ip", *args], capture_output=True, text=True)
    if out.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {out.stderr.strip()}")


def make_netns_pair(netns_a: str, netns_b: str, if_a: str, if_b: str, addr_a: str,
                    addr_b: str) -> dict:
    """Two network namespaces joined by a veth pair, addresses given as
    a.b.c.d/nn, both ends up."""
    for ns in (netns_a, netns_b):
        _ip("netns", "add", ns)
    _ip("link", "add", if_a, "netns", netns_a, "type", "veth", "peer", "name", if_b,
        "netns", netns_b)
    for ns, ifname, addr in ((netns_a, if_a, addr_a), (netns_b, if_b, addr_b)):
        _ip("-n", ns, "addr", "add", addr, "dev", ifname)
        _ip("-n", ns, "link", "set", ifname, "up")
    return {"netns": [netns_a, netns_b]}


def delete_netns(names: list[str]) -> dict:
    gone = []
    for ns in names:
        if os.path.exists(f"/run/netns/{ns}"):
            _ip("netns", "del", ns)
            gone.append(ns)
    return {"deleted": gone}


def start_tcp_stream(cgroup: str, netns: str, peer_netns: str, address: str,
                     port: int = 5301, chunk: int = 65536, interval: float = 0.01) -> dict:
    """A TCP job in a new cgroup: a sink listening on address:port in
    peer_netns and a sender in netns streaming `chunk` bytes every
    `interval` seconds to it, reconnecting as a job would. Both join the
    cgroup before they open a socket, so its sockets carry the cgroup."""
    path = _cgroup_path(cgroup)
    procs = workload_cgroup.make(cgroup)
    for ns, argv in ((peer_netns, ["tcp-sink", address, str(port)]),
                     (netns, ["tcp-send", address, str(port), str(chunk), str(interval)])):
        # joins before `ip netns exec`, which mounts a sysfs of the namespace
        # (no cgroup file system under it)
        cmd = workload_cgroup.join_argv(
            procs, ["ip", "netns", "exec", ns, sys.executable, "-m", __name__, *argv])
        subprocess.run(["sh", "-c", '"$@" </dev/null >/dev/null 2>&1 &', "sh", *cmd], check=True)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        pids = cgroup_procs(path)
        if len(pids) >= 2:
            return {"pids": sorted(pids), "cgroup": cgroup}
        time.sleep(0.02)
    raise RuntimeError(f"the TCP job did not join {cgroup}")


def tcp_sink(address: str, port: int) -> None:
    import socket
    import threading
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    srv = socket.create_server((address, port), reuse_port=True)

    def drain(conn):
        with conn:
            while conn.recv(1 << 20):
                pass
    while True:
        conn, _ = srv.accept()
        threading.Thread(target=drain, args=(conn,), daemon=True).start()


def tcp_send(address: str, port: int, chunk: int, interval: float) -> None:
    import socket
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    data = b"\x5a" * chunk
    while True:
        try:
            with socket.create_connection((address, port), timeout=30) as conn:
                while True:
                    conn.sendall(data)
                    if interval:
                        time.sleep(interval)
        except OSError:
            time.sleep(0.2)


def mount_tmpfs(path: str, size_mb: int = 64) -> dict:
    os.makedirs(path, exist_ok=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size_mb}m", "tracehound-chaos",
                    path], check=True, capture_output=True)
    return {"mounted": path}


def unmount(path: str) -> dict:
    if os.path.ismount(path):
        subprocess.run(["umount", "-l", path], check=True, capture_output=True)
    try:
        os.rmdir(path)
    except OSError:
        pass
    return {"unmounted": path}


if __name__ == "__main__":
    if sys.argv[1] == "write":
        path, bs, direct, size, interval = sys.argv[2:7]
        ready = int(sys.argv[7]) if len(sys.argv) > 7 else -1
        write_loop(path, int(bs), direct == "1", int(size), float(interval), ready)
    elif sys.argv[1] == "tcp-sink":
        tcp_sink(sys.argv[2], int(sys.argv[3]))
    elif sys.argv[1] == "tcp-send":
        address, port, chunk, interval = sys.argv[2:6]
        tcp_send(address, int(port), int(chunk), float(interval))
