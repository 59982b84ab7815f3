"""`tracehound explain JOB`: what is wrong with this job, ranked."""
from __future__ import annotations


def add_parser(sub, hook=None) -> None:
    p = sub.add_parser(
        "explain", help="what is wrong with a job, ranked, across its nodes",
        description="Asks the fleet's Prometheus every rule in tracehound.explain.rules "
                    "(OOM kills, processes killed by a signal, GPU XIDs on the job's nodes, "
                    "I/O, fsync and RDMA verb errors, a stalled job, a node with more TCP "
                    "retransmissions or slower writes than the job's others) for one Slurm "
                    "job over a window, and ranks what holds: the worst first, and among "
                    "equals the earliest, so the top line is the likeliest cause. Prints "
                    "what the job did on each node (bytes read and written, CPU) above the "
                    "findings, or 'nothing abnormal'. Needs the fleet's Prometheus: the "
                    "node agent alone keeps no history to answer from. Exit 0 answered, "
                    "2 the question could not be asked (bad input, Prometheus unreachable).")
    p.add_argument("job", help="Slurm job id")
    p.add_argument("--prometheus", required=True, metavar="URL",
                   help="the fleet's Prometheus, scraping every node's agent")
    p.add_argument("--window", default="15m", metavar="DURATION",
                   help="how far back to look (default 15m)")
    p.add_argument("--node-label", default="instance", metavar="LABEL",
                   help="the label that names a node in Prometheus (default instance)")
    p.add_argument("--json", action="store_true", help="the answer as JSON")
    p.set_defaults(handler=cmd_explain)


def cmd_explain(args) -> int:
    from ..explain import render
    from ..explain.fleet import ExplainError, explain
    try:
        answer = explain(args.prometheus, args.job, args.window, args.node_label)
    except ExplainError as exc:
        print(f"tracehound: explain: {exc}", flush=True)
        return 2
    print(render.as_json(answer) if args.json else render.text(answer, args.prometheus),
          flush=True)
    return 0
