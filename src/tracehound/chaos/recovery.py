"""Undoing what runs that died (SIGKILL, crash, power loss) left applied."""
from __future__ import annotations

from . import faults as catalog
from . import providers
from .journal import Journal, Quarantined, dead_runs, release


def recover(directory: str, out, err, alive: list[str] | None = None
            ) -> tuple[int, int, list[Quarantined]]:
    """Roll back every pending fault of every dead run, newest first, then
    run the experiment's declared rollbacks it never ran (stopping its helper
    workloads, removing what they made). Returns (done, failed, the bad
    journals moved aside); each failure and each bad journal gets its own
    stderr line. The journals live runs hold are added to `alive`."""
    done = failed = 0
    quarantined: list[Quarantined] = []
    runs = dead_runs(directory, quarantined, alive)
    for bad in quarantined:
        where = f"moved to {bad.moved_to}" if bad.moved_to else "left where it is"
        err(f"tracehound: QUARANTINED journal {bad.path} ({where}): {bad.reason}; "
            "what it recorded is not rolled back: check by hand")
    for run in runs:
        journal = Journal.adopt(run.path, run.fd)
        out(f"tracehound: recovering run {run.run_id} ('{run.title}', pid {run.pid} is gone): "
            f"{len(run.faults)} fault(s) left applied, "
            f"{len(run.rollbacks)} declared rollback(s) not run")
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
            d, f = _declared_rollbacks(run, journal, out, err)
            done, failed = done + d, failed + f
            journal.write({"event": "recovered", "failed": failed})
        finally:
            release(run)
    return done, failed, quarantined


def _declared_rollbacks(run, journal, out, err) -> tuple[int, int]:
    done, failed = 0, []
    for i, act in enumerate(run.rollbacks):
        provider = act.get("provider") or {}
        call = providers.GENERIC.get(provider.get("type"))
        if call is None:
            continue       # a tracehound rollback undoes a fault: done above
        try:
            call(provider)
        except Exception as exc:   # reported; the others still run
            err(f"tracehound: ROLLBACK FAILED: the experiment's rollback '{act.get('name')}': {exc}")
            failed.append(i)
            continue
        out(f"tracehound: ran the experiment's rollback '{act.get('name')}'")
        done += 1
    if run.rollbacks:
        # the ones that failed stay pending for the next recover
        journal.rollbacks_run("recover", failed)
    return done, len(failed)
