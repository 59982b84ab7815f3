"""The pressure collector's families over a fake cgroup tree and /proc, and
the subsystem's start on hosts with and without PSI."""
import os

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from tracehound.attribution.owners import Owners
from tracehound.attribution.resolver import WorkloadResolver
from tracehound.collectors.pressure import PressureCollector
from tracehound.config import AgentConfig
from tracehound.subsystems.base import Context
from tracehound.host import cgroup_state
from tracehound.subsystems import pressure as pressure_mod
from tracehound.subsystems.pressure import PressureSubsystem

from tests.unit.test_cgroup_state import cgroup, proc

JOB = "/system.slice/slurmstepd.scope/job_77/step_0"


class Cgroups:
    def __init__(self, root):
        self.root = root
        self.retained = []

    def new_scrape(self):
        pass

    def alive(self, cgid):
        return True

    def removed(self, cgid):
        return not self.alive(cgid)

    def path(self, cgid):
        return "/"

    def forget(self, cgid):
        pass

    def retain(self, in_use):
        self.retained.append(set(in_use))
        return []


def owners(root) -> Owners:
    return Owners(Cgroups(root), WorkloadResolver(job_id_source=None, pod_source=None))


def fake_host(tmp_path):
    root, procs = tmp_path / "cg", tmp_path / "proc"
    cgroup(root, "/", pids=[1])
    cgroup(root, "/system.slice", pids=[])
    cgroup(root, "/system.slice/slurmstepd.scope", pids=[])
    cgroup(root, "/system.slice/slurmstepd.scope/job_77", pids=[])
    cgroup(root, JOB, pids=[10, 11, 12], extra={"cpu.pressure": "some avg10=50.0 total=2500000\n"})
    cgroup(root, "/idle", populated=False)
    for pid, state in ((1, "S"), (10, "R"), (11, "R"), (12, "T")):
        proc(procs, pid, state)
    return str(root), str(procs)


def labels(base, **more) -> tuple:
    return tuple(sorted(base + tuple(more.items())))


def scrape(collector) -> dict:
    reg = CollectorRegistry(auto_describe=False)
    reg.register(collector)
    text = generate_latest(reg).decode()
    return {(s.name, tuple(sorted((k, v) for k, v in s.labels.items() if v))): s.value
            for fam in text_string_to_metric_families(text) for s in fam.samples}


def test_stall_seconds_and_process_states_with_workload_labels(tmp_path):
    root, procs = fake_host(tmp_path)
    m = scrape(PressureCollector(root, owners(root), 100, procs))
    job = (("cgroup", JOB), ("job_id", "77"), ("step", "0"), ("workload", "slurm"))
    stalled = "tracehound_pressure_stalled_seconds_total"
    assert m[(stalled, labels(job, kind="some", resource="cpu"))] == 2.5
    # the job's cpu.pressure has no full line: no series, not a zero
    assert (stalled, labels(job, kind="full", resource="cpu")) not in m
    assert m[(stalled, (("cgroup", "/"), ("kind", "full"), ("resource", "io")))] == 30 / 1e6
    gauge = "tracehound_cgroup_processes"
    assert m[(gauge, labels(job, state="running"))] == 2
    assert m[(gauge, labels(job, state="stopped"))] == 1
    # states without a process, and interior cgroups, have no series
    assert not any(k[0] == gauge and ("state", "zombie") in k[1] for k in m)
    assert not any(k[0] == gauge and ("cgroup", "/system.slice") in k[1] for k in m)
    assert not any(("cgroup", "/idle") in k[1] for k in m)
    assert m[("tracehound_pressure_cgroups_truncated", ())] == 0
    assert m[("tracehound_pressure_cgroups", ())] == 5
    assert m[("tracehound_pressure_processes_truncated", ())] == 0


