"""The job's own time, which every rule of fleet mode is judged over.

A node's series (its GPUs' XIDs, its retransmitted segments, its GPU
conditions) were there before the job came and go on after it left: an XID
an hour before the job started, or a minute after it ended, is not the
job's. So the question is first: when did the job run?

  slurm    squeue (a job slurmctld still holds: running, or ended less than
           MinJobAge ago) or sacct (the accounting database, where there is
           one): the start, and the end or now. Only fields squeue and sacct
           format are read (a job's name or comment is the user's text).
  series   otherwise, the first and the last sample of the series labelled
           with the job (LIVE and EXITS below), found in the search range: a coarse
           range query, then finer ones round each edge, to a second. The end is read
           from the series that go with the job's cgroup, not from its
           exits, which are exported a retirement period longer.

`--window W` cuts the span to its last W (the job's last hour, say).
"""
from __future__ import annotations

import math
import os
import shutil
import subprocess
import time
from dataclasses import dataclass

from .answer import PRESENCE, ExplainError

SLURM_TIMEOUT_S = 10.0
# how far back the series are searched for a job Slurm no longer knows:
# Prometheus's default retention
SEARCH_S = 15 * 86400
# Points of the coarse range query over the whole search, and of each finer
# one round an edge. Each costs its points times the job's series (tens of
# thousands on 256 nodes): a few queries of 100 points, each within the last
# one's step, cost a tenth of one coarse query of 1,000 and fine ones of a
# second over a whole coarse step.
COARSE_POINTS = 100
REFINE_POINTS = 100
FINE_STEP_S = 1.0
RUNNING_SLACK_S = 15              # series seen this recently: the job still runs (as said)
MAX_LINE = 4096


@dataclass(frozen=True)
class Span:
    start: float
    end: float
    source: str                   # "slurm", "series"
    running: bool = False
    state: str = ""               # Slurm's, where it said (CANCELLED, TIMEOUT, ...)

    @property
    def seconds(self) -> float:
        return max(self.end - self.start, 1.0)

    def cut(self, last_s: float | None, now: float) -> "Span":
        """The span within the last LAST_S seconds before now."""
        if last_s is None:
            return self
        return Span(max(self.start, now - last_s), self.end, self.source, self.running,
                    self.state)


def _run(argv: list[str]) -> str | None:
    if shutil.which(argv[0]) is None:
        return None
    # epoch seconds: no time zone to guess
    env = {**os.environ, "SLURM_TIME_FORMAT": "%s"}
    try:
        out = subprocess.run(argv, capture_output=True, text=True, timeout=SLURM_TIMEOUT_S,
                             env=env, check=False, errors="replace")
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout if out.returncode == 0 else None


def parse_slurm_line(text: str, job: str, now: float) -> Span | None:
    """`JOBID|START|END|STATE` (squeue's or sacct's, times in epoch seconds)
    of JOB -> its span; None for a job not started or an unreadable line."""
    for line in text.splitlines():
        parts = line[:MAX_LINE].strip().split("|")
        if len(parts) != 4 or parts[0] != job:
            continue
        start, end, state = parts[1], parts[2], parts[3].split()[0] if parts[3] else ""
        if not start.isdigit() or int(start) == 0 or state == "PENDING":
            return None
        # COMPLETING: ended (its end time set), its epilog still running
        running = state in ("RUNNING", "SUSPENDED", "CONFIGURING")
        ends = now if running or not end.isdigit() or int(end) == 0 else min(float(end), now)
        return Span(float(start), max(ends, float(start)), "slurm", running, state)
    return None


def from_slurm(job: str, now: float | None = None) -> Span | None:
    now = time.time() if now is None else now
    for argv in (["squeue", "-h", "-t", "all", "-j", job, "-o", "%i|%S|%e|%T"],
                 ["sacct", "-X", "-n", "-P", "-j", job, "-o", "JobIDRaw,Start,End,State"]):
        text = _run(argv)
        span = parse_slurm_line(text, job, now) if text else None
        if span is not None:
            return span
    return None


