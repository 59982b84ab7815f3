"""`tracehound chaos validate|run|recover|list`."""
from __future__ import annotations

import os
import sys

from .journal import DEFAULT_DIR

from .exit_codes import (EXIT_FAILED, EXIT_INTERRUPTED, EXIT_INVALID, EXIT_OK,  # noqa: F401
                         EXIT_QUARANTINED, EXIT_ROLLBACK, EXIT_ALIVE)
ALLOW_CODE_HELP = ("consent to the experiment's python and process providers (and "
                   "gpu.nccl's job): they run any code, as root under sudo")

def out(line: str) -> None:
    print(line, flush=True)


def err(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def add_parser(sub, hook=None) -> None:
    chaos = sub.add_parser(
        "chaos", help="chaos experiments: apply faults, measure detection (MTTD)",
        description="Chaos Toolkit-compatible experiments with tracehound's fault catalog "
                    "and detection probes. Every fault is journaled before it is applied "
                    "and rolled back at the end, on SIGINT/SIGTERM, or by "
                    "'tracehound chaos recover' after a crash.")
    actions = chaos.add_subparsers(dest="chaos_command", metavar="ACTION")
    v = actions.add_parser("validate", help="check an experiment file; explain every problem")
    v.add_argument("file")
    v.add_argument("--allow-code", action="store_true",
                   help="also import python providers' modules to check their functions "
                        "and arguments (importing runs the module's code)")
    v.set_defaults(handler=cmd_validate)
    r = actions.add_parser("run", help="run an experiment (destructive faults need --yes)")
    r.add_argument("file")
    r.add_argument("--dry-run", action="store_true",
                   help="show what would be done (targets, blast radius) and change nothing")
    r.add_argument("--yes", action="store_true",
                   help="really apply destructive faults (without it they are a dry run)")
    r.add_argument("--allow-code", action="store_true", help=ALLOW_CODE_HELP)
    r.add_argument("--journal", default=DEFAULT_DIR, metavar="DIR",
                   help=f"fault journal directory (default {DEFAULT_DIR})")
    r.add_argument("--report", default="chaos-reports", metavar="DIR",
                   help="where the JSON journal, Markdown report and plot go "
                        "(default ./chaos-reports)")
    r.add_argument("--no-plot", action="store_true",
                   help="skip the timeline plot (matplotlib is slow to load on small or "
                        "emulated machines)")
    from .fleet.cli import add_recover_arguments, add_run_arguments
    add_run_arguments(r)
    r.set_defaults(handler=cmd_run)
    rc = actions.add_parser("recover", help="roll back faults left by runs that died")
    rc.add_argument("--journal", default=DEFAULT_DIR, metavar="DIR",
                    help=f"fault journal directory (default {DEFAULT_DIR})")
    add_recover_arguments(rc)
    rc.set_defaults(handler=cmd_recover)
    ls = actions.add_parser("list", help="the fault catalog and what works on this host")
    ls.set_defaults(handler=cmd_list)
    chaos.set_defaults(handler=lambda _args: chaos.print_help() or EXIT_INVALID)


def _load(path: str, allow_code: bool = False, trusted_only: bool = False):
    """(experiment, None) or (None, exit code) after printing every problem.
    trusted_only: refuse a file others could have written (root runs)."""
    from .document import DocumentError, load
    from .schema import validate
    from .trust import UntrustedFile, check_directories, check_stat
    try:
        doc = load(path)
    except DocumentError as exc:
        where = f"{path}:{exc.line}" if exc.line else path
        err(f"{where}: {exc.message}")
        err(f"{path}: not a usable experiment; nothing was run")
        return None, EXIT_INVALID
    if trusted_only:
        try:   # before validation: with consent, that imports modules the file names
            check_stat(doc.stat, path, "the experiment")
            check_directories(os.path.dirname(os.path.abspath(path)), "experiment")
        except UntrustedFile as exc:
            err(f"tracehound: chaos run: refusing {path}: {exc}")
            err(f"{path}: someone besides root and you could have written it; nothing was run")
            return None, EXIT_FAILED
    problems, exp = validate(doc, allow_code)
    for p in problems:
        err(p.format(path))
    if problems:
        err(f"{path}: {len(problems)} problem(s); nothing was run")
        return None, EXIT_INVALID
    return exp, None


def _code_lines(exp) -> list[str]:
    return [f"  {c.line()}" for c in exp.code]


def cmd_validate(args) -> int:
    exp, code = _load(args.file, args.allow_code)
    if exp is None:
        return code
    faults = ", ".join(f for _, f in exp.faults) or "none"
    out(f"{args.file}: valid experiment '{exp.title}': {len(exp.method)} method "
        f"activities, {len(exp.rollbacks)} rollback(s), faults: {faults}")
    if exp.code:
        out(f"{args.file}: RUNS CODE: {len(exp.code)} activities run programs or Python "
            "code of the file's choosing, as the user running tracehound (root for faults); "
            "'chaos run' needs --allow-code:")
        for line in _code_lines(exp):
            out(line)
    else:
        out(f"{args.file}: runs no code of its own (no python or process provider)")
    for note in exp.notes:
        out(f"{args.file}: note: {note}")
    return EXIT_OK


def cmd_run(args) -> int:
    exp, code = _load(args.file, args.allow_code, trusted_only=os.geteuid() == 0)
    if exp is None:
        return code
    from .fleet import cli as fleet_cli
    if fleet_cli.wanted(args):
        return fleet_cli.cmd_run(args, exp, out, err)
    unavailable = [(a, f, exp.availability[f].reason) for a, f in exp.faults
                   if not exp.availability[f].ok]
    for action, fault, reason in unavailable:
        err(f"{args.file}: {action}: {fault} is not available here: {reason}")
    dry = args.dry_run or (exp.destructive and not args.yes)
    if dry:
        code = _plan(exp, args, explicit=args.dry_run)
        return EXIT_FAILED if unavailable else code
    if unavailable:
        err(f"{args.file}: nothing was run")
        return EXIT_FAILED
    if exp.code and not args.allow_code:
        err(f"tracehound: chaos run: refusing {args.file} without --allow-code: "
            f"{len(exp.code)} activities run code of the file's choosing:")
        for line in _code_lines(exp):
            err(line)
        err(f"{args.file}: read them, then pass --allow-code to consent; nothing was run")
        return EXIT_FAILED
    if exp.faults and os.geteuid() != 0:
        err("tracehound: chaos run: applying faults needs root")
        return EXIT_FAILED
    from .recovery import recover
    from .trust import UntrustedFile
    try:
        _, failed, _ = recover(args.journal, out, err)
    except PermissionError as exc:
        err(f"tracehound: chaos run: cannot read the journal {exc.filename}: {exc.strerror} "
            "(pass --journal DIR for one of your own)")
        return EXIT_FAILED
    except UntrustedFile as exc:
        err(f"tracehound: chaos run: refusing the journal: {exc}")
        return EXIT_FAILED
    if failed:
        err("tracehound: faults from an earlier run could not be rolled back; fix that "
            "first (tracehound chaos recover)")
        return EXIT_ROLLBACK
    from . import report
    from .runner import Runner
    try:
        record = Runner(exp, os.path.abspath(args.file), args.journal, out, err).run()
        paths = report.write(record, args.report, plot=not args.no_plot)
    except OSError as exc:   # journal or report directory unusable
        err(f"tracehound: chaos run: {exc.filename or ''}: {exc.strerror}")
        return EXIT_FAILED
    except UntrustedFile as exc:
        err(f"tracehound: chaos run: refusing the journal: {exc}")
        return EXIT_FAILED
    out(f"tracehound: experiment '{exp.title}': {record['status']}")
    for kind, path in paths.items():
        out(f"tracehound: {kind}: {path}")
    if record["rollback_failures"]:
        return EXIT_ROLLBACK
    if record["status"].startswith("interrupted"):
        return EXIT_INTERRUPTED
    return EXIT_OK if record["status"] == "completed" else EXIT_FAILED


def _plan(exp, args, explicit: bool) -> int:
    from . import faults as catalog
    from .faults import FaultError
    why = "--dry-run" if explicit else (
        "it has destructive faults (" + ", ".join(sorted({f for _, f in exp.faults
                                                          if catalog.get(f).destructive}))
        + "): pass --yes to apply them")
    out(f"tracehound: dry run of '{exp.title}', nothing is applied: {why}")
    if exp.hypothesis:
        out(f"  steady-state hypothesis '{exp.hypothesis['title']}': "
            f"{len(exp.hypothesis['probes'])} probe(s), checked before, after, after rollback")
    for i, act in enumerate(exp.method, 1):
        p = act["provider"]
        out(f"  {i}. {act['type']} '{act['name']}' ({p['type']})")
        if p["type"] != "tracehound" or "fault" not in p:
            continue
        fault = catalog.get(p["fault"])
        args_ = fault.with_defaults(p.get("arguments") or {})
        avail = exp.availability[p["fault"]]
        out(f"     fault {fault.name}{' [destructive]' if fault.destructive else ''}: "
            + ("available" if avail.ok else "NOT available") + (f" ({avail.reason})"
                                                               if avail.reason else ""))
        try:
            prepared = fault.prepare(args_, "dry-run")
            out(f"     would affect: {'; '.join(prepared.targets)}")
            for note in prepared.notes:
                out(f"     note: {note}")
        except (FaultError, OSError) as exc:
            out(f"     targets are resolved when it runs: {exc}")
        det = fault.detection(args_)
        out("     detection: " + (f"{det.query} {det.signal} {det.predicate}" if det.query
                                   else f"none ({det.note})"))
    for act in exp.rollbacks:
        out(f"  rollback '{act['name']}' ({act['provider']['type']})")
    if exp.code:
        out(f"  runs code: {len(exp.code)} activities run code of the file's choosing"
            + ("" if args.allow_code else " (a real run needs --allow-code)") + ":")
        for line in _code_lines(exp):
            out("  " + line)
    return EXIT_OK


def cmd_recover(args) -> int:
    if getattr(args, "slurm", False):
        from .fleet import cli as fleet_cli
        return fleet_cli.cmd_recover(args, out, err)
    from .recovery import recover
    from .trust import UntrustedFile
    alive: list[str] = []
    try:
        done, failed, bad = recover(args.journal, out, err, alive)   # a missing journal: nothing
    except PermissionError as exc:
        err(f"tracehound: error: cannot recover: {exc.filename}: {exc.strerror} "
            "(the journal is root's: run as root)")
        return EXIT_FAILED
    except UntrustedFile as exc:
        err(f"tracehound: error: cannot recover: refusing the journal: {exc}")
        return EXIT_FAILED
    for path in alive:
        out(f"tracehound: a live run holds {path}: not recovered (it rolls back itself when "
            "it ends; stop it first)")
    if not done and not failed and not alive:
        out("tracehound: nothing to recover: no dead run left a fault applied "
            "or a rollback not run")
    else:
        out(f"tracehound: recovered {done} fault(s) and rollback(s), {failed} failed")
    if bad:
        out(f"tracehound: {len(bad)} bad journal(s) quarantined: "
            + ", ".join(q.moved_to or q.path for q in bad))
    if failed:
        return EXIT_ROLLBACK
    if alive:
        return EXIT_ALIVE
    return EXIT_QUARANTINED if bad else EXIT_OK


def cmd_list(args) -> int:
    from . import faults as catalog
    for name, fault in sorted(catalog.catalog().items()):
        avail = fault.availability()
        placeholders = {k: f"<{k}>" for k in fault.args}
        det = fault.detection({**placeholders, **fault.with_defaults({})})
        tags = ", ".join([fault.where] + (["destructive"] if fault.destructive else []))
        out(f"{name:<16} [{tags}] {fault.summary}")
        out(f"{'':<4}here:    {'yes' if avail.ok else 'no'}"
            + (f" ({avail.reason})" if avail.reason else ""))
        out(f"{'':<4}detects: " + (f"{det.query} {det.signal} {det.predicate}" if det.query
                                  else f"nothing ({det.note})"))
    return EXIT_OK
