"""A busy but healthy node, for false-alarm soaks: fio doing rate-limited
random I/O, a TCP job streaming between two network namespaces, short jobs
starting and ending every few seconds, and a CPU load below saturation, each
in its own cgroup under /thsoak. Used by tests/kernel/test_soak.py (short)
and bench/soak (ten minutes)."""
from __future__ import annotations

import os
import shutil
import subprocess
import threading
import time

from tracehound.chaos import scaffold
from tracehound.chaos.faults.targets import cgroup2_root

ROOT_CGROUP = "/thsoak"
NETNS = ("thsoak-a", "thsoak-b")
IFACES = ("thsoak0", "thsoak1")
ADDRS = ("10.207.0.1/24", "10.207.0.2/24")
# the agent flags a soak runs under: stall rules at their most eager
# the mix's cgroups are v2 ones: on a hybrid host the agent's own choice is
# the v1 freezer hierarchy (where Slurm's jobs are), which would see none
AGENT_FLAGS = ("--stall-after", "5", "--stall-cgroups", "/thsoak/.*", "--cgroup-key", "v2")


def _dir(cgroup: str) -> str:
    return os.path.join(cgroup2_root(), cgroup.strip("/"))


def _in_cgroup(cgroup: str, argv: list[str], **kw) -> subprocess.Popen:
    procs = os.path.join(_dir(cgroup), "cgroup.procs")
    os.makedirs(os.path.dirname(procs), exist_ok=True)
    return subprocess.Popen(["sh", "-c", 'echo $$ > "$0" && exec "$@"', procs, *argv],
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True, **kw)


class SoakMix:
    def __init__(self, workdir: str = "/var/tmp/thsoak", short_job_every_s: float = 3.0):
        self.workdir = workdir
        self.every = short_job_every_s
        self.procs: list[subprocess.Popen] = []
        self.short_jobs = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> "SoakMix":
        os.makedirs(self.workdir, exist_ok=True)
        for which in ("fio", "tcp", "cpu"):
            os.makedirs(_dir(f"{ROOT_CGROUP}/{which}"), exist_ok=True)
        self.procs.append(_in_cgroup(f"{ROOT_CGROUP}/fio", [
            "fio", "--name=soak", f"--directory={self.workdir}", "--rw=randrw", "--bs=64k",
            "--size=32m", "--rate=2m,2m", "--time_based", "--runtime=86400",
            "--ioengine=psync", "--fsync=32"]))
        scaffold.make_netns_pair(*NETNS, *IFACES, *ADDRS)
        scaffold.start_tcp_stream(f"{ROOT_CGROUP}/tcp", *NETNS, ADDRS[1].split("/")[0],
                                  chunk=16384, interval=0.02)
        self.procs.append(_in_cgroup(f"{ROOT_CGROUP}/cpu", [
            "stress-ng", "--cpu", "1", "--cpu-load", "40", "--timeout", "86400s", "--quiet",
            "--temp-path", self.workdir]))
        self._thread = threading.Thread(target=self._short_jobs, daemon=True)
        self._thread.start()
        return self

    def _short_jobs(self) -> None:
        """A job that writes and syncs a file, and one that only computes,
        turn about; each ends within a second or two and its cgroup goes."""
        n = 0
        while not self._stop.wait(self.every):
            n += 1
            cgroup = f"{ROOT_CGROUP}/short-{n}"
            if n % 2:
                argv = ["dd", "if=/dev/zero", f"of={self.workdir}/short-{n}", "bs=1M",
                        "count=8", "conv=fsync", "status=none"]
            else:
                argv = ["python3", "-c", "sum(i * i for i in range(2_000_000))"]
            proc = _in_cgroup(cgroup, argv)
            proc.wait()
            try:
                os.unlink(f"{self.workdir}/short-{n}")
            except FileNotFoundError:
                pass
            scaffold.stop_workload(cgroup)
            self.short_jobs += 1

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=30)
        for which in ("fio", "tcp", "cpu"):
            scaffold.stop_workload(f"{ROOT_CGROUP}/{which}")
        for p in self.procs:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()
        scaffold.delete_netns(list(NETNS))
        top = _dir(ROOT_CGROUP)
        for entry in os.listdir(top) if os.path.isdir(top) else []:
            if os.path.isdir(os.path.join(top, entry)):
                scaffold.stop_workload(f"{ROOT_CGROUP}/{entry}")
        try:
            os.rmdir(_dir(ROOT_CGROUP))
        except OSError:
            pass
        shutil.rmtree(self.workdir, ignore_errors=True)

    def __enter__(self) -> "SoakMix":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def watch_events(url: str, seconds: float, poll_s: float = 1.0) -> list[dict]:
    """Every anomaly event the agent raises during `seconds`."""
    import json
    import urllib.request
    events_url = url.removesuffix("/metrics") + "/events"
    with urllib.request.urlopen(events_url, timeout=10) as r:
        since = json.load(r)["next"]
    got: list[dict] = []
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        time.sleep(poll_s)
        with urllib.request.urlopen(f"{events_url}?since={since}", timeout=10) as r:
            page = json.load(r)
        got += page["events"]
        since = page["next"]
    return got
