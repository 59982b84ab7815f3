"""One GPU training node's exposition, recorded from a real agent: a Slurm
job step of 8 tasks (the v2 layout, cgroups root made as slurmstepd makes
them), each writing, syncing and reading on 5 mounts (the root ext4, an
ext4 scratch, two tmpfs for home and a dataset, /dev/shm), beside the
host's own cgroups, with the agent's defaults. Without a GPU here, the
node has no GPU series: a real one adds its GPUs' (not measured here)."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from contextlib import ExitStack, contextmanager
from typing import Iterator

from bench.common import log, tracehound
from testbed.cgroups import remove_cgroup

RANKS = 8
MIB = 1 << 20
# what a rank does on each mount, in the rank's own process once it joined
# its task's cgroup: a checkpoint shard written and synced, read back
RANK = """
import os, sys
with open(sys.argv[1], "w") as f:
    f.write(str(os.getpid()))
for d in sys.argv[3:]:
    path = os.path.join(d, sys.argv[2])
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    for _ in range(16):
        os.write(fd, b"x" * 65536)
    os.fsync(fd)
    os.close(fd)
    fd = os.open(path, os.O_RDONLY)
    while os.read(fd, 65536):
        pass
    os.close(fd)
    os.unlink(path)
"""


@contextmanager
def mounts() -> Iterator[list[str]]:
    """The node's five mounts, the three made here removed afterwards."""
    made, base = [], tempfile.mkdtemp(prefix="fleet-cost-")
    try:
        for name in ("home", "dataset"):
            d = os.path.join(base, name)
            os.mkdir(d)
            subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64m", name, d], check=True)
            made.append(d)
        image, scratch = os.path.join(base, "scratch.img"), os.path.join(base, "scratch")
        os.mkdir(scratch)
        with open(image, "wb") as f:
            f.truncate(128 * MIB)
        subprocess.run(["mkfs.ext4", "-q", "-F", image], check=True)
        subprocess.run(["mount", "-o", "loop", image, scratch], check=True)
        made.append(scratch)
        yield ["/var/tmp", "/dev/shm", *made]
    finally:
        for d in reversed(made):
            subprocess.run(["umount", "-l", d], check=False)
        subprocess.run(["rm", "-rf", base], check=False)


@contextmanager
def agent() -> Iterator[str]:
    """A real agent with its defaults but the hierarchy (the job's cgroups
    are made in the v2 tree) and an instance of its own; its URL."""
    proc = subprocess.Popen([*tracehound(), "run", "--listen", "127.0.0.1:0", "--instance",
                             f"fleet-cost-{uuid.uuid4().hex[:8]}", "--cgroup-key", "v2"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        url, deadline = None, time.monotonic() + 300
        while time.monotonic() < deadline:
            line = proc.stdout.readline()
            if not line:
                raise RuntimeError("the agent exited before it served")
            m = re.search(r"serving metrics on (https?://\S+?/metrics)", line)
            url = url or (m and m.group(1))
            if url and "io.rename" in line:
                break
        else:
            raise RuntimeError("the agent did not start")
        # its later lines are drained so that it never blocks on them
        subprocess.Popen(["cat"], stdin=proc.stdout, stdout=subprocess.DEVNULL)
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def scrape(url: str) -> str:
    with urllib.request.urlopen(url, timeout=30) as r:
        return r.read().decode()


def samples(text: str) -> list[str]:
    return [line for line in text.splitlines() if line and not line.startswith("#")]


def named(url: str, job: str, label_sets: int, timeout: float = 120) -> str:
    """The exposition once every task's writes on every mount carry the
    job's labels (the agent names a new cgroup on its own schedule)."""
    deadline = time.monotonic() + timeout
    while True:
        text = scrape(url)
        if sum(1 for s in samples(text) if s.startswith("tracehound_io_write_bytes_total{")
               and f'job_id="{job}"' in s) >= label_sets:
            return text
        if time.monotonic() > deadline:
            raise RuntimeError(f"the agent never named the job's {label_sets} label sets")
        time.sleep(0.5)


def record(cgroup_root: str = "/sys/fs/cgroup/unified") -> dict:
    """The exposition while the job runs, the job's id and the samples
    before it started; the job's cgroups removed afterwards."""
    job = str(700000 + int(uuid.uuid4().hex[:4], 16))
    step = f"/system.slice/slurmstepd.scope/job_{job}/step_0/user"
    tasks = [f"{step}/task_{i}" for i in range(RANKS)]
    with ExitStack() as stack:
        where = stack.enter_context(mounts())
        url = stack.enter_context(agent())
        before = samples(scrape(url))
        made = [d for d in (step.rsplit("/", k)[0] for k in (3, 2, 1, 0))
                if not os.path.isdir(cgroup_root + d)] + tasks
        for task in tasks:
            os.makedirs(cgroup_root + task)
        try:
            for i, task in enumerate(tasks):
                # the rank joins its task's cgroup before it touches a file
                done = subprocess.run(
                    ["sh", "-c", 'echo $$ > "$0" && exec "$@"', cgroup_root + task + "/cgroup.procs",
                     sys.executable, "-I", "-S", "-c", RANK, os.devnull, f"rank-{job}-{i}", *where],
                    capture_output=True, text=True, timeout=300)
                if done.returncode:
                    raise RuntimeError(f"rank {i}: {done.stderr[-2000:]}")
            text = named(url, job, RANKS * len(where))
        finally:
            for path in reversed(made):
                remove_cgroup(cgroup_root + path)
    # this host has no GPU: what its agent exports under tracehound_gpu_ are
    # the test suite's forged kernel-log lines (XIDs on made-up bus ids),
    # which every node of the fleet would otherwise repeat as faults
    text = "\n".join(line for line in text.splitlines()
                     if not re.match(r"(# (HELP|TYPE) )?tracehound_gpu_", line)) + "\n"
    got = samples(text)
    of_job = [s for s in got if f'job_id="{job}"' in s]
    log(f"node: {len(got)} samples, {len(of_job)} of the job ({len(before)} before it)")
    return {"job": job, "text": text, "samples": len(got), "of_job": len(of_job),
            "before": len(before), "mounts": len(where), "ranks": RANKS}


if __name__ == "__main__":
    r = record()
    print(json.dumps({k: v for k, v in r.items() if k != "text"}))
