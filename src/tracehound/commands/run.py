"""`tracehound run`: the agent's flags, checked, into an AgentConfig."""
from __future__ import annotations

import argparse
import math
import sys
import threading
import urllib.parse

from .. import defaults, instance
from ..attribution.cgroup_layout import CHOICES as CGROUP_KEYS
from ..gpu.bus_ids import bus_id_list
from ..host.mounts import DEFAULT_SKIP_FSTYPES
from ..linear_regex import LinearPattern


# Upper bounds: each io_stats entry holds about 1 KB of kernel memory
# (preallocated), and beyond a few million label sets no Prometheus keeps up.
MAX_ENTRIES = 1 << 22
MAX_SERIES = 10_000_000
MAX_GRACE_S = 24 * 3600.0
MAX_RDMA_OBJECTS = 1 << 20


def _cgroup_scope(value: str) -> str:
    if not value.startswith("/") or len(value) > 4096 or "\n" in value or "\0" in value:
        raise argparse.ArgumentTypeError(f"{value[:80]!r}: an absolute cgroup path "
                                         "(e.g. /slurm_n1)")
    return value


def _subsystems(value: str) -> frozenset[str]:
    names = frozenset(x.strip() for x in value.split(",") if x.strip())
    unknown = names - set(defaults.SUBSYSTEM_NAMES)
    if unknown or not names:
        raise argparse.ArgumentTypeError(f"{value!r}: expected a comma-separated list of "
                                         f"{', '.join(defaults.SUBSYSTEM_NAMES)}")
    return names


def _fstypes(value: str) -> tuple[str, ...]:
    return tuple(x.strip() for x in value.split(",") if x.strip())


def _count(low: int, high: int, meaning: str = ""):
    """An integer flag in [low, high]; argparse names the flag in its error."""
    def parse(value: str) -> int:
        text = value.strip()
        if not (text.isascii() and text.lstrip("+").isdigit()):
            raise argparse.ArgumentTypeError(f"{value!r} is not a whole number")
        n = int(text)
        if not low <= n <= high:
            raise argparse.ArgumentTypeError(f"{n} is out of range: {low} to {high:,}{meaning}")
        return n
    return parse


def _seconds(low: float, high: float, off: bool = False):
    """More than `low` and at most `high` seconds; with `off`, 0 too (the rule is off)."""
    def parse(value: str) -> float:
        try:
            x = float(value)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{value!r} is not a number of seconds") from None
        if off and x == 0:
            return 0.0
        if not (math.isfinite(x) and low < x <= high):
            raise argparse.ArgumentTypeError(f"{value} is out of range: more than {low:g} "
                                             f"and at most {high:g} seconds"
                                             + (", or 0 (off)" if off else ""))
        return x
    return parse


def _regex(value: str) -> str:
    try:
        LinearPattern(value)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"{value!r}: {exc}") from None
    return value


def _http_url(value: str) -> str:
    parts = urllib.parse.urlsplit(value)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise argparse.ArgumentTypeError(f"{value!r} is not an http:// or https:// URL "
                                         "with a host")
    return value


def _microseconds(low: int, high: int):
    """A whole number of microseconds from `low` to `high`."""
    def parse(value: str) -> int:
        try:
            x = int(value)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{value!r} is not a whole number of "
                                             "microseconds") from None
        if not low <= x <= high:
            raise argparse.ArgumentTypeError(f"{x} is out of range: {low} to {high} "
                                             "microseconds")
        return x
    return parse


def _latency(value: str) -> tuple[frozenset[str], bool, bool]:
    """(the probes to time, whether sampled, whether audited) of on, off,
    every, audit, or the probes: io.read,io.fsync (sampled), every:io.fsync
    (every call)"""
    text = value.strip()
    sampled, audit = True, False
    if text == "audit":
        audit, text = True, "on"
    elif text == "every":
        sampled, text = False, "on"
    elif text.startswith("every:"):
        sampled, text = False, text.removeprefix("every:").strip()
    if text in ("on", "off"):
        return frozenset(defaults.LATENCY_PROBES if text == "on" else ()), sampled, audit
    probes = [x.strip() for x in text.split(",")]
    unknown = [p for p in probes if p not in defaults.LATENCY_PROBES]
    if unknown or not text:
        raise argparse.ArgumentTypeError(
            f"{value!r}: expected on, off, every, audit, or a comma-separated list of "
            f"{', '.join(defaults.LATENCY_PROBES)} (every:LIST to time every call of those)")
    return frozenset(probes), sampled, audit