def test_every_series_carries_all_workload_labels(tmp_path):
    root, procs = fake_host(tmp_path)
    reg = CollectorRegistry(auto_describe=False)
    reg.register(PressureCollector(root, owners(root), 100, procs))
    fams = {f.name: f for f in text_string_to_metric_families(generate_latest(reg).decode())}
    for name in ("tracehound_pressure_stalled_seconds", "tracehound_cgroup_processes"):
        labels = set(fams[name].samples[0].labels)
        assert {"cgroup", "workload", "job_id", "pod", "vm", "unit"} <= labels


def test_a_cut_walk_says_so_and_the_walked_ids_are_retained(tmp_path):
    root, procs = fake_host(tmp_path)
    own = owners(root)
    m = scrape(PressureCollector(root, own, 2, procs))
    assert m[("tracehound_pressure_cgroups_truncated", ())] == 1
    assert m[("tracehound_pressure_cgroups", ())] == 2
    # /idle was looked at (and skipped, uncounted), / and /system.slice were read: the
    # ids the collector refers to, which the schedule's pruning keeps
    own.prune()
    assert own.cgroups.retained[-1] == {os.stat(root).st_ino,
                                        os.stat(os.path.join(root, "system.slice")).st_ino}


def ctx(root, **config):
    return Context(AgentConfig(**config), mounts=None, owners=owners(root))


def test_subsystem_runs_where_the_root_has_psi(tmp_path):
    root, _ = fake_host(tmp_path)
    s = PressureSubsystem(ctx(root, pressure_max_cgroups=7))
    s.start()
    assert s.reason is None and s.collectors()[0].max_cgroups == 7
    assert "7 cgroups" in s.status_lines()[0]
    assert s.modes() == {} and s.detectors() == [] and not s.required and not s.needs_bpf
    s.close()


def test_subsystem_without_psi_gets_a_reason(tmp_path, monkeypatch):
    root = tmp_path / "cg"
    cgroup(root, "/", psi=False)
    monkeypatch.setattr(pressure_mod, "psi_absent",
                        lambda r: cgroup_state.psi_absent(r, str(tmp_path / "proc")))
    s = PressureSubsystem(ctx(str(root)))
    s.start()
    assert "pressure stall" in s.reason and s.collectors() == []
    assert s.status_lines() == [f"pressure: not available ({s.reason})"]


def test_slurm_v1_jobs_states_come_from_their_v1_cgroups_once(tmp_path):
    # a hybrid host with Slurm's cgroup/v1 plugin: the job's processes sit at
    # the v2 root and in the freezer's slurm_<node>/uid_U/job_J/step_S/task_T
    root, procs = fake_host(tmp_path)
    v1 = tmp_path / "freezer"
    cgroup(v1, "/", pids=[1, 40], psi=False)
    task = "/slurm_n1/uid_0/job_5/step_0/task_0"
    for rel, pids in (("/slurm_n1", []), ("/slurm_n1/uid_0", []), ("/slurm_n1/uid_0/job_5", []),
                      ("/slurm_n1/uid_0/job_5/step_0", []), (task, [40]),
                      ("/slurm_n2/uid_0/job_6/step_0/task_0", [41])):
        cgroup(v1, rel, pids=pids, psi=False)
    proc(procs, 40, "T")
    proc(procs, 41, "T")
    key = Owners(Cgroups(str(v1)), WorkloadResolver(job_id_source=None, pod_source=None),
                 scope="/slurm_n1")
    m = scrape(PressureCollector(root, owners(root), 100, procs, jobs_v1=key))
    gauge = "tracehound_cgroup_processes"
    stopped = {dict(k[1]).get("cgroup"): v for k, v in m.items()
               if k[0] == gauge and ("state", "stopped") in k[1]}
    # the job's task under its job (v1), the v2 job as before; not the other
    # node's job, and the v1 root (every other process) is not read
    assert stopped == {task: 1, JOB: 1}, stopped
    job5 = next(k for k in m if k[0] == gauge and ("cgroup", task) in k[1])
    assert ("job_id", "5") in job5[1] and ("step", "0") in job5[1]
    assert not any(("cgroup", "/") in k[1] and k[0] == gauge and ("state", "stopped") in k[1]
                   for k in m)
