"""Stalled jobs: a workload whose processes live but move nothing.

A collective job hangs without failing: a stopped rank, a rank waiting on a
peer that will never answer, a fabric that drops everything. Its processes
stay alive, so nothing exits and nothing errs; what stops is progress. This
detector watches the workloads a scheduler started (Slurm jobs, pods, VMs;
systemd units are services that may idle for hours) and the cgroups named by
`--stall-cgroups`, and raises

  job_stalled   reason "stopped": every process of the workload is stopped
                (SIGSTOP, a debugger) or its cgroup is frozen;
                reason "no_progress": the workload made progress before (file
                I/O, TCP bytes, GPU busy time: the progress sources the
                subsystems publish; CPU time too for a job without a GPU)
                and has made none for `stall_after_s`, though its processes
                live: a GPU it holds sits idle too. `cpu_seconds` says whether it spins (a hung
                collective busy-polls) or sleeps.
  job_resumed   a stalled workload moves again (or its processes run again).

One job_stalled per episode. A workload whose data moves through a channel
the agent cannot count (it holds RDMA objects, or a GPU whose utilization
NVML does not give: the subsystems name such "blind" cgroups) is judged only
on "stopped", so a healthy NCCL job over InfiniBand is never called stalled. The first look at a workload is a
baseline: only data it moves while watched counts, so a job holding an idle
control socket is never "no_progress". A job without a GPU that computes is
working: a CPU-bound solver between checkpoints is not a stall, and a rank
hung in a busy loop is the one case this rule cannot see. For a job holding
a GPU only the GPU counts: a hung collective spins its CPUs while the GPU
idles, and `cpu_seconds` in the event says so.
"""
from __future__ import annotations

import os
import threading
from collections.abc import Callable
from dataclasses import dataclass, field

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from ..attribution.workload import SCHEDULED, WORKLOAD_LABELS
from ..host.cgroup_state import Walk, cpu_usec, populated_cgroups, process_states
from ..linear_regex import LinearPattern
from . import log_event, now_iso
from .progress_board import ProgressBoard

KINDS = ("job_stalled", "job_resumed")
GPU_SOURCE = "gpu"
# CPU time that counts as work for a job without a GPU: 5 % of one CPU. A
# process waiting in poll() or on a lock uses next to none.
CPU_BUSY_SHARE = 0.05
JOB_WORKLOADS = SCHEDULED
PART_LABELS = ("step", "task", "container")
# a node has hundreds of cgroups, a busy one a few thousand: bound the walk
MAX_CGROUPS = 4096
Emit = Callable[[dict], None]


@dataclass
class StallConfig:
    stall_after_s: float
    cgroups: str | None = None          # regular expression over cgroup paths
    interval_s: float = 5.0


@dataclass
class _Workload:
    labels: dict[str, str]
    cgroup: str                          # its top cgroup (shortest path)
    directory: str
    progress: tuple = ()
    last_progress: float | None = None   # None: has moved nothing while watched
    cpu_at_progress: int = 0
    stopped_since: float | None = None
    stalled: str | None = None           # the reason of the episode in progress
    stalled_since: float = 0.0           # when the episode began: stopped, or last progress
    seen: float = 0.0
    cpu_seen: int = 0                    # CPU time (µs) and when, at the last look
    seen_at: float = 0.0
    members: dict[int, str] = field(default_factory=dict)   # cgroup id -> path