def add_parser(sub, hook) -> None:
    run = sub.add_parser("run", parents=[hook], help="run the agent and its metrics exporter",
                         description="Load the probes and serve Prometheus metrics until "
                                     "SIGINT/SIGTERM. Needs root.")
    run.add_argument("--listen", default=defaults.LISTEN, metavar="HOST:PORT",
                     help=f"exporter address (default {defaults.LISTEN}, this node only); "
                          "on any other address use --web.config.file")
    run.add_argument("--web.config.file", dest="web_config_file", metavar="PATH",
                     help="TLS and basic authentication for the exporter, in the Prometheus "
                          "exporter toolkit's format (as node_exporter's): tls_server_config, "
                          "basic_auth_users, http_server_config; checked at start "
                          "(see docs/deployment.md)")
    run.add_argument("--skip-fstypes", type=_fstypes, default=DEFAULT_SKIP_FSTYPES,
                     metavar="LIST", help="comma-separated file-system types not to count "
                     "(default: pseudo file systems: proc, sysfs, cgroup, devtmpfs, pipes, sockets...)")
    run.add_argument("--count-all-fstypes", action="store_true",
                     help="count every file system, pseudo ones included")
    run.add_argument("--max-entries", type=_count(1, MAX_ENTRIES, " (about 1 KB of kernel memory each)"),
                     default=defaults.IO_MAX_ENTRIES, metavar="N",
                     help="capacity of the (cgroup, mount) table in the kernel "
                          f"(default {defaults.IO_MAX_ENTRIES})")
    run.add_argument("--pod-logs-dir", default=defaults.POD_LOGS_DIR, metavar="DIR",
                     help="the kubelet's pod log directory, which names pods by uid "
                          f"(default {defaults.POD_LOGS_DIR})")
    run.add_argument("--kubelet-url", metavar="URL", type=_http_url,
                     help="also ask the kubelet's /pods endpoint for pod and container names, "
                          "e.g. https://127.0.0.1:10250/pods (off by default)")
    run.add_argument("--mountinfo", default=defaults.MOUNTINFO, metavar="PATH",
                     help="mount table to label mounts with (default: the agent's own); in a "
                          "container with the host's PID namespace use /proc/1/mountinfo")
    run.add_argument("--max-series", type=_count(0, MAX_SERIES), default=defaults.MAX_SERIES,
                     metavar="N",
                     help="most label sets per metric family; the rest are summed into one "
                          f"series labelled __overflow__ (default {defaults.MAX_SERIES}, 0: no limit)")
    run.add_argument("--latency-histograms", choices=defaults.LATENCY_HISTOGRAM_CHOICES,
                     default=defaults.LATENCY_HISTOGRAMS,
                     help="which labels the I/O latency histograms keep: workload-mount (one "
                          "per workload, a Slurm job step, a pod, a VM or a "
                          "unit, and mount; cgroups of no workload share one per mount), cgroup-mount "
                          "(every label set, like the counters), cgroup (summed over mounts), "
                          "mount (summed over cgroups) or off; per label set they are three "
                          f"quarters of a scrape (default {defaults.LATENCY_HISTOGRAMS}); off "
                          "also stops the timing, like --latency off")
    run.add_argument("--latency", type=_latency,
                     default=(frozenset(defaults.LATENCY_PROBES), True, False),
                     metavar="on|every|off|audit|PROBES",
                     help="time I/O calls in the kernel for the latency histograms: on "
                          "(default: sampled, every call while calls of a kind are rare on a "
                          "CPU, about one per "
                          f"{defaults.LATENCY_SAMPLE_GAP_NS // 1000} microseconds when they come "
                          "faster, standing for the calls between), every (every call, two "
                          "clock reads each), off (counters only, no clock reads, and in "
                          "syscall mode no entry hook), or the probes to time, comma-separated "
                          f"({', '.join(defaults.LATENCY_PROBES)}; every:PROBES times every "
                          "call of those), audit (for measuring the sampler: as on, and every "
                          "call also timed into a histogram the kernel keeps apart, at every's "
                          "cost; docs/io.md); bytes, calls and errors are exact in every case")
    run.add_argument("--latency-sample-gap", type=_microseconds(1, 1_000_000),
                     metavar="MICROSECONDS",
                     help="with --latency on: time about one call of a kind per CPU in this "
                          "many microseconds while they come faster (default "
                          f"{defaults.LATENCY_SAMPLE_GAP_NS // 1000}, or "
                          f"{defaults.LATENCY_SAMPLE_GAP_SLOW_CLOCK_NS // 1000} where the "
                          "kernel's clock source is slow to read, such as hpet or acpi_pm); "
                          "larger costs less and gives the histograms fewer samples")
    run.add_argument("--rdma-grace", type=_seconds(0, MAX_GRACE_S), default=defaults.RDMA_GRACE_S,
                     metavar="SECONDS",
                     help="how long RDMA objects may outlive their process, or the mirror "
                          f"disagree with the kernel, before it is an anomaly "
                          f"(default {defaults.RDMA_GRACE_S:g})")
    run.add_argument("--rdma-max-objects",
                     type=_count(1, MAX_RDMA_OBJECTS, " (about 250 bytes of kernel memory each)"),
                     default=defaults.RDMA_MAX_OBJECTS, metavar="N",
                     help="capacity of the kernel's and the applications' RDMA object tables; "
                          "objects past it are counted in tracehound_rdma_mirror_drops_total "
                          f"(default {defaults.RDMA_MAX_OBJECTS})")
    run.add_argument("--rdma-app-view", choices=("on", "off"), default="on",
                     help="uprobes on libibverbs for the applications' view of their RDMA "
                          "objects and verb errors (default on)")
    run.add_argument("--net-max-sockets", type=_count(1, MAX_ENTRIES),
                     default=defaults.NET_MAX_SOCKETS, metavar="N",
                     help="established TCP sockets one scrape's socket scan reads before it "
                          f"stops (default {defaults.NET_MAX_SOCKETS})")
    run.add_argument("--net-max-cgroups", type=_count(1, MAX_ENTRIES),
                     default=defaults.NET_MAX_CGROUPS, metavar="N",
                     help="capacity of the kernel's per-cgroup TCP counters (retransmits, "
                          f"failed connects, resets; default {defaults.NET_MAX_CGROUPS})")
    run.add_argument("--no-net-all-netns", dest="net_all_netns", action="store_false",
                     help="scan only the agent's own network namespace for TCP sockets (by "
                          "default every namespace a process is in: pods, containers)")
    run.add_argument("--pressure-max-cgroups", type=_count(1, MAX_ENTRIES),
                     default=defaults.PRESSURE_MAX_CGROUPS, metavar="N",
                     help="cgroup directories each scrape reads pressure (PSI), CPU time and "
                          "process states from, breadth first; empty cgroups are skipped "
                          f"(default {defaults.PRESSURE_MAX_CGROUPS})")
    run.add_argument("--stall-after", type=_seconds(0, MAX_GRACE_S, off=True),
                     default=defaults.STALL_AFTER_S,
                     metavar="SECONDS",
                     help="a job (Slurm job, pod, VM, or a cgroup matching --stall-cgroups) whose "
                          "processes are all stopped, or that moved data and then nothing for "
                          "this long, is a job_stalled event (default "
                          f"{defaults.STALL_AFTER_S:g}; 0: off)")
    run.add_argument("--stall-cgroups", type=_regex, metavar="REGEX",
                     help="also watch for stalls the cgroups whose v2 path matches this regular "
                          "expression (RE2 syntax, matched in linear time; whole path, e.g. "
                          "'/batch/.*'); systemd units are not watched unless named here")
    run.add_argument("--instance", type=instance.instance_name, default=defaults.INSTANCE,
                     metavar="NAME",
                     help="run as this named instance, one of several agents on the host "
                          "(e.g. one per network namespace): each instance has its own "
                          f"lock ({defaults.RUN_DIR}/NAME.lock), RDMA pins "
                          f"({defaults.PIN_ROOT}/NAME/) and state directory; a second agent "
                          "of a running instance refuses to start "
                          f"(default {defaults.INSTANCE})")
    run.add_argument("--cgroup-key", choices=CGROUP_KEYS, default="auto",
                     help="the cgroup hierarchy I/O, exits and RDMA objects are counted by: "
                          "v2, or the cgroup of a v1 controller (freezer, cpuset, memory); "
                          "auto: v2 on a v2-only host, else the first of freezer, cpuset, "
                          "memory mounted as v1 (hybrid hosts separate jobs in v1 only) "
                          "(default auto)")
    run.add_argument("--cgroup-scope", type=_cgroup_scope, metavar="PATH",
                     help="export only cgroups at or under this path of the counted hierarchy "
                          "(one agent per simulated node on a host: /slurm_n1; a containerised "
                          "node: the container's cgroup) (default: all)")
    run.add_argument("--state-dir", metavar="DIR",
                     help="where the agent keeps what outlives a restart: the kernel log "
                          "position, so each GPU error line is counted once; one agent at a "
                          f"time (default {defaults.STATE_DIR} for the default instance, "
                          f"{defaults.STATE_DIR}/instances/NAME for any other)")
    run.add_argument("--gpu-fatal-xid-window", type=_seconds(0, MAX_GRACE_S),
                     default=defaults.GPU_FATAL_XID_WINDOW_S, metavar="SECONDS",
                     help="how long a fatal XID keeps tracehound_gpu_health"
                          "{condition=\"recent_fatal_xid\"} at 1 "
                          f"(default {defaults.GPU_FATAL_XID_WINDOW_S:g})")
    run.add_argument("--gpu-bus-ids", type=bus_id_list, metavar="LIST",
                     help="serve only these GPUs (PCI bus ids, comma-separated, e.g. "
                          "0000:3b:00.0), for an agent that watches a share of the host's "
                          "GPUs: NVML enumerates only them and kernel-log lines naming no "
                          "GPU of the list are ignored (default: every GPU)")
    run.add_argument("--subsystems", type=_subsystems, metavar="LIST",
                     help="run only these subsystems, comma-separated, of "
                          f"{', '.join(defaults.SUBSYSTEM_NAMES)} (e.g. gpu,rdma on a node where "
                          "tracehound serves health checks alone) (default: all)")
    run.add_argument("--local-socket", metavar="PATH",
                     help="the root-only Unix socket (mode 0600, in a directory only root may "
                          "write) that `tracehound health` and other local tools read: what "
                          "it serves no other user can forge or crowd out; 'off': none "
                          f"(default {defaults.RUN_DIR}/INSTANCE.sock)")
    run.set_defaults(handler=_run, takes_signals=True)


