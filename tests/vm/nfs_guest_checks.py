"""Exact I/O bytes on a loopback NFSv4 mount, run as root inside the VM (see
test_vm_nfs.py).

    nfs_guest_checks.py RESULTS_DIR

Serves a tmpfs over NFSv4 from the guest's own kernel nfsd and mounts it on
127.0.0.1, next to a plain tmpfs and an ext4 loop image. Then, once per hook
mode, starts the agent forced into that mode and, from a fresh cgroup per file
system, writes a file of an odd size with plain write() calls, drops the page
cache and reads it back. The agent's read and write byte counters for that
cgroup and mount must equal the file's size exactly. Every check is written to
RESULTS_DIR/checks.json as soon as it is decided, so a crash part-way still
reports what ran.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path.insert(0, str(REPO))

import pytest  # noqa: E402  (start_agent reports a failed start with pytest.fail)

from tests.kernel.conftest import (  # noqa: E402
    _cgroup2_root, remove_cgroup, run_in_cgroup, series, start_agent, stop_agent)

MODES = ("fentry", "kprobe", "tracepoint")
FILESYSTEMS = ("nfs4", "tmpfs", "ext4")
MiB = 1 << 20
SIZE = 3 * MiB + 12345          # odd: a count of requests or pages cannot match by accident
WRITE_CHUNK, READ_CHUNK = 65536, 100_000

NFS_STATE = "/var/lib/nfs"                  # nfs-utils' state (etab, rmtab, v4recovery)
NFS_EXPORT = "/tmp/thnfs-export"            # a tmpfs the guest's nfsd serves
NFS_MOUNT = "/tmp/thnfs-nfs"                # the NFSv4 client mount of it
TMPFS_DIR = "/tmp/thnfs-tmpfs"
EXT4_DIR, EXT4_IMAGE = "/tmp/thnfs-ext4", "/tmp/thnfs-ext4.img"
DIRS = {"nfs4": NFS_MOUNT, "tmpfs": TMPFS_DIR, "ext4": EXT4_DIR}
CGROUP_PARENT = "/thnfs"

# The recipe for a loopback NFSv4 server and client in the guest. nfs-utils'
# state directory is a fresh tmpfs with the files exportfs expects, so nothing
# of the host's own (etab, client records) reaches the guest's server. NFSv4
# alone needs neither rpcbind nor statd; rpc.mountd still answers the
# kernel's export-cache upcalls. A
# 10 s lease and grace time (the kernel's minimum) keep the first OPEN after
# the server starts from waiting out the default 90 s grace period.
NFS_RECIPE = [
    "ip link set lo up",
    "modprobe -a nfsd nfsv4",
    "mountpoint -q /proc/fs/nfsd || mount -t nfsd nfsd /proc/fs/nfsd",
    f"mount -t tmpfs -o size=16m thnfs-state {NFS_STATE}",
    f"mkdir -p {NFS_STATE}/v4recovery {NFS_STATE}/sm {NFS_STATE}/sm.bak",
    f"touch {NFS_STATE}/etab {NFS_STATE}/rmtab",
    f"mkdir -p {NFS_EXPORT} {NFS_MOUNT}",
    f"mount -t tmpfs -o size=256m thnfs-export {NFS_EXPORT}",
    # a tmpfs has no device UUID: fsid=0 names it and makes it the NFSv4 root
    f"exportfs -o rw,no_root_squash,no_subtree_check,fsid=0 127.0.0.1:{NFS_EXPORT}",
    "rpc.mountd -N 3 -u",
    # -L/-G are lease and grace time (the long forms its usage text names are
    # not what nfs-utils 2.6 accepts); 8 server threads
    "rpc.nfsd -N 3 -V 4 -U -L 10 -G 10 8",
    f"timeout 120 mount -t nfs4 -o vers=4.2 127.0.0.1:/ {NFS_MOUNT}",
]
NFS_TOOLS = ("exportfs", "rpc.mountd", "rpc.nfsd", "mount.nfs4")
TOOL_PATH = os.environ.get("PATH", "") + ":/usr/sbin:/sbin"
LOCAL_RECIPE = [
    "modprobe -a loop ext4",
    f"mkdir -p {TMPFS_DIR} {EXT4_DIR}",
    f"mount -t tmpfs -o size=256m thnfs-tmpfs {TMPFS_DIR}",
    f"truncate -s 64M {EXT4_IMAGE}",
    f"mkfs.ext4 -q -F {EXT4_IMAGE}",
    f"mount -o loop {EXT4_IMAGE} {EXT4_DIR}",
]


class Checks:
    def __init__(self, results: Path):
        self.path = results / "checks.json"
        self.data = {"checks": {}, "timings": {}, "measured": {}}

    def _save(self) -> None:
        self.path.write_text(json.dumps(self.data, indent=1))

    def record(self, name: str, ok: bool, detail="") -> bool:
        self.data["checks"][name] = {"ok": bool(ok), "detail": str(detail)[:6000]}
        self._save()
        shown = str(detail)[:300] if ok else str(detail)[-3000:]
        print(f"CHECK {name} {'ok' if ok else 'FAIL'}: {shown}", flush=True)
        return bool(ok)

    def timing(self, name: str, seconds: float) -> None:
        self.data["timings"][name] = round(seconds, 3)
        self._save()

    def measured(self, key: str, values: dict) -> None:
        self.data["measured"][key] = values
        self._save()


def run_recipe(steps: list[str]) -> tuple[bool, str]:
    """Run each step with bash; stop at the first that fails. Returns
    (all ran, a transcript of every step with its output). Output goes
    through a file, not a pipe: a daemon a step starts may keep its copy."""
    log = []
    for step in steps:
        with tempfile.TemporaryFile("w+") as out:
            try:
                rc = subprocess.run(["bash", "-c", step], stdin=subprocess.DEVNULL, stdout=out,
                                    stderr=subprocess.STDOUT, timeout=180,
                                    env={**os.environ, "PATH": TOOL_PATH}).returncode
            except subprocess.TimeoutExpired:
                rc = "timeout after 180 s"
            out.seek(0)
            log.append(f"$ {step}  -> exit {rc}\n{out.read()}")
        print(log[-1], end="", flush=True)
        if rc != 0:
            return False, "".join(log)
    return True, "".join(log)


def fstype_at(path: str) -> str:
    return subprocess.run(["findmnt", "-n", "-o", "FSTYPE", "--mountpoint", path],
                          capture_output=True, text=True).stdout.strip()


def nfs_wire_bytes() -> tuple[int, int]:
    """(bytes read from, bytes written to) the server over RPC by the NFS
    mount, from the client's /proc/self/mountstats."""
    in_mount = False
    for line in Path("/proc/self/mountstats").read_text().splitlines():
        if line.startswith("device "):
            in_mount = f" mounted on {NFS_MOUNT} " in line
        elif in_mount and line.strip().startswith("bytes:"):
            # normalread normalwrite directread directwrite serverread serverwrite ...
            fields = [int(x) for x in line.split()[1:]]
            return fields[4], fields[5]
    raise RuntimeError(f"no NFS byte counters for {NFS_MOUNT} in /proc/self/mountstats")