# a job's exits are exported a retirement period after its cgroup is gone;
# its other series go with the cgroup: the end is read from those
EXITS = "tracehound_process_exits_total"
# A job's I/O counters are one series per cgroup, mount and counter (tens
# of thousands on 256 nodes), its workload info one per cgroup with I/O,
# exported as long as they are: that says when as well, at a tenth of the
# series each range query reads.
IO_COUNTERS = ("tracehound_io_read_bytes_total", "tracehound_io_write_bytes_total")
WORKLOAD_INFO = "tracehound_workload_info"
LIVE = (WORKLOAD_INFO, *(m for m in PRESENCE if m != EXITS and m not in IO_COUNTERS))


def _present_at(ask, job_sel: str, start: float, end: float, step: float,
                lookback: str = "") -> dict[str, list]:
    """"live" and "exits" -> the times of the range query's points where the
    job had such series (with LOOKBACK, e.g. "[1296s]": a sample within it
    before the point, so a coarse step misses no short job)."""
    def one(m: str) -> str:
        sel = f"{m}{{{job_sel}}}"
        return f"group(last_over_time({sel}{lookback}))" if lookback else f"group({sel})"

    def group(kind: str, metrics) -> str:
        inner = " or ".join(one(m) for m in metrics)
        return f'label_replace(group({inner}), "kind", "{kind}", "", "")'
    times: dict[str, set] = {"live": set(), "exits": set()}
    for labels, points in ask.over(f"{group('live', LIVE)} or {group('exits', [EXITS])}",
                                   start, end, step):
        times.get(labels.get("kind", ""), set()).update(t for t, v in points if v == v)
    return {kind: sorted(ts) for kind, ts in times.items()}


def _edges(seen: dict[str, list]) -> tuple[float, float] | None:
    every = sorted(seen["live"] + seen["exits"])
    if not every:
        return None
    return every[0], (seen["live"] or every)[-1]


def from_series(ask, job_sel: str, now: float, search_s: float = SEARCH_S) -> Span | None:
    """The job's first and last sample within SEARCH_S before now, to about a
    second: a coarse range query, then finer ones round each edge, each of
    REFINE_POINTS points over the step before it, down to a second."""
    step = max(search_s / COARSE_POINTS, 1.0)
    coarse = _edges(_present_at(ask, job_sel, now - search_s, now, step,
                                f"[{math.ceil(step)}s]"))
    if coarse is None:
        return None
    # Each point of a search with a lookback saw the step before it: the
    # first and the last sample lie in the step before the first and the
    # last point, searched there with a finer step (and the same lookback),
    # down to a second. The last search has none: a job still running is
    # then present at its last point, as at every scrape.
    start, end = coarse
    while step > FINE_STEP_S:
        finer = max(step / REFINE_POINTS, FINE_STEP_S)
        lookback = f"[{math.ceil(finer)}s]" if finer > FINE_STEP_S else ""
        first = _edges(_present_at(ask, job_sel, start - step - finer, start, finer, lookback))
        last = _edges(_present_at(ask, job_sel, end - step - finer, min(end, now), finer,
                                  lookback))
        start = first[0] if first else start
        end = last[1] if last else end
        step = finer
    # the last sample is the end either way: a job still running has one
    # from the last scrape, and a node's XID after it is not yet the job's
    return Span(start, end, "series", now - end <= 2 * FINE_STEP_S + RUNNING_SLACK_S)


def of_job(ask, job: str, job_sel: str, window_s: float | None, now: float | None = None,
           use_slurm: bool = True) -> Span | None:
    """The job's span, cut to the last WINDOW_S, or None where no source knows it."""
    now = time.time() if now is None else now
    span = from_slurm(job, now) if use_slurm else None
    if span is None:
        span = from_series(ask, job_sel, now, window_s or SEARCH_S)
    if span is None:
        return None
    if window_s is not None and span.end <= now - window_s:
        raise ExplainError(f"job {job} ended before the last {window_s:g} s")
    return span.cut(window_s, now)
