"""Hybrid hosts: Slurm cgroup/v1 jobs found through their processes' v1 paths."""
import pytest

from tests.unit.fixtures.fakeproc import FakeClock, add_cgroup, add_process
from tracehound.attribution.cgroup_v1 import host_has_v1_hierarchies, v1_path_of_pid
from tracehound.attribution.procs import parse_proc_cgroup
from tracehound.attribution.resolver import WorkloadResolver
from tracehound.attribution.workload import Workload

SLURMD = "/system.slice/slurmd.service"


def v1_cgroup(freezer="/", cpuset="/", memory="/", unified=SLURMD):
    """A /proc/<pid>/cgroup of a hybrid host (Debian 10 style numbering)."""
    return (f"12:freezer:{freezer}\n11:cpuset:{cpuset}\n10:memory:{memory}\n"
            f"9:cpu,cpuacct:/\n1:name=systemd:{unified}\n0::{unified}\n")


@pytest.fixture
def host(tmp_path):
    cg, proc = tmp_path / "unified", tmp_path / "proc"
    add_process(proc, "self", cgroup=v1_cgroup(unified="/user.slice"))
    return cg, proc


def resolver(cg, proc, **kw):
    kw.setdefault("job_id_source", None)
    return WorkloadResolver(str(cg), proc_root=str(proc), pod_source=None, **kw)


def test_parse_proc_cgroup():
    paths = parse_proc_cgroup(v1_cgroup(freezer="/slurm/uid_5/job_1/step_0/task_0") + "garbage\n")
    assert paths["freezer"] == "/slurm/uid_5/job_1/step_0/task_0"
    assert paths["cpu"] == paths["cpuacct"] == "/"
    assert paths["name=systemd"] == SLURMD and paths[""] == SLURMD
    assert parse_proc_cgroup("0::/init.scope\n") == {"": "/init.scope"}


def test_controllers_are_tried_in_order(host):
    _cg, proc = host
    add_process(proc, 310, cgroup="5:cpuset:/slurm/uid_1/job_9/step_1\n0::/x.service\n")
    assert v1_path_of_pid(310, proc_root=str(proc)) == "/slurm/uid_1/job_9/step_1"    # no freezer: cpuset
    add_process(proc, 311, cgroup="0::/x.service\n")
    assert v1_path_of_pid(311, proc_root=str(proc)) is None                            # pure v2


def test_v1_slurm_job_wins_over_the_v2_unit(host):
    cg, proc = host
    add_process(proc, 1, cgroup=v1_cgroup())                                            # slurmd itself
    add_process(proc, 400, cgroup=v1_cgroup(freezer="/slurm/uid_1000/job_42/step_batch/task_0",
                                            cpuset="/slurm/uid_1000/job_42/step_batch"))
    add_process(proc, 401, cgroup=v1_cgroup(freezer="/slurm/uid_1000/job_42/step_batch/task_0"))
    add_cgroup(cg, SLURMD, [1, 400, 401])
    assert resolver(cg, proc).resolve(SLURMD) == Workload(kind="slurm", job_id="42", step="batch", task="0")


def test_slurms_own_v1_cgroups_are_no_job(host):
    cg, proc = host
    # slurmd constrained by MemSpecLimit sits in the v1 "system" cgroup
    add_process(proc, 1, cgroup=v1_cgroup(freezer="/slurm/system", memory="/slurm/system"))
    add_cgroup(cg, SLURMD, [1])
    assert resolver(cg, proc).resolve(SLURMD) == Workload(kind="slurm")
    add_process(proc, 405, cgroup=v1_cgroup(freezer="/slurm/uid_1/job_3/step_0/task_0"))
    add_cgroup(cg, SLURMD, [1, 405])
    assert resolver(cg, proc).resolve(SLURMD) == Workload(kind="slurm", job_id="3", step="0", task="0")


def test_tasks_and_steps_of_one_job_keep_what_they_share(host):
    cg, proc = host
    add_process(proc, 410, cgroup=v1_cgroup(freezer="/slurm/uid_1/job_7/step_0/task_0"))
    add_process(proc, 411, cgroup=v1_cgroup(freezer="/slurm/uid_1/job_7/step_0/task_1"))
    add_cgroup(cg, SLURMD, [410, 411])
    assert resolver(cg, proc).resolve(SLURMD) == Workload(kind="slurm", job_id="7", step="0")
    add_process(proc, 412, cgroup=v1_cgroup(freezer="/slurm/uid_1/job_7/step_extern/task_0"))
    add_cgroup(cg, SLURMD, [410, 412])
    assert resolver(cg, proc).resolve(SLURMD) == Workload(kind="slurm", job_id="7")


