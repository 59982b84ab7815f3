"""Driving `tracehound chaos run` inside the VM for chaos_guest_checks.py:
one run with the real state watched while it is in flight, and the three
checks every experiment gets (detected, applied, rolled back)."""
from __future__ import annotations

import glob
import json
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import rdma_guest_kit as rg

REPO = rg.HERE.parents[1]
EXAMPLES = REPO / "examples"
TRACEHOUND = [rg.PY, "-m", "tracehound"]
# the report's plot needs matplotlib's font list: building it under emulation
# takes minutes, and $HOME is read-only in the guest, so keep one in /tmp
MPL_DIR = "/tmp/thchaos-matplotlib"
HOST_MPL_CACHE = Path.home() / ".cache" / "matplotlib"


class ChaosRun:
    """`tracehound chaos run examples/NAME --yes`, with every distinct state
    watch() returns while it is in flight."""

    def __init__(self, name: str, env: dict, watch, timeout: float = 300):
        self.tmp = tempfile.mkdtemp(prefix="thchaos-")
        self.journal = f"{self.tmp}/journal"
        env = {**os.environ, "CHAOS_HOLD_SECONDS": "1", "CHAOS_DETECT_TIMEOUT": "45",
               "MPLCONFIGDIR": MPL_DIR, **env}
        proc = subprocess.Popen(
            [*TRACEHOUND, "chaos", "run", str(EXAMPLES / name), "--yes", "--allow-code",
             "--journal", self.journal, "--report", f"{self.tmp}/report", "--no-plot"],
            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        out, err = rg.Lines(proc.stdout), rg.Lines(proc.stderr)
        self.seen: list = []
        deadline = time.monotonic() + timeout
        while proc.poll() is None and time.monotonic() < deadline:
            # The run changes nothing outside its journal's lifetime: the
            # journal is opened before the first step and every fault is
            # written to it before it is applied; "run-end" follows the last
            # rollback. Outside it, a look (a process or two for some
            # watchers) would only compete with the interpreter starting up
            # or writing its report.
            if self._journal_open():
                state = watch()
                if not self.seen or self.seen[-1] != state:
                    self.seen.append(state)
            time.sleep(0.05)
        if proc.poll() is None:
            proc.kill()
        self.code = proc.wait(timeout=30)
        # the reader threads have drained both pipes once they hit end of file
        out.closed.wait(30)
        err.closed.wait(30)
        self.out, self.err = out.text(), err.text()
        reports = glob.glob(f"{self.tmp}/report/*-journal.json")
        self.record = json.loads(Path(reports[0]).read_text()) if reports else {}

    def _journal_open(self) -> bool:
        files = glob.glob(f"{self.journal}/*.jsonl")
        return bool(files) and '"run-end"' not in Path(files[0]).read_text()

    def detection(self) -> dict:
        return next(iter(self.record.get("detections") or []), {})

    def context(self) -> str:
        brief = {k: self.record.get(k) for k in ("detections", "faults", "rollbacks")}
        return (f"exit {self.code}; states seen {self.seen}\nstdout:\n{self.out[-2500:]}\n"
                f"stderr:\n{self.err[-2500:]}\nreport: {json.dumps(brief)[-3000:]}")

    def cleanup(self) -> None:
        shutil.rmtree(self.tmp, ignore_errors=True)


def judge(c: rg.Checks, key: str, run: ChaosRun, before, applied, after,
          applied_when=None) -> None:
    """Three checks: detected (with an MTTD), really applied, rolled back."""
    d = run.detection()
    mttd = d.get("mttd_seconds")
    if mttd is not None:
        c.timing(f"{key}_mttd_s", mttd)
    c.record(f"{key}_detected", run.code == 0 and d.get("detected") is True
             and d.get("tracehound_signal") is True and mttd is not None,
             f"detection {d}\n{run.context()}")
    was_applied = applied_when(run.seen) if applied_when else applied in run.seen
    c.record(f"{key}_fault_applied", was_applied,
             f"expected {applied!r} while in flight\n{run.context()}")
    c.record(f"{key}_rolled_back", after == before,
             f"before {before!r}, after {after!r}\n{run.context()}")


def lifted_after(seen: list, applied, present=lambda state: state not in (None, ())) -> bool:
    """The state right after the fault's last applied state is the
    unfaulted one of a still present object (not merely its removal)."""
    hits = [i for i, state in enumerate(seen) if applied(state)]
    return bool(hits) and hits[-1] + 1 < len(seen) and present(seen[hits[-1] + 1])
