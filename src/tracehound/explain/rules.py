"""The findings `explain` can make, as data.

A rule is one PromQL question over the window, asked once for the whole job
and answered per node (and per mount, signal, op, XID where that names the
cause): its value says how much went wrong. `kind` says how the answer is
judged:

  grew      any node where the value is above zero is a finding
  outlier   a node whose value is above `floor` and over `factor` times the
            median of the job's other nodes (one slow rank, one node with
            retransmits) is a finding; alike nodes are not; `says` tells
            how it stands against them with {compared}

Only series the agent labels with the job are asked, except the GPU's, which
are the node's: a GPU error on a node the job runs on is the job's problem.
"""
from __future__ import annotations

from dataclasses import dataclass

from .. import conditions

JOB = "{job}"       # the job's matchers, filled in per question (fill())
WIN = "{window}"    # the job's span: its length, and the time it ends as " @ END"
AT = "{at}"


def fill(expr: str, **values: str) -> str:
    """EXPR with each {name} replaced by its value. Not str.format: PromQL's
    own braces (selectors) would be read as fields."""
    for name, value in values.items():
        expr = expr.replace("{" + name + "}", value)
    return expr


# how far before the window a counter's value at its start is looked for:
# Prometheus' own lookback for an instant value
BEFORE = "5m"


def grew(metric: str, matchers: str) -> str:
    """How much a counter grew over the window: its last value in the window
    less its last value before the window, or the last value for a series
    born within it (a job's first OOM kill starts its series at 1); a reset
    (the agent restarted) counts as nothing rather than as negative.

    The value before is the last *sample*, not the instant value: one failed
    scrape marks every series of the target stale, and an instant lookup
    just after it finds none, which would count an old XID again as born in
    the window (a range selector passes over the staleness marker)."""
    sel = f"{metric}{{{matchers}}}"
    last = f"last_over_time({sel}[{WIN}]{AT})"
    before = f"last_over_time({sel}[{BEFORE}]{AT} offset {WIN})"
    return f"(clamp_min({last} - {before}, 0) or {last})"


def mean_latency(histogram: str, matchers: str, window: str, at: str = "") -> str:
    """Mean latency over the window from a classic histogram (_sum and
    _count series) or a native one (a Prometheus with native histograms on
    keeps only that): each label set has one form."""
    def rate(name: str) -> str:
        return f"rate({name}{{{matchers}}}[{window}]{at})"
    return (f"(sum by ({{by}}) ({rate(histogram + '_sum')}) / "
            f"sum by ({{by}}) ({rate(histogram + '_count')})) or "
            f"(sum by ({{by}}) (histogram_sum({rate(histogram)})) / "
            f"sum by ({{by}}) (histogram_count({rate(histogram)})))")


@dataclass(frozen=True)
class Rule:
    name: str
    severity: int               # 5 the job is broken ... 1 worth a look
    expr: str                   # PromQL with {job}, {window} and {by}
    by: tuple[str, ...]         # labels beside the node's that name the cause
    kind: str                   # "grew" or "outlier"
    says: str                   # the finding, formatted with the value and the `by` labels
    action: str
    floor: float = 0.0
    factor: float = 3.0
    job_labelled: bool = True   # False: the node's series (GPU), asked on the job's nodes
    # a counting rule's counter and its fixed label values: node mode adds
    # them up from the agent's own /metrics (explain/node.py)
    metric: str = ""
    match: tuple[tuple[str, str], ...] = ()
    # a gauge of the agent's own time of the latest event counted (same
    # labels as the counter): the finding's since to the millisecond
    when: str = ""


def counting(name: str, severity: int, metric: str, by: tuple[str, ...], says: str,
             action: str, match: tuple[tuple[str, str], ...] = (),
             job_labelled: bool = True, when: str = "") -> Rule:
    """A rule that holds where a counter grew in the window."""
    sel = (JOB if job_labelled else "{node}") + "".join(f',{k}="{v}"' for k, v in match)
    return Rule(name, severity, "sum by ({by}) (" + grew(metric, sel) + ")", by, "grew", says,
                action, job_labelled=job_labelled, metric=metric, match=match, when=when)


def first_time(rule: Rule) -> str:
    """The earliest event time RULE's `when` gauge held in the window, per
    node and cause: the latest event as of the first scrape that counted
    one, so the first event itself unless two came between two scrapes."""
    sel = JOB + "".join(f',{k}="{v}"' for k, v in rule.match)
    return f"min by ({{by}}) (min_over_time({rule.when}{{{sel}}}[{WIN}]{AT}))"


LOSSY_LINK = ("check the node's links and switch port for loss (errors, drops, a flapping "
              "port); tc qdisc show lists a netem or filter someone left on an interface")


def compared(ratio: float | None) -> str:
    """How an outlier stands against the job's other nodes."""
    if ratio is None:
        return "with no other node of the job to compare"
    if ratio == float("inf"):
        return "while the job's other nodes had none"
    return f"{ratio:.1f}x the median of the job's other nodes"


EXIT_AT = "tracehound_process_last_exit_timestamp_seconds"

