"""tracehound health: an NHC-style Slurm HealthCheckProgram over the local
agent's verdicts (see health/check.py for what it does to the node).

It runs from slurmd's bare environment (SLURMD_NODENAME only: no PATH, no
SLURM_CONF), prints one line, and exits 0 fit, 1 unfit, 2 could not decide,
3 unfit but the fleet breaker refused the drain.
"""
from __future__ import annotations

import argparse
import os
import socket
import sys
import syslog
import time

from .. import defaults, instance
from ..clients.local_agent import socket_path
from ..health.breaker import Breaker
from ..health.check import ERROR, Options, check
from ..health.files import write_whole
from ..health.rules import CONDITIONS, DEFAULT_CONDITIONS, Rules
from ..health.slurm import Slurm, SlurmError, find_scontrol


def _conditions(value: str) -> frozenset:
    names = frozenset(v.strip() for v in value.split(",") if v.strip())
    unknown = names - set(CONDITIONS)
    if unknown:
        raise argparse.ArgumentTypeError(f"unknown condition(s) {', '.join(sorted(unknown))}; "
                                         f"known: {', '.join(CONDITIONS)}")
    return names


def _positive(kind):
    def parse(value: str):
        try:
            v = kind(value)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a number: {value!r}") from None
        if v <= 0 if kind is float else v < 0:
            raise argparse.ArgumentTypeError(f"out of range: {value}")
        return v
    return parse


def add_parser(sub, hook) -> None:
    p = sub.add_parser(
        "health", help="Slurm HealthCheckProgram: drain this node on the agent's verdicts",
        description="Ask the local agent, on its root-only socket, whether this node is fit "
                    "(fatal XID, GPU lost, uncorrectable ECC, row-remap failure, NVLink or "
                    "RDMA port down or flapping, the agent not answering); drain it with the "
                    "reason, resume it when the condition clears, never touching a drain "
                    "someone else made. A fleet breaker, decided under a lock slurmctld "
                    "arbitrates, bounds how many nodes it drains; a reason shared by more "
                    "nodes than it allows drains none.")
    p.add_argument("--instance", type=instance.instance_name, default=defaults.INSTANCE,
                   metavar="NAME", help="the agent instance to ask (default "
                                        f"{defaults.INSTANCE})")
    p.add_argument("--socket", metavar="PATH",
                   help="the agent's root-only local channel (default "
                        f"{defaults.RUN_DIR}/INSTANCE.sock, as `run --local-socket`)")
    p.add_argument("--timeout", type=_positive(float), default=5.0, metavar="SECONDS",
                   help="how long the agent may take to answer, tries included (default 5)")
    p.add_argument("--agent-down-after", type=_positive(int), default=2, metavar="N",
                   help="runs in a row the agent must fail to answer before the node is "
                        "agent_down: a restart drains nothing (default 2)")
    p.add_argument("--node", help="the Slurm node name (default $SLURMD_NODENAME, "
                                  "else the short host name)")
    p.add_argument("--conditions", type=_conditions, default=DEFAULT_CONDITIONS,
                   metavar="LIST", help="the conditions that make a node unfit, comma-"
                                        f"separated, of: {', '.join(CONDITIONS)} (default all "
                                        "but thermal_slowdown)")
    p.add_argument("--rdma-flaps", type=_positive(int), default=3, metavar="N",
                   help="link_downed increases within --rdma-flap-window that make a port "
                        "flapping (default 3)")
    p.add_argument("--rdma-flap-window", type=_positive(float), default=600.0,
                   metavar="SECONDS", help="(default 600)")
    p.add_argument("--breaker-percent", type=_positive(float), default=10.0, metavar="P",
                   help="never drain past P %% of a partition's nodes drained by tracehound "
                        "(default 10)")
    p.add_argument("--breaker-min", type=_positive(int), default=1, metavar="N",
                   help="... but always allow N (default 1)")
    p.add_argument("--breaker-cap", type=_positive(int), default=0, metavar="N",
                   help="never more than N nodes drained by tracehound in the cluster "
                        "(default 0: no cap beyond the share)")
    p.add_argument("--breaker-rate", type=_positive(int), default=0, metavar="N",
                   help="at most N drains begun within --breaker-rate-window (default 0: "
                        "no rate limit)")
    p.add_argument("--breaker-rate-window", type=_positive(float), default=3600.0,
                   metavar="SECONDS", help="(default 3600)")
    p.add_argument("--common-mode-window", type=_positive(float), default=300.0,
                   metavar="SECONDS",
                   help="more nodes of a partition than the share limit that began to fail "
                        "for one condition within this time: common mode, drain none for it "
                        "(default 300)")
    p.add_argument("--lock-wait", type=_positive(float), default=10.0, metavar="SECONDS",
                   help="how long to wait for the drain lock another node holds (default 10)")
    p.add_argument("--scontrol", help="scontrol's path (default: the first of /usr/bin, "
                                      "/usr/local/bin, /opt/slurm/bin, then $PATH)")
    p.add_argument("--slurm-conf", help="SLURM_CONF for scontrol (default: its own default)")
    p.add_argument("--state-file", help="what runs remember (RDMA ports seen active, flap "
                                        f"history; default {defaults.RUN_DIR}/health-NODE.json)")
    p.add_argument("--textfile", metavar="PATH",
                   help="also write the verdict as Prometheus text (node_exporter's textfile "
                        "collector), e.g. /var/lib/node_exporter/tracehound_health.prom")
    p.add_argument("--check-only", action="store_true",
                   help="do not ask Slurm: one line and the exit status, for NHC")
    p.add_argument("--dry-run", action="store_true", help="say what would be done, do nothing")
    p.set_defaults(handler=_health)


