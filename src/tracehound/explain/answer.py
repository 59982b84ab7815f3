"""What explain answers, whichever mode asked: the findings, how they rank,
and the checks both modes make of the question."""
from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field

from ..conditions import BY_GAUGE
from ..gpu.xid_catalog import FATAL, lookup

# series that name a job on the node that runs it; a job shows in at least one
PRESENCE = ("tracehound_io_read_bytes_total", "tracehound_io_write_bytes_total",
            "tracehound_process_exits_total", "tracehound_cgroup_cpu_seconds_total",
            "tracehound_net_tcp_retransmits_total", "tracehound_rdma_verb_calls_total")
JOB_ID = re.compile(r"[0-9]{1,12}")          # whole strings only (fullmatch)
_DURATION = re.compile(r"[0-9]{1,9}[smhd]")
# signals a process raises on itself when it crashes: a fault of its own
# code or a library's, not a kill someone sent
CRASH_SIGNALS = frozenset({"SEGV", "BUS", "ABRT", "ILL", "FPE", "SYS", "TRAP"})
CRASH_ACTION = ("the process crashed (a bad memory access, an abort, a failed assertion): its "
                "stderr, a core dump, or the node's kernel log (a segfault line names the "
                "library and address) say where")


class ExplainError(Exception):
    """The question cannot be asked (bad job id, window, or source)."""


@dataclass
class Finding:
    rule: str
    severity: int
    node: str
    labels: dict
    value: float
    says: str
    action: str
    since: float | None = None
    outlier: bool = False


@dataclass
class Answer:
    job: str
    window: str
    nodes: list[str]
    findings: list[Finding] = field(default_factory=list)
    # node -> what the job did there (bytes read and written, CPU seconds)
    activity: dict[str, dict[str, float]] = field(default_factory=dict)
    queries: int = 0
    seconds: float = 0.0
    mode: str = "fleet"     # or "node": one agent, no Prometheus (node.py)
    # the span judged (epoch seconds), and who said when the job ran (span.py)
    start: float | None = None
    end: float | None = None
    span_source: str = ""
    running: bool = False
    # where an agent lost data the rules judge by: {node, what, says}
    blind: list[dict] = field(default_factory=list)
    # how an ended job was ended, when that was a signal on every node (fleet.py)
    ended_by: str | None = None
    # --timeline: signal -> node -> one value per column (timeline.py)
    timeline: dict[str, dict[str, list]] = field(default_factory=dict)
    timeline_start: float = 0.0
    timeline_step: float = 0.0

    def to_json(self) -> dict:
        return {**asdict(self), "findings": [asdict(f) for f in self.findings]}


def rank(f: Finding) -> tuple:
    """The worst first; among equals the earliest (what came first is the
    likelier cause of what followed), then the largest."""
    return (-f.severity, f.since if f.since is not None else float("inf"), not f.outlier,
            -f.value, f.node)


def valid_window(window: str) -> str:
    if not isinstance(window, str) or not _DURATION.fullmatch(window):
        raise ExplainError(f"--window {window!r}: a duration such as 90s, 15m or 2h")
    return window


def seconds(window: str) -> float:
    return float(window[:-1]) * {"s": 1, "m": 60, "h": 3600, "d": 86400}[window[-1]]


def judged(rule, words: dict) -> tuple[int, str, dict]:
    """(severity, what to do, words `says` needs beyond the labels) of one
    finding of `rule`: the rule's own, but an XID's from the XID catalog and
    a node condition's from the conditions `tracehound health` drains on."""
    if rule.name == "gpu_xid":
        return (*xid_verdict(words.get("xid", "")), {})
    if rule.name == "killed_by_signal" and words.get("signal") in CRASH_SIGNALS:
        return rule.severity, CRASH_ACTION, {}
    if rule.name == "node_unfit":
        # fleet mode asks for the catalog's conditions only, node mode keeps them only
        cond = BY_GAUGE[words["condition"]]
        # a condition health does not drain on by default is worth a look
        return (rule.severity if cond.drains else 2), cond.action, {"phrase": cond.phrase}
    return rule.severity, rule.action, {}


def xid_verdict(xid: str) -> tuple[int, str]:
    """(severity, what to do) of an XID, from the catalog: a fatal one breaks
    the job, another is worth a look."""
    info = lookup(int(xid) if xid.isdigit() else -1)
    return (5 if info.severity == FATAL else 3), f"XID {info.xid} ({info.name}): {info.action}"
