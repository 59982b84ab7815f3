"""SLURM job id sources and the resolution of opaque job directories."""
import os
import stat

import pytest

from tests.unit.fixtures.fakeproc import FakeClock, add_cgroup, add_process
from tracehound.attribution.resolver import WorkloadResolver
from tracehound.attribution.slurm_jobs import (
    ScontrolListPids,
    StepdProcessTitle,
    StepEnvironment,
    default_job_id_source,
    first_of,
    parse_listpids,
)
from tracehound.attribution.workload import Workload

LISTPIDS = """\
PID      JOBID    STEPID   LOCALID GLOBALID
-1       13073    extern   0       0
3913206  13073    extern   -       -
3913212  13073    batch    0       0
3913222  13073    batch    -       -
1079411  13074    0        0       0
1079629  13074    0+1      -       -
"""

SCOPE = "/system.slice/slurmstepd.scope"


def test_parse_listpids():
    table = parse_listpids(LISTPIDS)
    assert table == {
        3913206: ("13073", "extern"), 3913212: ("13073", "batch"), 3913222: ("13073", "batch"),
        1079411: ("13074", "0"), 1079629: ("13074", "0+1"),
    }
    assert parse_listpids("No job steps exist on this node.\n") == {}
    assert parse_listpids("") == {}
    # rows before a header, or malformed rows, are not believed
    assert parse_listpids("12 34 0\nPID JOBID STEPID\nx 1 0\n5 abc 0\n7 8\n") == {}


def test_scontrol_source_reads_on_miss_at_most_once_per_interval():
    calls = []
    clock = FakeClock()

    def run(argv, timeout):
        calls.append(list(argv))
        return LISTPIDS

    source = ScontrolListPids("/opt/slurm/bin/scontrol", min_interval=10, run=run, clock=clock)
    assert source(3913212) == ("13073", "batch")
    assert calls == [["/opt/slurm/bin/scontrol", "listpids"]]
    assert source(1079411) == ("13074", "0")      # known: no new read
    assert source(555) is None                      # miss within the interval: no new read
    assert len(calls) == 1
    clock.advance(10)
    assert source(555) is None
    assert len(calls) == 2


def test_scontrol_source_asks_every_local_slurmd():
    outputs = {"n1": "PID JOBID STEPID LOCALID GLOBALID\n10 1 0 0 0\n",
               "n2": "PID JOBID STEPID LOCALID GLOBALID\n20 2 batch 0 0\n"}
    seen = []

    def run(argv, timeout):
        seen.append(list(argv))
        return outputs[argv[-1]]

    source = ScontrolListPids(node_names=("n1", "n2"), run=run)
    assert source(10) == ("1", "0") and source(20) == ("2", "batch")
    assert seen == [["scontrol", "listpids", "*", "n1"], ["scontrol", "listpids", "*", "n2"]]


def test_scontrol_source_runs_the_real_command(tmp_path):
    script = tmp_path / "scontrol"
    script.write_text("#!/bin/sh\n[ \"$1\" = listpids ] || exit 2\ncat <<'EOF'\n" + LISTPIDS + "EOF\n")
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    source = ScontrolListPids(str(script))
    assert source(1079629) == ("13074", "0+1")
    missing = ScontrolListPids(str(tmp_path / "not-installed"))
    assert missing(1079629) is None


def _stepd(proc, pid, title, uid=0, exe="/usr/sbin/slurmstepd"):
    return add_process(proc, pid, uid=uid, exe=exe, cmdline=[title], comm="slurmstepd")


@pytest.mark.parametrize(("title", "expected"), [
    ("slurmstepd: [42.batch]", ("42", "batch")),
    ("slurmstepd: [42.extern]", ("42", "extern")),
    ("slurmstepd: [42.0]", ("42", "0")),
    ("slurmstepd: [42.17]", ("42", "17")),
    ("slurmstepd: [42.interactive]", ("42", "interactive")),
    ("slurmstepd: [42.0+1]", ("42", "0+1")),
    ("slurmstepd infinity", None),       # the process that keeps the scope alive
    ("slurmstepd: [abc.0]", None),
])
def test_stepd_title(tmp_path, title, expected):
    _stepd(tmp_path, 300, title)
    assert StepdProcessTitle(str(tmp_path))(300) == expected


def test_stepd_title_believes_only_root_slurmstepd(tmp_path):
    _stepd(tmp_path, 301, "slurmstepd: [42.0]", uid=1000)             # a user's renamed process
    _stepd(tmp_path, 302, "slurmstepd: [42.0]", exe="/home/u/bin/python3")
    _stepd(tmp_path, 303, "slurmstepd: [42.0]", exe="/usr/sbin/slurmstepd (deleted)")  # upgraded
    add_process(tmp_path, 304, uid=0, cmdline=["slurmstepd: [42.0]"])  # no exe link readable
    source = StepdProcessTitle(str(tmp_path))
    assert [source(pid) for pid in (301, 302, 303, 304, 999)] == [None, None, ("42", "0"), None, None]


def test_step_environment(tmp_path):
    add_process(tmp_path, 400, environ={"SLURM_JOB_ID": "77", "SLURM_STEP_ID": "4294967291", "HOME": "/h"})
    add_process(tmp_path, 401, environ={"SLURM_JOB_ID": "77", "SLURM_STEP_ID": "3"})
    add_process(tmp_path, 402, environ={"PATH": "/bin"})
    source = StepEnvironment(str(tmp_path))
    assert [source(pid) for pid in (400, 401, 402, 403)] == [("77", "batch"), ("77", "3"), None, None]