class StallDetector:
    """A detector for the agent's schedule (`name`, `interval`, `run_once`)
    and the collector of its own gauges."""

    name = "stall"

    def __init__(self, config: StallConfig, root: str, board: ProgressBoard,
                 workload: Callable[[str], tuple[str, ...]], emit: Emit = log_event,
                 states: Callable[[str], dict[str, int]] = process_states,
                 in_scope: Callable[[str], bool] = lambda path: True):
        self.config = config
        self.interval = config.interval_s
        self.root = root
        self.board = board
        self.workload = workload
        self.emit = emit
        self.states = states
        self.in_scope = in_scope            # --cgroup-scope: another node's cgroups are not ours
        self._pattern = LinearPattern(config.cgroups) if config.cgroups else None
        self._jobs: dict[tuple, _Workload] = {}
        self._counts = dict.fromkeys(KINDS, 0)
        self._lock = threading.Lock()
        self.truncated = False

    # -- which cgroups are workloads -----------------------------------------
    def _key(self, path: str) -> tuple | None:
        if not self.in_scope(path):
            return None
        values = self.workload(path)
        if dict(zip(WORKLOAD_LABELS, values)).get("workload") in JOB_WORKLOADS:
            # the job, pod or VM: its steps, tasks and containers are its parts,
            # judged together (a stopped 3-task job is one stall, not three)
            return ("labels", *(v if k not in PART_LABELS else ""
                                for k, v in zip(WORKLOAD_LABELS, values)))
        if self._pattern is not None and self._pattern.fullmatch(path):
            return ("cgroup", path)
        return None

    def _walk(self):
        """(cgroup id, path, directory, key) of every populated cgroup, as
        cgroup_state.populated_cgroups walks them (root's directories first,
        and a workload's own even where its user owns them); stopping at the
        bound is said by tracehound_stall_walk_truncated."""
        keys: dict[str, tuple | None] = {}

        def key(path: str) -> tuple | None:
            if path not in keys:
                keys[path] = self._key(path)
            return keys[path]
        out = Walk()
        for directory, path, cgid in populated_cgroups(
                self.root, MAX_CGROUPS, out,
                lambda path, uid: uid == 0 or key(path) is not None):
            yield cgid, path, directory, key(path)
        self.truncated = out.truncated

    # -- the rule ---------------------------------------------------------------
    def run_once(self, now: float) -> None:
        found: dict[tuple, list[tuple[int, str, str]]] = {}
        for cgid, path, directory, key in self._walk():
            if key is not None:
                found.setdefault(key, []).append((cgid, path, directory))
        readings = self.board.read()
        blind = self.board.blind()
        with self._lock:
            for key, members in found.items():
                self._judge(key, members, readings, blind, now)
            for key in [k for k, job in self._jobs.items() if job.seen != now]:
                del self._jobs[key]          # ended, or no longer a workload

    def _judge(self, key, members, readings, blind, now) -> None:
        states: dict[str, int] = {}
        frozen = True
        for _cgid, _path, directory in members:
            for state, n in self.states(directory).items():
                states[state] = states.get(state, 0) + n
            frozen &= _frozen(directory)
        live = sum(n for s, n in states.items() if s != "zombie")
        if live == 0:
            return                      # nothing runs in it: not a stall, maybe ended
        job = self._jobs.get(key)
        if job is None:
            _c, top, directory = min(members, key=lambda m: len(m[1]))
            values = self.workload(top)
            job = self._jobs[key] = _Workload(
                {k: v for k, v in zip(WORKLOAD_LABELS, values) if v}, top, directory)
            first = True
        else:
            first = False
        job.seen = now
        job.members = {cgid: path for cgid, path, _d in members}
        cpu = _cpu_usec(job.directory)
        progress = tuple(sorted((src, cgid, values[cgid]) for src, values in readings.items()
                                for cgid in job.members if cgid in values))
        # A job computing on its CPUs is working; one holding a GPU is judged
        # by the GPU, whose collective may keep its CPUs spinning while the
        # GPU idles (NCCL busy-polls).
        holds_gpu = any(cgid in readings.get(GPU_SOURCE, {}) for cgid in job.members)
        computing = (not first and not holds_gpu
                     and cpu - job.cpu_seen >= CPU_BUSY_SHARE * 1e6 * (now - job.seen_at))
        # the first look is a baseline: counters that grew before it say
        # nothing about now (an idle control socket, an old checkpoint)
        if not first and (progress != job.progress or computing):
            job.last_progress, job.cpu_at_progress = now, cpu
        job.progress, job.cpu_seen, job.seen_at = progress, cpu, now
        stopped = frozen or states.get("stopped", 0) == live
        if not stopped:
            job.stopped_since = None
        elif job.stopped_since is None:
            job.stopped_since = now
        reason = self._reason(job, now, any(cgid in blind for cgid in job.members))
        if reason and job.stalled is None:
            since = job.stopped_since if reason == "stopped" else job.last_progress
            job.stalled, job.stalled_since = reason, since
            self._fire("job_stalled", job, reason=reason, frozen=frozen,
                       stalled_for_s=round(now - since, 1), processes=live,
                       cpu_seconds=round(max(0, cpu - job.cpu_at_progress) / 1e6, 3),
                       signals=sorted(readings))
        elif not reason and job.stalled is not None:
            self._fire("job_resumed", job, reason=job.stalled,
                       stalled_for_s=round(now - job.stalled_since, 1))
            job.stalled = None

    def _reason(self, job: _Workload, now: float, blind: bool) -> str | None:
        after = self.config.stall_after_s
        if job.stopped_since is not None:
            return "stopped" if now - job.stopped_since >= after else None
        if not blind and job.last_progress is not None and now - job.last_progress >= after:
            return "no_progress"
        return None

    def _fire(self, kind: str, job: _Workload, **detail) -> None:
        self._counts[kind] += 1
        self.emit({"time": now_iso(), "event": "job_anomaly", "kind": kind,
                   "cgroup": job.cgroup, **job.labels,
                   "cgroups": sorted(job.members.values()), **detail})

    # -- gauges -----------------------------------------------------------------
    def collect(self):
        with self._lock:
            stalled = [(job.cgroup, [job.labels.get(k, "") for k in WORKLOAD_LABELS],
                        job.stalled) for job in self._jobs.values() if job.stalled]
            watched, counts = len(self._jobs), dict(self._counts)
        gauge = GaugeMetricFamily(
            "tracehound_workload_stalled",
            "1 while a workload's processes live but are all stopped, or have moved no "
            "data for --stall-after (reason).", labels=["cgroup", *WORKLOAD_LABELS, "reason"])
        for cgroup, values, reason in sorted(stalled):
            gauge.add_metric([cgroup, *values, reason], 1)
        yield gauge
        yield GaugeMetricFamily("tracehound_stall_watched_workloads",
                                "Workloads (scheduler jobs, pods, VMs, --stall-cgroups) the "
                                "stall detector watches.", value=watched)
        yield GaugeMetricFamily("tracehound_stall_walk_truncated",
                                "1 when the stall detector's last walk of the cgroup tree "
                                "stopped at its bound: workloads past it were not judged.",
                                value=int(self.truncated))
        fam = CounterMetricFamily("tracehound_job_anomalies",
                                  "Job anomalies detected, by rule.", labels=["kind"])
        for kind, n in counts.items():
            fam.add_metric([kind], n)
        yield fam


def _read_small(path: str) -> str:
    try:
        with open(path, "rb") as f:
            return f.read(4096).decode(errors="replace")
    except OSError:
        return ""


def _frozen(directory: str) -> bool:
    return any(line.split() == ["frozen", "1"]
               for line in _read_small(os.path.join(directory, "cgroup.events")).splitlines())


def _cpu_usec(directory: str) -> int:
    """CPU time of the cgroup and its descendants: tells a spin from a wait."""
    return cpu_usec(directory) or 0
