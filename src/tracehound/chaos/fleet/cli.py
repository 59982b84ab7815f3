"""`tracehound chaos run EXPERIMENT --slurm|--kubernetes …` and
`tracehound chaos recover --slurm`: the fleet side of the chaos commands."""
from __future__ import annotations

import os
import shlex
import shutil
import sys

from ..exit_codes import EXIT_FAILED, EXIT_INTERRUPTED, EXIT_INVALID, EXIT_OK, EXIT_ROLLBACK

DEFAULT_MAX_SHARE = 10.0


def add_run_arguments(r) -> None:
    g = r.add_argument_group(
        "fleet (through Slurm)",
        "--slurm fans the experiment out: each chosen node runs the ordinary local run "
        "through srun (its own journal, rollback always); the fleet journal records each "
        "launch first. The experiment file and --report must be on a file system every "
        "node sees.")
    g.add_argument("--slurm", action="store_true", help="run on Slurm nodes (pick them below)")
    g.add_argument("--nodes", metavar="LIST", help="these nodes (a Slurm host list: n[1-4])")
    g.add_argument("--partition", metavar="P",
                   help="draw from this partition's idle nodes (default: the default one)")
    g.add_argument("--count", type=int, metavar="K", help="K idle nodes, drawn at random")
    g.add_argument("--percent", type=float, metavar="X",
                   help="X%% of the idle nodes, rounded down, at least 1, drawn at random")
    g.add_argument("--seed", type=int, help="the draw's seed (printed; the same seed and "
                                            "idle nodes draw the same nodes)")
    g.add_argument("--job", metavar="ID", help="the nodes of this running job (or those of "
                   "them --nodes names), reached inside its allocation (srun --jobid ID "
                   "--overlap)")
    g.add_argument("--max-parallel", type=int, default=1, metavar="N",
                   help="nodes per wave (default 1)")
    g.add_argument("--wave-pause", type=float, default=0.0, metavar="S",
                   help="seconds between waves (default 0)")
    g.add_argument("--max-share", type=float, default=DEFAULT_MAX_SHARE, metavar="PCT",
                   help=f"refuse a run on more than PCT%% of the partition (default "
                        f"{DEFAULT_MAX_SHARE:g})")
    g.add_argument("--allow-blast-radius", action="store_true",
                   help="run even above --max-share")
    g.add_argument("--prometheus", metavar="URL",
                   help="the fleet's Prometheus: --abort-when is asked of it, and the report "
                        "asks it whether each node's instance showed the fault")
    g.add_argument("--abort-when", metavar="PROMQL",
                   help="stop the fleet when this query returns a non-zero sample: no new "
                        "node starts and every running node rolls back")
    g.add_argument("--abort-interval", type=float, default=5.0, metavar="S",
                   help="how often --abort-when is asked (default 5 s)")
    g.add_argument("--node-label", default="instance", metavar="LABEL",
                   help="the label whose value is the node's name (optionally with a domain "
                        "or :port) in Prometheus (default instance)")
    g.add_argument("--detect-timeout", type=float, default=60.0, metavar="S",
                   help="how long the report waits for Prometheus to show a node's fault "
                        "(default 60 s)")
    g.add_argument("--immediate", type=int, default=60, metavar="S",
                   help="give up on a node not allocatable within S seconds (default 60)")
    g.add_argument("--stop-timeout", type=float, default=120.0, metavar="S",
                   help="after an abort, how long a node may take to roll back before its "
                        "srun is killed (default 120)")
    g.add_argument("--node-command", metavar="CMD",
                   help="how a node starts tracehound (default: this tracehound's path)")
    g.add_argument("--kubernetes", action="store_true",
                   help="one Job per node of --nodes, applied with kubectl (--dry-run prints "
                        "them); untested: no API server runs where tracehound is tested")
    g.add_argument("--image", default="tracehound:latest",
                   help="--kubernetes: the image the Jobs run")


def add_recover_arguments(rc) -> None:
    rc.add_argument("--slurm", action="store_true",
                    help="recover every node a dead fleet run launched on (through srun)")
    rc.add_argument("--node-command", metavar="CMD",
                    help="how a node starts tracehound (default: this tracehound's path)")


def wanted(args) -> bool:
    return bool(getattr(args, "slurm", False) or getattr(args, "kubernetes", False))


def node_command(text: str | None) -> list[str]:
    if text:
        return shlex.split(text)
    here = os.path.join(os.path.dirname(sys.executable), "tracehound")
    if os.path.exists(here):
        return [here]
    found = shutil.which("tracehound")
    return [os.path.abspath(found)] if found else [sys.executable, "-m", "tracehound"]


def _usage(args) -> str | None:
    # --nodes with --job narrows the job's nodes
    nodes = args.nodes if args.job is None else None
    picks = [f for f, v in (("--nodes", nodes), ("--count", args.count),
                            ("--percent", args.percent), ("--job", args.job)) if v is not None]
    if len(picks) != 1:
        return ("give exactly one of --nodes, --count, --percent, --job"
                + (f" (got {', '.join(picks)})" if picks else ""))
    if args.job is not None and args.partition:
        return "--job takes the job's own nodes: leave --partition out"
    if args.max_parallel < 1:
        return "--max-parallel must be at least 1"
    if args.wave_pause < 0 or args.abort_interval <= 0 or args.detect_timeout < 0:
        return "--wave-pause, --abort-interval and --detect-timeout must be positive"
    if not 0 < args.max_share <= 100:
        return "--max-share is a percentage above 0 and at most 100"
    if args.abort_when and not args.prometheus:
        return "--abort-when needs --prometheus URL to ask"
    if args.kubernetes and args.slurm:
        return "--slurm or --kubernetes, not both"
    return None