def _run(args) -> int:
    # The first SIGINT or SIGTERM (held since the command line began) asks
    # the agent to stop, at every moment of its start-up: never a KeyboardInterrupt raised inside a
    # libbpf callback (which swallows it), never a kill in the middle of a load.
    stop = threading.Event()
    args.held_signals.hand_over(lambda _signum: stop.set())
    web_config = None
    if args.web_config_file:
        from ..exporter.webconfig import WebConfigError, load
        try:
            web_config = load(args.web_config_file)
        except WebConfigError as exc:
            print(f"tracehound: error: --web.config.file {args.web_config_file}: {exc}",
                  file=sys.stderr)
            return 2
    from ..agent import run
    from ..config import AgentConfig
    skip = () if args.count_all_fstypes else args.skip_fstypes
    return run(AgentConfig(args.listen, args.hook_mode, skip, args.max_entries, args.max_series,
                           args.pod_logs_dir, args.kubelet_url, rdma_grace_s=args.rdma_grace,
                           rdma_max_objects=args.rdma_max_objects,
                           rdma_app_view=args.rdma_app_view == "on",
                           mountinfo=args.mountinfo,
                           latency_histograms=args.latency_histograms,
                           latency=args.latency[0], latency_sampled=args.latency[1],
                           latency_audit=args.latency[2],
                           latency_sample_gap_ns=(None if args.latency_sample_gap is None
                                                  else args.latency_sample_gap * 1000),
                           stall_after_s=args.stall_after,
                           stall_cgroups=args.stall_cgroups,
                           pressure_max_cgroups=args.pressure_max_cgroups,
                           net_max_sockets=args.net_max_sockets,
                           net_max_cgroups=args.net_max_cgroups,
                           net_all_netns=args.net_all_netns,
                           state_dir=instance.state_dir(args.instance, args.state_dir),
                           instance=args.instance,
                           gpu_fatal_xid_window_s=args.gpu_fatal_xid_window,
                           gpu_bus_ids=args.gpu_bus_ids,
                           web_config=web_config,
                           cgroup_key=args.cgroup_key, cgroup_scope=args.cgroup_scope,
                           local_socket=("" if args.local_socket == "off"
                                         else args.local_socket),
                           subsystems=args.subsystems),
               stop=stop)
