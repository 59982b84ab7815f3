"""The two faults of explain's accuracy benchmark that only the VM can make:
EIO from a failing device (a device-mapper disk switched to the error
target, examples/io-errors.yaml) and the RDMA memlock fault
(examples/rdma-memlock.yaml on soft-RoCE), each against a rank of a job
(a cgroup of Slurm's cgroup/v2 layout; no slurmd runs in the VM), asked of
the guest's agent in node mode: where the true cause stands, and how long
the answer took. The guest runs the VM tier's own script
(tests/vm/chaos_guest_checks.py, these two experiments only, with one vCPU
as in the tier), so the benchmark and the tests make the same faults.
Run as root after scripts/vm-setup:

    sudo .venv/bin/python -m bench.explain_vm      # about 5 min on an idle host

Writes explain-vm.md and explain-vm.json to bench/report (--out).
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

from bench.common import REPORT, commit, machine

REPO = Path(__file__).resolve().parents[2]
GUEST = REPO / "tests" / "vm" / "chaos_guest_checks.py"
# fault -> (the VM tier's experiment, its explain check, the true cause)
FAULTS = {
    "EIO (io.errors: a failing device under a checkpointing rank)":
        ("io_errors_experiment", "io_errors_explained", "write_errors"),
    "RDMA memlock (rdma.memlock: memory registration fails, ENOMEM)":
        ("memlock_experiment", "memlock_explained",
         "rdma_verb_errors or rdma_app_verb_errors, errno ENOMEM"),
}


def rows(checks: dict) -> list[dict]:
    out = []
    for fault, (_experiment, check, rule) in FAULTS.items():
        t = checks.get("timings", {})
        decided = checks.get("checks", {}).get(check, {})
        out.append({"fault": fault, "true_cause": rule, "rank": t.get(f"{check}_rank"),
                    "answer_s": t.get(f"{check}_answer_s"), "cli_s": t.get(f"{check}_cli_s"),
                    "ok": decided.get("ok", False),
                    "first": decided.get("detail", "").split("\n", 1)[0][:300]})
    return out


def markdown(meta: dict, got: list[dict]) -> str:
    def rank(r):
        return "absent" if not r["rank"] else f"{int(r['rank'])}"

    def secs(v):
        return "-" if v is None else f"{v:.3f} s"
    return "\n".join([
        "# `tracehound explain` on the faults only a VM makes", "",
        f"Commit {meta['commit']}, {meta['machine']}; {meta['when']}. Debian's "
        f"{meta['kernel']} kernel under virtme-ng (TCG, no KVM), booted in {meta['boot_s']} s. "
        "Regenerate: `sudo .venv/bin/python -m bench.explain_vm`.", "",
        "Each fault against a rank of a job, asked of the guest's agent in node mode "
        "(`tracehound explain JOB --url`). Emulation slows every absolute figure.", "",
        "| fault | true cause | rank of the true cause | answer (in process) | through the CLI |",
        "|---|---|---|---|---|",
        *(f"| {r['fault']} | `{r['true_cause']}` | **{rank(r)}** | {secs(r['answer_s'])} | "
          f"{secs(r['cli_s'])} |" for r in got), "",
        *(f"- {r['fault']}: {r['first']}" for r in got), ""])


def host(args) -> int:
    from testbed import vm as harness
    if os.geteuid() != 0:
        sys.exit("run as root: the VM is booted with the host's root file system")
    if (why := harness.is_available()):
        sys.exit(why)
    code = commit()
    xdir = Path(tempfile.mkdtemp(prefix="explain-vm-"))
    # the VM tier's own guest script, asked for these two experiments only
    experiments = ",".join(sorted({e for e, _check, _rule in FAULTS.values()}))
    try:
        t0 = time.monotonic()
        r = harness.run_in_vm(f"{sys.executable} {GUEST} {xdir} {experiments}",
                              timeout=args.vm_timeout, cwd=REPO, writable=[xdir], memory="3G",
                              cpus=1, stream=sys.stdout)
        path = xdir / "checks.json"
        if not path.exists():
            sys.exit(f"explain-vm: the guest wrote no results (exit {r.returncode})")
        got = rows(json.loads(path.read_text()))
        meta = {"commit": code, "machine": machine(), "kernel": r.kernel_release,
                "boot_s": round(r.boot_seconds, 1), "vm_s": round(time.monotonic() - t0, 1),
                "when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
    finally:
        shutil.rmtree(xdir, ignore_errors=True)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "explain-vm.json"), "w") as f:
        json.dump({"meta": meta, "faults": got}, f, indent=1)
    with open(os.path.join(args.out, "explain-vm.md"), "w") as f:
        f.write(markdown(meta, got))
    print(json.dumps(got, indent=1))
    return 0 if all(r["rank"] == 1 for r in got) else 1


def main() -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.explain_vm",
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=str(REPORT))
    ap.add_argument("--vm-timeout", type=float, default=1200)
    return host(ap.parse_args())


if __name__ == "__main__":
    sys.exit(main())
