"""tracehound command line."""
from __future__ import annotations

import argparse
import importlib
import logging
import sys

from . import __version__
from .bpf.features import MODES
from .errors import TracehoundError
from .exporter.server import DEFAULT_LISTEN
from .host.mounts import DEFAULT_SKIP_FSTYPES


# Each of these modules adds its own sub-command: add_parser(subparsers)
# registers it with set_defaults(handler=fn), and fn(args) -> exit code runs
# it. Keep their imports light: they run for every command line.
COMMAND_MODULES: list[str] = ["tracehound.host.rdma_view", "tracehound.top.cli",
                              "tracehound.chaos.cli"]


def _fstypes(value: str) -> tuple[str, ...]:
    return tuple(x.strip() for x in value.split(",") if x.strip())


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="tracehound",
        description="Node agent for GPU/HPC fleets: per-job I/O (eBPF on the VFS layer) "
                    "exported to Prometheus.")
    p.add_argument("--version", action="version", version=f"tracehound {__version__}")
    p.add_argument("-v", "--verbose", action="store_true", help="log debug details")
    sub = p.add_subparsers(dest="command", metavar="COMMAND")

    hook = argparse.ArgumentParser(add_help=False)
    hook.add_argument("--hook-mode", choices=("auto",) + MODES, default="auto",
                      help="force one hook mode for every probe (default: auto picks "
                           "fentry, then kprobe, then tracepoint, per hook)")

    run = sub.add_parser("run", parents=[hook], help="run the agent and its metrics exporter",
                         description="Load the probes and serve Prometheus metrics until "
                                     "SIGINT/SIGTERM. Needs root.")
    run.add_argument("--listen", default=DEFAULT_LISTEN, metavar="HOST:PORT",
                     help=f"exporter address (default {DEFAULT_LISTEN})")
    run.add_argument("--skip-fstypes", type=_fstypes, default=DEFAULT_SKIP_FSTYPES,
                     metavar="LIST", help="comma-separated file-system types not to count "
                     "(default: pseudo file systems: proc, sysfs, cgroup, devtmpfs, pipes, sockets...)")
    run.add_argument("--count-all-fstypes", action="store_true",
                     help="count every file system, pseudo ones included")
    run.add_argument("--max-entries", type=int, default=8192, metavar="N",
                     help="capacity of the (cgroup, mount) table in the kernel (default 8192)")
    run.add_argument("--pod-logs-dir", default="/var/log/pods", metavar="DIR",
                     help="the kubelet's pod log directory, which names pods by uid "
                          "(default /var/log/pods)")
    run.add_argument("--kubelet-url", metavar="URL",
                     help="also ask the kubelet's /pods endpoint for pod and container names, "
                          "e.g. https://127.0.0.1:10250/pods (off by default)")
    run.add_argument("--mountinfo", default="/proc/self/mountinfo", metavar="PATH",
                     help="mount table to label mounts with (default: the agent's own); in a "
                          "container with the host's PID namespace use /proc/1/mountinfo")
    run.add_argument("--max-series", type=int, default=10000, metavar="N",
                     help="most label sets per metric family; the rest are summed into one "
                          "series labelled __overflow__ (default 10000, 0: no limit)")
    run.add_argument("--rdma-grace", type=float, default=10.0, metavar="SECONDS",
                     help="how long RDMA objects may outlive their process, or the mirror "
                          "disagree with the kernel, before it is an anomaly (default 10)")

    for module in COMMAND_MODULES:
        importlib.import_module(module).add_parser(sub)

    sub.add_parser("doctor", parents=[hook], help="show which hooks this kernel offers and why",
                   description="Check the host (root, BTF, libbpf, tracefs, cgroup v2) and show, "
                               "per probe, which hook mode would be used and why the others "
                               "are not.")
    return p


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.WARNING,
                        format="tracehound: %(levelname)s: %(message)s")
    if args.command is None:
        parser.print_help()
        return 2
    try:
        if args.command == "run":
            from .agent import AgentConfig, run
            if args.max_entries < 1:
                raise TracehoundError("--max-entries must be at least 1")
            if args.max_series < 0:
                raise TracehoundError("--max-series must be 0 (no limit) or more")
            skip = () if args.count_all_fstypes else args.skip_fstypes
            return run(AgentConfig(args.listen, args.hook_mode, skip, args.max_entries,
                                   args.max_series, args.pod_logs_dir, args.kubelet_url,
                                   rdma_grace_s=args.rdma_grace, mountinfo=args.mountinfo))
        if args.command == "doctor":
            from .doctor import doctor
            return doctor(args.hook_mode)
        handler = getattr(args, "handler", None)
        if handler is not None:
            return handler(args)
    except TracehoundError as exc:
        print(f"tracehound: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    return 2