RULES: tuple[Rule, ...] = (
    counting("oom_kill", 5, "tracehound_process_exits_total", (),
             "{value:g} process(es) of the job killed by the OOM killer",
             "raise the job's memory request or find what grew "
             "(tracehound_cgroup_memory_rss_bytes)", match=(("reason", "oom"),), when=EXIT_AT),
    counting("killed_by_signal", 4, "tracehound_process_exits_total", ("signal",),
             "{value:g} process(es) of the job killed by SIG{signal}",
             "find who sent it: the job's own error handling, an admin, or a watchdog (the "
             "node's /events has each exit's pid)", match=(("reason", "signal"),), when=EXIT_AT),
    counting("gpu_xid", 5, "tracehound_gpu_xid_errors_total", ("pci_bus_id", "xid"),
             "{value:g} XID {xid} on GPU {pci_bus_id}", "see the XID catalog's action below",
             job_labelled=False),
    # the node's fitness, by the conditions `tracehound health` drains on
    # (conditions.py): each condition's phrase, action and severity come
    # from there (answer.judged); a fatal XID is also the gpu_xid finding
    Rule("node_unfit", 5,
         "max by ({by}) (max_over_time(tracehound_gpu_health{" + JOB + ',condition=~"'
         + "|".join(c.gauge for c in conditions.GPU) + '"}[' + WIN + "]" + AT + "))",
         ("pci_bus_id", "condition"), "grew", "GPU {pci_bus_id}: {phrase}", "",
         job_labelled=False),
    counting("read_errors", 4, "tracehound_io_read_errors_total", ("mountpoint",),
             "{value:g} failed read call(s) on {mountpoint}",
             "check the file system's health and the node's kernel log for that mount"),
    counting("write_errors", 4, "tracehound_io_write_errors_total", ("mountpoint",),
             "{value:g} failed write call(s) on {mountpoint}",
             "check the file system's health and free space, and the node's kernel log"),
    counting("rdma_verb_errors", 4, "tracehound_rdma_verb_errors_total", ("op", "errno"),
             "{value:g} RDMA {op} call(s) failed with {errno}",
             "ENOMEM on reg_mr: raise RLIMIT_MEMLOCK; EAGAIN/ENOSPC: the rdma cgroup's or "
             "the device's limits; tracehound rdma show lists the objects held"),
    counting("fsync_errors", 4, "tracehound_io_fsync_errors_total", ("mountpoint",),
             "{value:g} failed fsync call(s) on {mountpoint}",
             "data the job thought written may be lost: check the device and the file "
             "system server, and the node's kernel log"),
    counting("rdma_app_verb_errors", 4, "tracehound_rdma_app_verb_errors_total", ("op", "errno"),
             "{value:g} libibverbs {op} call(s) failed ({errno})",
             "the application's own view of its verbs: the same limits as above, and a "
             "library or driver mismatch when the kernel saw no matching failure"),
    Rule("job_stalled", 4,
         "max by ({by}) (max_over_time(tracehound_workload_stalled{" + JOB + "}[" + WIN + "]" + AT
         + "))",
         (), "grew", "the job's processes made no progress (no I/O, no network) while it was "
         "meant to run", "look for stopped processes (state T), a hung collective, or a "
         "dead peer; the node's /events has when it stalled and resumed"),
    Rule("stopped_processes", 4,
         "sum by ({by}) (max_over_time(tracehound_cgroup_processes{" + JOB
         + ',state="stopped"}[' + WIN + "]" + AT + "))",
         (), "grew", "{value:g} process(es) of the job stopped (state T)",
         "something sent SIGSTOP (a debugger, a user's Ctrl-Z, a watchdog, a chaos run) and "
         "the job's other ranks wait on it; SIGCONT resumes it",
         metric="tracehound_cgroup_processes", match=(("state", "stopped"),)),
    Rule("tcp_retransmits", 3,
         "sum by ({by}) (" + grew("tracehound_net_tcp_retransmits_total", JOB) + ")",
         (), "outlier", "{value:g} TCP retransmissions by the job's sockets, {compared}",
         LOSSY_LINK, floor=10),
    # the node's own count, every socket's: a job's sockets carry only their
    # cgroup v2, which Slurm's cgroup/v1 plugin leaves at the root, and loss
    # on a node's link shows in all its traffic (the job's, and its peers'
    # acknowledgements); the job's other nodes are the yardstick
    Rule("node_tcp_retransmits", 3,
         "sum by ({by}) (" + grew("tracehound_net_node_tcp_retransmitted_segments_total", JOB)
         + ")",
         (), "outlier", "{value:g} TCP segments retransmitted by the node, {compared}",
         # a node's own count holds every socket's: a busy healthy node
         # retransmits a few in minutes (10 in 10 min on the bench's cluster)
         LOSSY_LINK, floor=100, job_labelled=False),
    Rule("slow_writes", 2, mean_latency("tracehound_io_write_latency_seconds", JOB, WIN, AT),
         ("mountpoint",), "outlier",
         "mean write latency {value_s} on {mountpoint}, {compared}",
         "look for a throttled cgroup (io.max, blkio), a degraded disk, or a shared file "
         "system server that is slow for this node", floor=0.005),
)