def test_first_of_and_default_source(tmp_path):
    first = first_of(lambda pid: None, lambda pid: ("1", "0") if pid == 5 else None, lambda pid: ("2", "0"))
    assert first(5) == ("1", "0") and first(6) == ("2", "0")
    _stepd(tmp_path, 500, "slurmstepd: [9.batch]")
    source = default_job_id_source(str(tmp_path), scontrol=str(tmp_path / "no-scontrol"))
    assert source(500) == ("9", "batch") and source(501) is None


@pytest.fixture
def opaque_job(tmp_path):
    """A v2 job tree whose job directory is named by an opaque id."""
    cg, proc = tmp_path / "cgroup", tmp_path / "proc"
    job = f"{SCOPE}/5c1e0a7f"
    add_cgroup(cg, job)
    add_cgroup(cg, f"{job}/step_0")
    add_cgroup(cg, f"{job}/step_0/slurm", [200])
    add_cgroup(cg, f"{job}/step_0/user")
    add_cgroup(cg, f"{job}/step_0/user/task_0", [210, 211])
    add_cgroup(cg, f"{job}/step_batch/slurm", [100])
    add_cgroup(cg, f"{job}/step_batch/user/task_0", [110])
    add_cgroup(cg, f"{job}/a9/b7", [120])                   # opaque step directory too
    return cg, proc, job


def _resolver(cg, proc, source, clock=None):
    return WorkloadResolver(str(cg), proc_root=str(proc), job_id_source=source, pod_source=None,
                            clock=clock or FakeClock())


def test_opaque_job_resolved_by_the_source(opaque_job):
    cg, proc, job = opaque_job
    table = {200: ("4242", "0"), 210: ("4242", "0"), 100: ("4242", "batch"), 120: ("4242", "7")}
    asked = []
    r = _resolver(cg, proc, lambda pid: asked.append(pid) or table.get(pid))
    assert r.resolve(f"{job}/step_0/user/task_0") == Workload(kind="slurm", job_id="4242", step="0", task="0")
    assert r.resolve(job) == Workload(kind="slurm", job_id="4242")
    assert r.resolve(f"{job}/step_batch/user/task_0") == Workload(
        kind="slurm", job_id="4242", step="batch", task="0")
    # an opaque step directory gets the step its own processes report
    assert r.resolve(f"{job}/a9/b7") == Workload(kind="slurm", job_id="4242", step="7")
    # resolved answers are cached: no more questions
    asked.clear()
    r.resolve(f"{job}/step_0/user/task_0")
    r.resolve(job)
    assert asked == []


def test_opaque_job_stays_empty_when_nothing_resolves(opaque_job):
    cg, proc, job = opaque_job
    clock = FakeClock()
    asked = []
    r = _resolver(cg, proc, lambda pid: asked.append(pid), clock)
    w = r.resolve(f"{job}/step_0/user/task_0")
    assert w == Workload(kind="slurm", job_id="", step="0", task="0")
    assert asked, "the source was asked"
    asked.clear()
    r.resolve(f"{job}/step_0/user/task_0")
    assert asked == []                      # not asked again before the recheck time
    clock.advance(r.recheck_seconds)
    r.resolve(f"{job}/step_0/user/task_0")
    assert asked                            # asked again later: processes may have appeared


def test_opaque_job_with_disagreeing_answers_is_not_guessed(opaque_job):
    cg, proc, job = opaque_job
    table = {210: ("1", "0"), 211: ("2", "0")}
    r = _resolver(cg, proc, table.get)
    assert r.resolve(f"{job}/step_0/user/task_0").job_id == ""


def test_opaque_job_resolved_through_slurmstepd_titles(opaque_job):
    cg, proc, job = opaque_job
    _stepd(proc, 200, "slurmstepd: [4242.0]")
    _stepd(proc, 100, "slurmstepd: [4242.batch]")
    add_process(proc, 210, uid=1000, exe="/usr/bin/python3", cmdline=["python3", "train.py"])
    r = _resolver(cg, proc, StepdProcessTitle(str(proc)))
    # the user leaf holds no stepd: the job directory's stepds answer for the job
    assert r.resolve(f"{job}/step_0/user/task_0") == Workload(kind="slurm", job_id="4242", step="0", task="0")
    assert r.resolve(f"{job}/step_batch/slurm") == Workload(kind="slurm", job_id="4242", step="batch")


def test_broken_source_does_not_break_resolution(opaque_job):
    cg, proc, job = opaque_job

    def broken(pid):
        raise RuntimeError("slurmd is gone")

    assert _resolver(cg, proc, broken).resolve(job) == Workload(kind="slurm")


def test_numbered_job_directories_never_ask_the_source(tmp_path):
    def must_not_be_asked(pid):
        raise AssertionError("asked")

    r = _resolver(tmp_path, tmp_path, must_not_be_asked)
    assert r.resolve(f"{SCOPE}/job_5/step_0").job_id == "5"
    assert os.listdir(tmp_path) == []


def test_stepd_waiting_area_is_no_job(tmp_path):
    # New slurmstepds wait in ".../system" before their job directory exists;
    # their titles already name a job, which must not label the waiting area.
    add_cgroup(tmp_path / "cgroup", f"{SCOPE}/system", [900])
    r = _resolver(tmp_path / "cgroup", tmp_path / "proc", lambda pid: ("42", "0"))
    assert r.resolve(f"{SCOPE}/system") == Workload(kind="slurm")