def cmd_run(args, exp, out, err) -> int:
    """The experiment is loaded and valid; args.file is its path."""
    from . import plan as planning
    from . import slurm
    why = _usage(args)
    if why:
        err(f"tracehound: chaos run: {why}")
        return EXIT_INVALID
    experiment = os.path.abspath(args.file)
    dry = args.dry_run or (exp.destructive and not args.yes)
    if args.kubernetes:
        from . import kubernetes
        return kubernetes.cmd_run(args, experiment, dry, out, err)
    try:
        plan = planning.choose(args.partition, args.nodes, args.count, args.percent, args.job,
                               args.seed)
        out(f"tracehound: fleet: {describe(plan)}")
        planning.check_blast_radius(plan, args.max_share / 100, args.allow_blast_radius)
    except (planning.PlanError, slurm.SlurmError) as exc:
        err(f"tracehound: chaos run: {exc}; nothing was launched")
        return EXIT_FAILED
    if dry:
        from .journal import node_journal
        from .launcher import node_run_argv
        run = "20000101T000000-00000000"        # a placeholder the run's own id replaces
        out("tracehound: fleet: dry run, nothing launched"
            + ("" if args.dry_run else " (destructive faults: pass --yes)") + "; each node runs:")
        out("  " + shlex.join(slurm.srun_argv(
            "NODE", node_run_argv(node_command(args.node_command), experiment,
                                  node_journal(args.journal, run, "NODE"),
                                  os.path.join(os.path.abspath(args.report),
                                               f"fleet-{run}", "nodes", "NODE"),
                                  args.allow_code),
            plan.partition, plan.job_id, args.immediate, f"tracehound-chaos-{run}")))
        return EXIT_OK
    if exp.code and not args.allow_code:
        err(f"tracehound: chaos run: refusing {args.file} without --allow-code: "
            f"{len(exp.code)} activities run code of the file's choosing (see "
            "'tracehound chaos validate'); nothing was launched")
        return EXIT_FAILED
    return _launch(args, exp, experiment, plan, out, err)


def describe(plan) -> str:
    how = {"nodes": "the nodes named", "job": f"the nodes of job {plan.job_id}",
           "count": f"{len(plan.nodes)} idle node(s) drawn with seed {plan.seed}",
           "percent": f"{len(plan.nodes)} idle node(s) drawn with seed {plan.seed}"}[plan.how]
    return (f"{how}: {', '.join(plan.nodes)} ({len(plan.nodes)} of {plan.partition_size} in "
            f"partition {plan.partition}, {plan.share:.0%})")


def _launch(args, exp, experiment, plan, out, err) -> int:
    from ..journal import new_run_id
    from ..trust import UntrustedFile
    from . import render, report
    from .launcher import Launcher, Options
    opts = Options(max_parallel=args.max_parallel, wave_pause_s=args.wave_pause,
                   abort_when=args.abort_when, prometheus=args.prometheus,
                   abort_interval_s=args.abort_interval, immediate_s=args.immediate,
                   stop_timeout_s=args.stop_timeout, allow_code=args.allow_code,
                   node_command=node_command(args.node_command))
    run_id = new_run_id()
    report_dir = os.path.join(os.path.abspath(args.report), f"fleet-{run_id}")
    try:
        launch = Launcher(experiment, exp.title, plan, opts, args.journal, report_dir, run_id,
                          out, err).run()
    except UntrustedFile as exc:
        err(f"tracehound: chaos run: refusing the journal: {exc}")
        return EXIT_FAILED
    except OSError as exc:
        err(f"tracehound: chaos run: {exc.filename or ''}: {exc.strerror}")
        return EXIT_FAILED
    fleet = report.build(launch, report_dir, args.prometheus, args.node_label,
                         args.detect_timeout if launch["status"] == "completed" else
                         min(args.detect_timeout, 10))
    paths = render.write(fleet, report_dir, plot=not args.no_plot)
    out(f"tracehound: fleet: '{exp.title}' {fleet['status']}: landed on "
        f"{len(fleet['landed'])} of {len(plan.nodes)} node(s)"
        + ("".join(f"; {n}: {why}" for n, why in sorted(fleet["failed_nodes"].items()))
           if fleet["status"] == "failed" else ""))
    for row in fleet["summary"]:
        for source in ("agent", "prometheus"):
            s = row[source]
            if s["asked"]:
                out(f"tracehound: fleet: {row['fault']}: seen by {source} on {s['detected']} of "
                    f"{s['asked']}, MTTD p50 {s['mttd_p50']} s, max {s['mttd_max']} s")
    for kind, path in paths.items():
        out(f"tracehound: fleet {kind}: {path}")
    nodes = fleet["nodes"].values()
    if any(i.get("killed") or "rollback failed" in str(i["status"]) for i in nodes):
        return EXIT_ROLLBACK
    if launch["status"] == "interrupted":
        return EXIT_INTERRUPTED
    ok = launch["status"] == "completed" and all(i["status"] == "completed" for i in nodes)
    return EXIT_OK if ok else EXIT_FAILED


def cmd_recover(args, out, err) -> int:
    from . import recover
    return recover.recover_fleet(args.journal, node_command(args.node_command), out, err)