def drop_caches() -> None:
    os.sync()
    Path("/proc/sys/vm/drop_caches").write_text("3\n")


class AgentLog:
    """The agent's output after start_agent() returned, drained by a thread so
    its pipe never fills."""

    def __init__(self, agent):
        self.lines: list[str] = []
        threading.Thread(target=self._drain, args=(agent.proc.stdout,), daemon=True).start()

    def _drain(self, stream) -> None:
        for line in stream:
            self.lines.append(line)

    def tail(self, n: int = 30) -> str:
        return "".join(self.lines[-n:])


def io_modes(metrics: dict) -> dict[str, str]:
    return {dict(ls)["probe"]: dict(ls)["mode"] for (n, ls), v in metrics.items()
            if n == "tracehound_probe_info" and v == 1 and dict(ls)["probe"].startswith("io.")}


def bytes_by_mount(metrics: dict, name: str, cgroup: str) -> dict[str, float]:
    """{'MOUNTPOINT (FSTYPE)': value} of one counter for one cgroup."""
    out: dict[str, float] = {}
    for (n, ls), v in metrics.items():
        labels = dict(ls)
        if n == name and labels.get("cgroup") == cgroup:
            key = f"{labels.get('mountpoint')} ({labels.get('fstype')})"
            out[key] = out.get(key, 0) + v
    return out


