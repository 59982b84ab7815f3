"""Per-cgroup pressure stall time and process states -> metric families,
read from the cgroup tree at scrape time (host/cgroup_state.py).

A process state no process of a cgroup is in has no series: an interior
cgroup (its processes live in its children) exports pressure only, and a
leaf exports the two or three states its processes are in, not six.

Where the agent counts by a v1 hierarchy on a hybrid host (Slurm's
cgroup/v1 plugin leaves a job's processes at the v2 root), the jobs' own
v1 cgroups are walked too, for what v1 has of them: their processes'
states and memory (v1 has no PSI, and the freezer no CPU time). A stopped
rank is then seen under its job.
"""
from __future__ import annotations

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from ..attribution.owners import Owners
from ..attribution.workload import WORKLOAD_LABELS
from ..host import cgroup_state
from ..host.cgroup_state import RESOURCES, PSI_KINDS, STATES


class PressureCollector:
    name = "pressure"

    def __init__(self, root: str, owners: Owners, max_cgroups: int, proc_root: str = "/proc",
                 jobs_v1: Owners | None = None):
        self.root = root
        self.owners = owners
        self.max_cgroups = max_cgroups
        self.proc_root = proc_root
        self.jobs_v1 = jobs_v1      # the key hierarchy's owners, when it is v1 on a hybrid host

    def _a_job(self, path: str) -> bool:
        """A scheduler job's cgroup of this node, in the v1 key hierarchy."""
        owners = self.jobs_v1
        return bool(owners.in_scope(path)
                    and dict(zip(WORKLOAD_LABELS, owners.workload(path))).get("job_id"))

    def collect(self):
        walk = cgroup_state.walk(self.root, self.max_cgroups, self.proc_root)
        owner = ["cgroup", *WORKLOAD_LABELS]
        stalled = CounterMetricFamily(
            "tracehound_pressure_stalled_seconds",
            "Time tasks of the cgroup (and its descendants) were stalled waiting for a "
            "resource (PSI): some = at least one task, full = all non-idle tasks at once.",
            labels=[*owner, "resource", "kind"])
        procs = GaugeMetricFamily(
            "tracehound_cgroup_processes",
            "The cgroup's own processes by state (running, sleeping, disk = uninterruptible, "
            "stopped, zombie, other); a state with no process has no series.",
            labels=[*owner, "state"])
        cpu = CounterMetricFamily(
            "tracehound_cgroup_cpu_seconds",
            "CPU time of the cgroup and its descendants (cpu.stat usage_usec).", labels=owner)
        rss = GaugeMetricFamily(
            "tracehound_cgroup_memory_rss_bytes",
            "Resident memory of the cgroup's own processes, summed (pages two of them share "
            "count twice); no series for a cgroup without processes.", labels=owner)
        cut, shown = 0, set()
        sources = [(walk, self.owners)]
        if self.jobs_v1 is not None:
            # read_if: only this node's job cgroups are read, and so returned
            sources.append((cgroup_state.walk(self.jobs_v1.root, self.max_cgroups,
                                              self.proc_root, read_if=self._a_job),
                            self.jobs_v1))
        for source, owners in sources:
            for cg in source.cgroups:
                if not owners.in_scope(cg.path):        # another node's (--cgroup-scope)
                    continue
                labels = [cg.path, *owners.workload(cg.path)]
                if tuple(labels) in shown:
                    continue
                shown.add(tuple(labels))
                for res in RESOURCES:
                    for kind in PSI_KINDS:
                        usec = cg.pressure.get((res, kind))
                        if usec is not None:
                            stalled.add_metric([*labels, res, kind], usec / 1e6)
                for state in STATES:
                    if cg.states.get(state):
                        procs.add_metric([*labels, state], cg.states[state])
                cut += cg.pids_cut
                if cg.cpu_usec is not None:
                    cpu.add_metric(labels, cg.cpu_usec / 1e6)
                if any(cg.states.values()):
                    rss.add_metric(labels, cg.rss_bytes)
        truncated = GaugeMetricFamily(
            "tracehound_pressure_cgroups_truncated",
            "1 when the last walk of the cgroup tree stopped at --pressure-max-cgroups "
            "directories: cgroups beyond it have no pressure series.")
        truncated.add_metric([], int(any(w.truncated for w, _o in sources)))
        walked = GaugeMetricFamily("tracehound_pressure_cgroups",
                                   "Populated cgroups the last walk read.")
        walked.add_metric([], sum(len(w.cgroups) for w, _o in sources))
        pids_cut = GaugeMetricFamily(
            "tracehound_pressure_processes_truncated",
            f"cgroups with more than {cgroup_state.MAX_PIDS} processes, whose states count "
            "the first ones only.")
        pids_cut.add_metric([], cut)
        # the paths of cgroups removed since are forgotten once no subsystem needs them
        for w, owners in sources:
            owners.retain(self.name, {cg.cgroup_id for cg in w.cgroups})
        yield stalled
        yield procs
        yield cpu
        yield rss
        yield truncated
        yield walked
        yield pids_cut
