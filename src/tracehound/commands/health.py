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

from .. import defaults
from ..clients.agent_client import URL_VARIABLE, metrics_url
from ..health.check import ERROR, Options, check
from ..health.rules import CONDITIONS, DEFAULT_CONDITIONS, Rules
from ..health.slurm import Breaker, Slurm, SlurmError, find_scontrol

DEFAULT_URL = f"http://{defaults.LISTEN}"


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
        description="Ask the local agent whether this node is fit (fatal XID, GPU lost, "
                    "uncorrectable ECC, row-remap failure, NVLink or RDMA port down or "
                    "flapping, the agent not answering); drain it with the reason, resume "
                    "it when the condition clears, never touching a drain someone else made. "
                    "A fleet breaker bounds the share of a partition it drains.")
    p.add_argument("--url", default=None,
                   help=f"the agent (default ${URL_VARIABLE} without its /metrics, else "
                        f"{DEFAULT_URL}; slurmd gives its program no environment)")
    p.add_argument("--timeout", type=_positive(float), default=0.5, metavar="SECONDS",
                   help="how long the agent may take to answer; no answer is agent_down "
                        "(default 0.5)")
    p.add_argument("--ca-file", help="CA of the agent's certificate (https URL)")
    p.add_argument("--cert-file", help="client certificate, where the agent asks for one")
    p.add_argument("--key-file", help="the client certificate's key")
    p.add_argument("--username", help="basic-auth user (https only)")
    p.add_argument("--password-file", help="file holding the basic-auth password")
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
    env = {k: v for k, v in (("TRACEHOUND_CA_FILE", args.ca_file),
                             ("TRACEHOUND_CERT_FILE", args.cert_file),
                             ("TRACEHOUND_KEY_FILE", args.key_file),
                             ("TRACEHOUND_USERNAME", args.username),
                             ("TRACEHOUND_PASSWORD_FILE", args.password_file)) if v}
    try:
        slurm = None if args.check_only else Slurm(find_scontrol(args.scontrol),
                                                   args.slurm_conf, dry_run=args.dry_run)
        url = args.url or metrics_url(None).removesuffix("/metrics")
        opts = Options(node, url, args.timeout,
                       Rules(args.conditions, args.rdma_flaps, args.rdma_flap_window),
                       Breaker(args.breaker_percent, args.breaker_min), slurm,
                       args.state_file or os.path.join(defaults.RUN_DIR, f"health-{node}.json"),
                       env)
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
        write_textfile(args.textfile, verdict, time.monotonic() - start)
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
              "# HELP tracehound_health_drained 1 when the last run drained the node.",
              "# TYPE tracehound_health_drained gauge",
              f"tracehound_health_drained {int(verdict.action == 'drain')}",
              "# HELP tracehound_health_run_seconds How long the last run took.",
              "# TYPE tracehound_health_run_seconds gauge",
              f"tracehound_health_run_seconds {seconds:.3f}",
              "# HELP tracehound_health_last_run_timestamp_seconds When it last ran.",
              "# TYPE tracehound_health_last_run_timestamp_seconds gauge",
              f"tracehound_health_last_run_timestamp_seconds {time.time():.3f}"]
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w") as f:
        f.write("\n".join(lines) + "\n")
    os.replace(tmp, path)
