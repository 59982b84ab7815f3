"""Undoing what runs that died (SIGKILL, crash, power loss) left applied."""
from __future__ import annotations

from . import faults as catalog
from .journal import Journal, dead_runs, release


def recover(directory: str, out, err) -> tuple[int, int]:
    """Roll back every pending fault of every dead run, newest first.
    Returns (rolled back, failed); each failure gets its own stderr line."""
    done = failed = 0
    for run in dead_runs(directory):
        journal = Journal.adopt(run.path, run.fd)
        out(f"tracehound: recovering run {run.run_id} ('{run.title}', pid {run.pid} is gone): "
            f"{len(run.faults)} fault(s) left applied")
        try:
            for pending in reversed(run.faults):
                what = f"{pending.fault} ({pending.action}) on {', '.join(pending.targets)}"
                try:
                    note = catalog.get(pending.fault).rollback(pending.state)
                except Exception as exc:   # every failure is reported, none stops the rest
                    journal.rollback_failed(pending.id, str(exc))
                    err(f"tracehound: ROLLBACK FAILED: {what}: {exc}")
                    failed += 1
                    continue
                journal.rolled_back(pending.id, note)
                out(f"tracehound: rolled back {what}" + (f" ({note})" if note else ""))
                done += 1
            journal.write({"event": "recovered", "failed": failed})
        finally:
            release(run)
    return done, failed