def one_file_system(c: Checks, agent, log: AgentLog, mode: str, fs: str) -> None:
    """Write SIZE bytes to a file on FS from a fresh cgroup, drop the cache,
    read them back from the same cgroup, and compare the agent's counters."""
    root = _cgroup2_root()
    rel = f"{CGROUP_PARENT}/{mode}-{fs}-{uuid.uuid4().hex[:8]}"
    os.makedirs(root + rel)
    where = DIRS[fs]
    path = os.path.join(where, f"data-{mode}")
    prefix = f"{mode}_{fs}"
    context = f"{mode} mode, {fs} at {where}, cgroup {rel}"
    try:
        wire0 = nfs_wire_bytes() if fs == "nfs4" else None
        wrote = run_in_cgroup(root, rel, [["write", path, SIZE, WRITE_CHUNK]])[0]
        wire1 = nfs_wire_bytes() if fs == "nfs4" else None
        drop_caches()
        read = run_in_cgroup(root, rel, [["read", path, READ_CHUNK]])[0]
        wire2 = nfs_wire_bytes() if fs == "nfs4" else None
        c.record(f"{prefix}_workload", wrote == SIZE and read == SIZE,
                 f"{context}: write() returned {wrote} bytes in all, read() {read}; "
                 f"expected {SIZE} each")
        if fs == "nfs4":
            on_server = os.path.getsize(os.path.join(NFS_EXPORT, f"data-{mode}"))
            sent, fetched = wire1[1] - wire0[1], wire2[0] - wire1[0]
            c.record(f"{prefix}_over_the_wire",
                     on_server == SIZE and sent >= SIZE and fetched >= SIZE,
                     f"{context}: file on the export {on_server} bytes, written to the server "
                     f"{sent}, read from the server after dropping the cache {fetched} "
                     f"(expected {SIZE}, {SIZE}+, {SIZE}+)")

        labels = {"cgroup": rel, "mountpoint": where, "fstype": fs}
        names = {"write": "tracehound_io_write_bytes_total",
                 "read": "tracehound_io_read_bytes_total"}

        def counted():
            m = agent.scrape()
            return m, {op: series(m, name, **labels) for op, name in names.items()}

        # the counters are read from the BPF maps at scrape time; a short wait
        # only covers a scrape racing the worker's exit
        deadline = time.monotonic() + 5
        m, got = counted()
        while any(v < SIZE for v in got.values()) and time.monotonic() < deadline:
            time.sleep(0.5)
            m, got = counted()
        c.measured(f"{mode}/{fs}", {"expected": SIZE, **{op: got[op] for op in names}})
        for op, name in names.items():
            c.record(f"{prefix}_{op}_bytes", got[op] == SIZE,
                     f"{context}: {name}{{mountpoint=\"{where}\",fstype=\"{fs}\"}} "
                     f"expected {SIZE}, got {got[op]:.0f}"
                     + (f" (off by {got[op] - SIZE:+.0f})" if got[op] != SIZE else "")
                     + f"; this cgroup's series: {bytes_by_mount(m, name, rel)}"
                     + ("" if got[op] == SIZE else f"\nagent log tail:\n{log.tail()}"))
        # nothing of this cgroup's I/O lands on another mount (the NFS
        # server's own reads and writes of the export are not the cgroup's)
        elsewhere = {op: {k: v for k, v in bytes_by_mount(m, name, rel).items()
                          if k != f"{where} ({fs})" and v}
                     for op, name in names.items()}
        c.record(f"{prefix}_no_bytes_elsewhere", not any(elsewhere.values()),
                 f"{context}: bytes counted on other mounts: {elsewhere}")
    except Exception as exc:    # one file system failing must not hide the others
        c.record(f"{prefix}_workload", False, f"{context}: {type(exc).__name__}: {exc}"
                 f"\nagent log tail:\n{log.tail()}")
    finally:
        try:
            os.unlink(path)
        except OSError:
            pass
        remove_cgroup(root + rel)


