"""tracehound command line: the parser, and dispatch to each command's handler."""
from __future__ import annotations

import argparse
import importlib
import logging
import os
import sys

from . import __version__, defaults
from .bpf.features import MODES
from .errors import TracehoundError
from .logsink import JsonFormatter, log_to_stderr
from .signals import HeldSignals

# Each command and the module that defines it, in the order `tracehound
# --help` lists them.
COMMANDS: dict[str, str] = {"run": "tracehound.commands.run",
                            "rdma": "tracehound.commands.rdma_show",
                            "top": "tracehound.top.cli",
                            "chaos": "tracehound.chaos.cli",
                            "explain": "tracehound.commands.explain",
                            "doctor": "tracehound.commands.doctor",
                            "health": "tracehound.commands.health"}


def build_parser(modules: list[str] | None = None) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="tracehound",
        description="Node agent for GPU/HPC fleets: per-job I/O (eBPF on the VFS layer) "
                    "exported to Prometheus.")
    p.add_argument("--version", action="version", version=f"tracehound {__version__}")
    p.add_argument("-v", "--verbose", action="store_true", help="log debug details")
    p.add_argument("--log-format", choices=("text", "json"),
                   default=os.environ.get("TRACEHOUND_LOG_FORMAT") or "text",
                   help="log lines as text, or one JSON object per line with each anomaly "
                        "event as a structured record (default $TRACEHOUND_LOG_FORMAT, else "
                        "text)")
    sub = p.add_subparsers(dest="command", metavar="COMMAND")

    hook = argparse.ArgumentParser(add_help=False)
    hook.add_argument("--hook-mode", choices=("auto",) + MODES, default=defaults.HOOK_MODE,
                      help="force one hook mode for every probe (default: auto picks "
                           "fentry, then kprobe, then tracepoint, per hook)")
    for module in modules or COMMANDS.values():
        importlib.import_module(module).add_parser(sub, hook)
    return p


def main(argv: list[str] | None = None) -> int:
    held = HeldSignals()
    words = sys.argv[1:] if argv is None else argv
    # A command named first imports its own module only, not every other
    # command's subsystems: slurmd runs `health` on every node each
    # HealthCheckInterval, and the agent's and an experiment's start pay for
    # each import on a busy node (or under emulation: half a minute).
    own = COMMANDS.get(words[0]) if words else None
    parser = build_parser([own]) if own else build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit:
        held.release()
        raise
    if args.log_format not in ("text", "json"):     # a default from the environment
        held.release()
        print(f"tracehound: TRACEHOUND_LOG_FORMAT={args.log_format!r}: text or json",
              file=sys.stderr)
        return 2
    # never through a handler that a full, unread standard error can block
    log_to_stderr(logging.DEBUG if args.verbose else logging.WARNING,
                  JsonFormatter() if args.log_format == "json"
                  else "tracehound: %(levelname)s: %(message)s")
    handler = getattr(args, "handler", None)
    # a command that handles stop signals itself takes them over from here
    args.held_signals = held
    if handler is None:
        parser.print_help()
        return 2
    try:
        if not getattr(args, "takes_signals", False):
            held.release()
        return handler(args)
    except TracehoundError as exc:
        print(f"tracehound: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
