"""`tracehound explain` in the VM, for chaos_guest_checks.py: a fault's
victim runs as a Slurm job (a cgroup of Slurm's cgroup/v2 layout,
system.slice/slurmstepd.scope/job_N/step_0: no slurmd runs in the VM, the
agent knows a job by its cgroup path), and node mode, asked of the guest's
agent, must rank the fault's rule first for that job.
"""
from __future__ import annotations

import json
import os
import subprocess
import time

import rdma_guest_kit as rg
from chaos_guest_run import TRACEHOUND


def job_cgroup(job: str) -> str:
    """The cgroup v2 path of the job's step 0, made."""
    path = f"/system.slice/slurmstepd.scope/job_{job}/step_0"
    os.makedirs(f"{rg.CG}{path}", exist_ok=True)
    return path


def remove_job_cgroup(job: str) -> None:
    for rel in (f"job_{job}/step_0", f"job_{job}"):
        try:
            os.rmdir(f"{rg.CG}/system.slice/slurmstepd.scope/{rel}")
        except OSError:
            pass


class JobWriter:
    """A rank of the job that checkpoints to DIRECTORY: a direct 64 KiB write
    every 0.1 s, going on through failures (as a training loop retries)."""

    SCRIPT = ("import mmap, os, sys, time\n"
              "fd = os.open(os.path.join(sys.argv[1], 'ckpt'), os.O_WRONLY | os.O_CREAT | "
              "os.O_DIRECT, 0o600)\n"
              "block = mmap.mmap(-1, 65536)\n"
              "block.write(b'x' * 65536)\n"
              "print('READY', flush=True)\n"
              "while True:\n"
              "    try:\n"
              "        os.pwrite(fd, block, 0)\n"
              "    except OSError:\n"
              "        pass\n"
              "    time.sleep(0.1)\n")

    def __init__(self, cgroup: str, directory: str):
        self.proc = subprocess.Popen(
            ["sh", "-c", 'echo $$ > "$0" && exec "$@"', f"{rg.CG}{cgroup}/cgroup.procs",
             rg.PY, "-c", self.SCRIPT, directory], stdout=subprocess.PIPE, text=True)
        if self.proc.stdout.readline().strip() != "READY":
            self.proc.kill()
            raise RuntimeError("the job's writer never started")

    def stop(self) -> None:
        self.proc.kill()
        self.proc.wait(timeout=30)


def rank_of(findings: list, rules: tuple, labels: dict) -> int:
    """1 for the first finding, ...: where RULE with LABELS stands; 0: absent."""
    return next((i + 1 for i, f in enumerate(findings)
                 if f["rule"] in rules and labels.items() <= f["labels"].items()), 0)


def explain_ranks_first(c, name: str, url: str, job: str, rule, labels: dict,
                        timeout: float = 60) -> None:
    """One check: node mode's first finding for JOB is RULE (one of them, when
    a tuple) with at least LABELS. Asked again while the agent has not yet
    counted what the fault did. Its timings: where the cause stood in the
    last answer (NAME_rank, 0 absent), the answer's own seconds and the
    CLI's (bench/explain/vm.py reports them)."""
    rules = rule if isinstance(rule, tuple) else (rule,)
    deadline, found, out, answer = time.monotonic() + timeout, [], None, {}
    while time.monotonic() < deadline:
        t0 = time.monotonic()
        out = subprocess.run([*TRACEHOUND, "explain", job, "--url", url, "--json"],
                             capture_output=True, text=True, timeout=120)
        cli_s = time.monotonic() - t0
        try:
            answer = json.loads(out.stdout)
            found = answer["findings"]
        except (ValueError, KeyError):
            answer, found = {}, []
        if rank_of(found, rules, labels) == 1:
            break
        time.sleep(1)
    rank = rank_of(found, rules, labels)
    c.timing(f"{name}_rank", rank)
    if answer.get("seconds") is not None:
        c.timing(f"{name}_answer_s", answer["seconds"])
        c.timing(f"{name}_cli_s", cli_s)
    c.record(name, rank == 1, f"first finding {(found or [None])[0]}\n"
                              + (f"{out.stdout[-2000:]}{out.stderr[-2000:]}" if out else ""))