def test_processes_of_different_jobs_are_not_split_by_guessing(host):
    cg, proc = host
    add_process(proc, 420, cgroup=v1_cgroup(freezer="/slurm/uid_1/job_7/step_0/task_0"))
    add_process(proc, 421, cgroup=v1_cgroup(freezer="/slurm_n2/uid_2/job_8/step_0/task_0"))
    add_cgroup(cg, SLURMD, [420, 421])
    assert resolver(cg, proc).resolve(SLURMD) == Workload(kind="slurm")


def test_no_slurm_processes_keeps_the_unit(host):
    cg, proc = host
    add_process(proc, 430, cgroup=v1_cgroup(freezer="/", unified="/system.slice/sshd.service"))
    add_cgroup(cg, "/system.slice/sshd.service", [430])
    add_cgroup(cg, "/thtest/job1", [430])
    r = resolver(cg, proc)
    assert r.resolve("/system.slice/sshd.service") == Workload(kind="systemd", unit="sshd.service")
    assert r.resolve("/thtest/job1") == Workload()


def test_only_the_cgroups_own_processes_count(host):
    cg, proc = host
    add_process(proc, 440, cgroup=v1_cgroup(freezer="/slurm/uid_1/job_7/step_0/task_0"))
    add_cgroup(cg, "/system.slice")
    add_cgroup(cg, SLURMD, [440])
    assert resolver(cg, proc).resolve("/system.slice") == Workload(kind="systemd", unit="system.slice")


def test_shared_cgroup_is_rechecked_as_jobs_come_and_go(host):
    cg, proc = host
    clock = FakeClock()
    add_process(proc, 1, cgroup=v1_cgroup())
    add_cgroup(cg, SLURMD, [1])
    r = resolver(cg, proc, clock=clock)
    assert r.resolve(SLURMD) == Workload(kind="systemd", unit="slurmd.service")
    add_process(proc, 450, cgroup=v1_cgroup(freezer="/slurm/uid_1/job_77/step_0/task_0"))
    add_cgroup(cg, SLURMD, [1, 450])
    assert r.resolve(SLURMD).kind == "systemd"              # cached until the recheck
    clock.advance(r.recheck_seconds)
    assert r.resolve(SLURMD) == Workload(kind="slurm", job_id="77", step="0", task="0")


def test_opaque_v1_job_directory_asks_the_source(host):
    cg, proc = host
    add_process(proc, 460, cgroup=v1_cgroup(freezer="/slurm/uid_1/c0ffee/step_0/task_2"))
    add_cgroup(cg, SLURMD, [460])
    known = resolver(cg, proc, job_id_source={460: ("5150", "0")}.get)
    assert known.resolve(SLURMD) == Workload(kind="slurm", job_id="5150", step="0", task="2")
    unknown = resolver(cg, proc, job_id_source=lambda pid: None)
    assert unknown.resolve(SLURMD) == Workload(kind="slurm")


def test_pure_v2_host_never_looks_at_v1(tmp_path):
    cg, proc = tmp_path / "cgroup", tmp_path / "proc"
    add_process(proc, "self", cgroup="0::/system.slice/tracehound.service\n")
    add_process(proc, 470, cgroup=v1_cgroup(freezer="/slurm/uid_1/job_7/step_0/task_0"))
    add_cgroup(cg, SLURMD, [470])
    assert not host_has_v1_hierarchies(str(proc))
    assert host_has_v1_hierarchies(str(proc / "missing")) is False
    assert resolver(cg, proc).resolve(SLURMD) == Workload(kind="systemd", unit="slurmd.service")
    forced = resolver(cg, proc, v1_lookup=True)
    assert forced.resolve(SLURMD).job_id == "7"


def test_an_empty_cgroup_is_not_cached_as_no_job(host):
    """A cgroup is made, then its first process joins a Slurm v1 job: the
    answer read while it was empty must not hide the job until a recheck."""
    cg, proc = host
    clock = FakeClock()
    r = resolver(cg, proc, clock=clock)
    add_cgroup(cg, "/fresh.scope")
    assert r.resolve("/fresh.scope").kind == "systemd"
    assert "/fresh.scope" not in r.cached_paths()
    add_process(proc, 470, cgroup=v1_cgroup(freezer="/slurm/uid_1/job_88/step_0/task_0"))
    add_cgroup(cg, "/fresh.scope", [470])
    assert r.resolve("/fresh.scope") == Workload(kind="slurm", job_id="88", step="0", task="0")
