"""`tracehound explain JOB`: what is wrong with this job, ranked."""
from __future__ import annotations


def add_parser(sub, hook=None) -> None:
    p = sub.add_parser(
        "explain", help="what is wrong with a job, ranked, across its nodes",
        description="Asks the fleet's Prometheus every rule in tracehound.explain.rules "
                    "(OOM kills, processes killed by a signal, GPU XIDs on the job's nodes, "
                    "I/O, fsync and RDMA verb errors, stopped processes, a stalled job, a node "
                    "with more TCP retransmissions or slower writes than the job's others) "
                    "for one Slurm job over its own time (its start to its end, or now: "
                    "from squeue or sacct where Slurm answers, else from the job's first and "
                    "last series), and ranks what holds: the worst "
                    "first, and among equals the earliest, so the top line is the likeliest "
                    "cause. Prints "
                    "what the job did on each node (bytes read and written, CPU) above the "
                    "findings, or 'nothing abnormal'. Without --prometheus it asks this "
                    "node's agent (--url) instead: the counting rules over the job's life "
                    "on this node, GPU XIDs from the agent's event log while the job ran "
                    "(the last --window, default 15m, where Slurm does not say), "
                    "stopped processes and a stall now; comparing a node with the job's "
                    "others needs Prometheus. "
                    "Exit 0 answered, 2 the question could not be asked (bad input, "
                    "Prometheus or the agent unreachable, a --node-label no series has), 3 "
                    "nothing could be judged: no agent has series of the job, or nothing "
                    "abnormal was seen where an agent lost data (a full map, folded series, "
                    "a truncated walk, a missed scrape).")
    p.add_argument("job", help="Slurm job id")
    p.add_argument("--prometheus", metavar="URL",
                   help="the fleet's Prometheus, scraping every node's agent (fleet mode)")
    p.add_argument("--url", metavar="URL", default=None,
                   help="without --prometheus: this node's agent (default "
                        "$TRACEHOUND_METRICS_URL, else, as root, the local agent's root-only "
                        "channel unix:/run/tracehound/default.sock/metrics where it runs, "
                        "else http://127.0.0.1:9560/metrics)")
    p.add_argument("--node", metavar="NAME", default=None,
                   help="without --prometheus: the name this node goes by (default its "
                        "hostname)")
    p.add_argument("--window", default=None, metavar="DURATION",
                   help="only the job's last DURATION (e.g. 15m, 2h; default: its whole life)")
    p.add_argument("--node-label", default="node", metavar="LABEL",
                   help="with --prometheus: the label that names a node (default node, as "
                        "deploy/prometheus/scrape.yml labels each target)")
    p.add_argument("--timeline", action="store_true",
                   help="with --prometheus: the job's signals per node over the window (write "
                        "and read bandwidth, write latency, TCP retransmissions, stopped "
                        "processes; 5 more queries), the findings marked where they began")
    p.add_argument("--plot", metavar="FILE.png",
                   help="with --prometheus: the timeline as a picture (needs matplotlib)")
    p.add_argument("--json", action="store_true", help="the answer as JSON")
    p.set_defaults(handler=cmd_explain)


def cmd_explain(args) -> int:
    from ..explain import render
    from ..explain.answer import ExplainError
    if args.prometheus and (args.url or args.node):
        print("tracehound: explain: --url and --node are for one node's agent; with "
              "--prometheus every node is asked", flush=True)
        return 2
    if (args.timeline or args.plot) and not args.prometheus:
        print("tracehound: explain: --timeline and --plot need --prometheus: the node's "
              "agent keeps no history", flush=True)
        return 2
    try:
        if args.prometheus:
            from ..explain.fleet import explain
            url = args.prometheus
            answer = explain(url, args.job, args.window, args.node_label,
                             args.timeline or bool(args.plot))
        else:
            from ..explain.node import explain_node
            from ..clients.agent_client import metrics_url
            url = metrics_url(args.url)
            answer = explain_node(url, args.job, args.window, args.node)
    except ExplainError as exc:
        print(f"tracehound: explain: {exc}", flush=True)
        return 2
    print(render.as_json(answer) if args.json else
          render.text(answer, url, with_timeline=args.timeline), flush=True)
    unjudged = not answer.nodes or (not answer.findings and answer.blind)
    if args.plot:
        from ..explain import plot
        try:
            plot.write(answer, args.plot)
        except (ExplainError, OSError) as exc:      # the answer above stands
            print(f"tracehound: explain: --plot {args.plot}: {exc}", flush=True)
            return 2
    return 3 if unjudged else 0