def one_mode(c: Checks, mode: str, filesystems: tuple[str, ...]) -> None:
    t0 = time.monotonic()
    try:
        agent = start_agent(mode)
    except (Exception, pytest.fail.Exception) as exc:
        c.record(f"{mode}_agent_started", False, f"{mode} mode: {exc}")
        return
    c.timing(f"{mode}_agent_start_s", time.monotonic() - t0)
    c.record(f"{mode}_agent_started", True, agent.url)
    log = AgentLog(agent)
    try:
        modes = io_modes(agent.scrape())
        c.record(f"{mode}_mode_attached",
                 modes.get("io.read") == mode and modes.get("io.write") == mode,
                 f"asked for {mode}; the agent reports {modes}")
        for fs in filesystems:
            one_file_system(c, agent, log, mode, fs)
    finally:
        try:
            stop_agent(agent)
            c.record(f"{mode}_agent_stopped", agent.proc.returncode == 0,
                     f"{mode} mode: the agent exited {agent.proc.returncode} on SIGTERM"
                     + ("" if agent.proc.returncode == 0 else f"\n{log.tail()}"))
        except (Exception, pytest.fail.Exception) as exc:
            c.record(f"{mode}_agent_stopped", False, f"{mode} mode: {exc}\n{log.tail()}")
    c.timing(f"{mode}_s", time.monotonic() - t0)


def setup(c: Checks) -> tuple[str, ...]:
    """Mount every file system; returns those that are there (a missing
    one's checks then never run, which the host side reports as a failure)."""
    t0 = time.monotonic()
    missing = [tool for tool in NFS_TOOLS if not shutil.which(tool, path=TOOL_PATH)]
    if missing:
        ok, transcript = False, (f"not installed: {' '.join(missing)}; the guest runs the host's "
                                 "binaries, so install nfs-kernel-server on the host")
    else:
        ok, transcript = run_recipe(NFS_RECIPE)
    found = {"nfs4": fstype_at(NFS_MOUNT)}
    c.record("nfs_mounted", ok and found["nfs4"] == "nfs4",
             f"{NFS_MOUNT} has fstype {found['nfs4']!r}\n{transcript}")
    c.timing("nfs_setup_s", time.monotonic() - t0)
    ok_local, transcript = run_recipe(LOCAL_RECIPE)
    found.update({fs: fstype_at(DIRS[fs]) for fs in ("tmpfs", "ext4")})
    c.record("local_mounted", ok_local and found["tmpfs"] == "tmpfs" and found["ext4"] == "ext4",
             f"{found}\n{transcript}")
    os.makedirs(_cgroup2_root() + CGROUP_PARENT, exist_ok=True)
    return tuple(fs for fs in FILESYSTEMS if found[fs] == fs)


def teardown() -> None:
    """Best effort: the VM is thrown away right after."""
    for step in (f"umount {NFS_MOUNT}", "rpc.nfsd 0", "exportfs -ua"):
        subprocess.run(["bash", "-c", f"timeout 30 {step}"], capture_output=True)


def main(results: Path) -> int:
    c = Checks(results)
    t0 = time.monotonic()
    # every file system exists before the agent starts, so its first mount
    # table already has them
    filesystems = setup(c)
    if filesystems:
        for mode in MODES:
            one_mode(c, mode, filesystems)
    teardown()
    c.timing("scenario_s", time.monotonic() - t0)
    return 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1])))
