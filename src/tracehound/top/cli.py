"""`tracehound top`: the command line and the one-shot output."""
from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import asdict

from ..errors import TracehoundError
from .model import SORT_KEYS
from ..clients.agent_client import URL_VARIABLE, metrics_url
from .source import DEFAULT_URL, MetricsSource, PrometheusSource
from .state import ViewState


def add_parser(sub, hook=None) -> None:
    p = sub.add_parser(
        "top", help="live per-workload I/O, RDMA and GPU view of an agent or Prometheus",
        description="A sortable live view, one row per workload (Slurm job, pod, VM, unit, "
                    "else cgroup) and file system, with bandwidth, IOPS, p50/p99 latency and "
                    "errors computed between refreshes. Keys: r/w/i/l/e/n sort by read, "
                    "write, IOPS, p99, errors, name (again: reverse); / filter; tab panel; "
                    "a idle rows; q quit.")
    src = p.add_mutually_exclusive_group()
    src.add_argument("--url", default=None,
                     help=f"an agent's metrics URL (default ${URL_VARIABLE}, else, as root, the "
                          "local agent's root-only channel unix:/run/tracehound/default.sock"
                          f"/metrics where it runs, else {DEFAULT_URL})")
    src.add_argument("--prometheus", metavar="URL",
                     help="query a Prometheus server instead, e.g. http://prometheus:9090")
    p.add_argument("--window", default="1m", metavar="DURATION",
                   help="with --prometheus: the rate() window (default 1m)")
    p.add_argument("--selector", default="", metavar="MATCHERS",
                   help='with --prometheus: label matchers added to every query, '
                        'e.g. \'instance="node7:9560"\'')
    p.add_argument("--interval", type=float, default=1.0, metavar="SECONDS",
                   help="refresh period; with --once, the time between the two scrapes "
                        "(default 1)")
    p.add_argument("--sort", choices=tuple(SORT_KEYS), default="write",
                   help="initial sort column (default write)")
    p.add_argument("--filter", default="", metavar="TEXT",
                   help="only workloads whose name, kind or cgroup contains TEXT")
    p.add_argument("--all", action="store_true",
                   help="also show rows without I/O in the interval")
    p.add_argument("--once", action="store_true",
                   help="print one snapshot and exit (for scripts)")
    p.add_argument("--json", action="store_true", help="with --once: print JSON")
    p.set_defaults(handler=main)


def main(args: argparse.Namespace) -> int:
    if args.interval <= 0:
        raise TracehoundError("--interval must be more than 0 seconds")
    if args.json and not args.once:
        raise TracehoundError("--json needs --once")
    if args.prometheus:
        source = PrometheusSource(args.prometheus, args.window, args.selector)
        label = f"{args.prometheus} (rate over {args.window})"
    else:
        url = metrics_url(args.url)
        source = MetricsSource(url)
        label = url
    state = ViewState(sort=args.sort, filter=args.filter, show_idle=args.all)
    if args.once:
        return once(source, state, args.interval, args.json)
    from .live import run_live
    return run_live(source, state, args.interval, label)


def once(source, state: ViewState, interval: float, as_json: bool) -> int:
    started = time.monotonic()
    snap = source.poll()
    if snap is None:
        time.sleep(max(0.0, started + interval - time.monotonic()))
        snap = source.poll()
    rows = state.io_rows(snap)
    if as_json:
        doc = snap.as_json(state.sort)
        objects = state.rdma_objects(snap)
        doc.update(filter=state.filter, include_idle=state.show_idle,
                   io=[r.as_json() for r in rows],
                   jobs=[asdict(r) for r in state.job_rows(snap)])
        doc["rdma"]["objects"] = None if objects is None else [asdict(r) for r in objects]
        json.dump(doc, sys.stdout, indent=2)
        sys.stdout.write("\n")
        return 0
    from rich.console import Console

    from .view import gpu_panel, io_table, jobs_panel, rdma_panel
    # a pipe gets a width that fits the columns instead of rich's 80
    console = Console() if sys.stdout.isatty() else Console(width=200)
    console.print(io_table(rows, state))
    console.print(jobs_panel(state.job_rows(snap)))
    console.print(rdma_panel(state.rdma_objects(snap), snap.rdma_errors))
    console.print(gpu_panel(snap.gpus))
    return 0