def _node(args) -> str:
    return (args.node or os.environ.get("SLURMD_NODENAME")
            or socket.gethostname().split(".")[0])


def _health(args) -> int:
    start = time.monotonic()
    node = _node(args)
    try:
        return _run(args, node, start)
    except Exception as exc:        # one line and "could not decide", never a traceback
        print(f"tracehound health: {node}: cannot decide: {type(exc).__name__}: {exc}"[:500],
              file=sys.stderr)
        return ERROR


def _run(args, node: str, start: float) -> int:
    try:
        slurm = None if args.check_only else Slurm(find_scontrol(args.scontrol),
                                                   args.slurm_conf, dry_run=args.dry_run)
        opts = Options(node, args.socket or socket_path(args.instance), args.timeout,
                       Rules(args.conditions, args.rdma_flaps, args.rdma_flap_window),
                       Breaker(args.breaker_percent, args.breaker_min, args.breaker_cap,
                               args.breaker_rate, args.breaker_rate_window,
                               args.common_mode_window), slurm,
                       args.state_file or os.path.join(defaults.RUN_DIR, f"health-{node}.json"),
                       args.agent_down_after, args.lock_wait)
        verdict = check(opts)
    except (SlurmError, LookupError, OSError) as exc:
        print(f"tracehound health: {node}: cannot decide: {exc}", file=sys.stderr)
        return ERROR
    prefix = "tracehound health (dry run)" if args.dry_run else "tracehound health"
    print(f"{prefix}: {verdict.line()}")
    if verdict.refusal:
        message = f"{prefix}: {node}: drain refused: {verdict.refusal}"
        print(message, file=sys.stderr)
        syslog.openlog("tracehound-health", 0, syslog.LOG_DAEMON)
        syslog.syslog(syslog.LOG_WARNING, message)
    if args.textfile:
        try:
            write_textfile(args.textfile, verdict, time.monotonic() - start)
        except OSError as exc:
            print(f"tracehound health: {node}: textfile {args.textfile}: {exc}",
                  file=sys.stderr)
            return ERROR
    return verdict.code


def write_textfile(path: str, verdict, seconds: float) -> None:
    """The verdict for node_exporter's textfile collector, written whole."""
    lines = ["# HELP tracehound_health_unfit 1 when tracehound health found the node unfit.",
             "# TYPE tracehound_health_unfit gauge",
             f"tracehound_health_unfit {int(bool(verdict.findings))}",
             "# HELP tracehound_health_condition A condition that holds (1), by name.",
             "# TYPE tracehound_health_condition gauge"]
    lines += [f'tracehound_health_condition{{condition="{c}"}} 1'
              for c in sorted({f.condition for f in verdict.findings})]
    lines += ["# HELP tracehound_health_breaker_refused 1 when the fleet breaker refused "
              "to drain this unfit node.",
              "# TYPE tracehound_health_breaker_refused gauge",
              f"tracehound_health_breaker_refused {int(bool(verdict.refusal))}",
              "# HELP tracehound_health_common_mode 1 for a condition more nodes than the "
              "breaker allows began to fail for at once: none is drained for it.",
              "# TYPE tracehound_health_common_mode gauge"]
    lines += [f'tracehound_health_common_mode{{condition="{c}"}} 1'
              for c in sorted(verdict.common_mode)]
    lines += ["# HELP tracehound_health_agent_failures 1 while the agent did not answer, "
              "fewer runs in a row than make it agent_down.",
              "# TYPE tracehound_health_agent_failures gauge",
              f"tracehound_health_agent_failures {int(bool(verdict.pending))}",
              "# HELP tracehound_health_drained 1 when the last run drained the node.",
              "# TYPE tracehound_health_drained gauge",
              f"tracehound_health_drained {int(verdict.action == 'drain')}",
              "# HELP tracehound_health_run_seconds How long the last run took.",
              "# TYPE tracehound_health_run_seconds gauge",
              f"tracehound_health_run_seconds {seconds:.3f}",
              "# HELP tracehound_health_last_run_timestamp_seconds When it last ran.",
              "# TYPE tracehound_health_last_run_timestamp_seconds gauge",
              f"tracehound_health_last_run_timestamp_seconds {time.time():.3f}"]
    write_whole(path, ("\n".join(lines) + "\n").encode())
