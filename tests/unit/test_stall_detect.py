"""The stall rule over a cgroup tree on disk, progress sources and process
states the test controls: which workloads are watched, the first look as a
baseline, one event per episode, blind cgroups, stopped and frozen jobs,
and the walk's order and bound."""
import os

import pytest

from tracehound.attribution.workload import WORKLOAD_LABELS
from tracehound.detect.progress_board import ProgressBoard
from tracehound.detect import stall
from tracehound.detect.stall import StallConfig, StallDetector


def _labels(**kw):
    return tuple(kw.get(k, "") for k in WORKLOAD_LABELS)


class Tree:
    """A cgroup v2 tree under tmp_path: directories, cgroup.events, cpu.stat."""

    def __init__(self, root):
        self.root = str(root)
        self.states: dict[str, dict[str, int]] = {}

    def add(self, path: str, states=None, cpu_usec: int = 0, frozen: bool = False) -> int:
        d = os.path.join(self.root, path.strip("/"))
        os.makedirs(d, exist_ok=True)
        self.set(path, states or {}, cpu_usec, frozen)
        return os.stat(d).st_ino

    def set(self, path, states=None, cpu_usec=None, frozen=None):
        d = os.path.join(self.root, path.strip("/"))
        if states is not None:
            self.states[d] = states
        if cpu_usec is not None:
            with open(os.path.join(d, "cpu.stat"), "w") as f:
                f.write(f"usage_usec {cpu_usec}\nuser_usec 0\n")
        if frozen is not None:
            with open(os.path.join(d, "cgroup.events"), "w") as f:
                f.write(f"populated 1\nfrozen {int(frozen)}\n")

    def remove(self, path):
        d = os.path.join(self.root, path.strip("/"))
        for name in os.listdir(d):
            os.unlink(os.path.join(d, name))
        os.rmdir(d)
        self.states.pop(d, None)


def workload(path: str):
    if path.startswith("/slurm/job_7"):
        parts = path.split("/")
        step = next((p[5:] for p in parts if p.startswith("step_")), "")
        task = next((p[5:] for p in parts if p.startswith("task_")), "")
        return _labels(workload="slurm", job_id="7", step=step, task=task)
    if path.startswith("/system.slice/cron.service"):
        return _labels(workload="systemd", unit="cron.service")
    return _labels()


@pytest.fixture
def setup(tmp_path):
    tree = Tree(tmp_path)
    board = ProgressBoard()
    values: dict[int, float] = {}
    board.add("io", lambda: values)
    events = []

    def make(stall_after=10.0, cgroups=None, in_scope=lambda path: True):
        return StallDetector(StallConfig(stall_after, cgroups), tree.root, board, workload,
                             emit=events.append,
                             states=lambda d: tree.states.get(d, {}), in_scope=in_scope)
    return tree, board, values, events, make


def kinds(events):
    return [(e["kind"], e.get("reason")) for e in events]


def test_a_gpu_job_that_moved_data_and_then_nothing_is_stalled_once_and_then_resumes(setup):
    """Its CPUs spin meanwhile (a hung collective): for a job holding a GPU
    only the GPU counts, and the event says how much CPU it burnt."""
    tree, board, values, events, make = setup
    cg = tree.add("/slurm/job_7", {"sleeping": 2}, cpu_usec=1_000_000)
    board.add("gpu", lambda: {cg: 50.0})          # busy seconds that do not grow
    det = make(stall_after=10)
    values[cg] = 100
    det.run_once(0)                      # baseline
    values[cg] = 200
    det.run_once(1)                      # progress at t=1
    tree.set("/slurm/job_7", cpu_usec=4_000_000)
    det.run_once(10.5)
    assert events == []
    det.run_once(11)
    det.run_once(20)
    assert kinds(events) == [("job_stalled", "no_progress")]
    e = events[0]
    assert e["event"] == "job_anomaly" and e["cgroup"] == "/slurm/job_7"
    assert e["job_id"] == "7" and e["workload"] == "slurm"
    assert e["stalled_for_s"] == 10 and e["processes"] == 2
    assert e["cpu_seconds"] == 3.0 and e["signals"] == ["gpu", "io"]
    assert [g.samples for g in det.collect()][0][0].labels["reason"] == "no_progress"
    values[cg] = 300
    det.run_once(25)
    assert kinds(events)[-1] == ("job_resumed", "no_progress")
    assert events[-1]["stalled_for_s"] == 24     # from its last progress, at t=1
    assert list(det.collect())[0].samples == []


def test_the_first_look_is_a_baseline_so_an_idle_job_is_never_no_progress(setup):
    tree, _board, values, events, make = setup
    cg = tree.add("/slurm/job_7", {"sleeping": 1})
    values[cg] = 12345                   # an idle control socket's old bytes
    det = make(stall_after=5)
    for t in range(0, 100, 5):
        det.run_once(t)
    assert events == []


def test_all_processes_stopped_is_a_stall_after_the_threshold_and_frozen_too(setup):
    tree, _board, _values, events, make = setup
    tree.add("/slurm/job_7", {"stopped": 2})
    det = make(stall_after=5)
    det.run_once(0)
    det.run_once(4)
    assert events == []
    det.run_once(5)
    assert kinds(events) == [("job_stalled", "stopped")]
    assert events[0]["frozen"] is False and events[0]["stalled_for_s"] == 5
    tree.set("/slurm/job_7", {"stopped": 1, "running": 1})
    det.run_once(6)
    assert kinds(events)[-1] == ("job_resumed", "stopped")
    assert events[-1]["stalled_for_s"] == 6      # stopped since t=0
    tree.set("/slurm/job_7", {"sleeping": 2}, frozen=True)
    det.run_once(7)
    det.run_once(12)
    assert kinds(events)[-1] == ("job_stalled", "stopped") and events[-1]["frozen"] is True


def test_a_workload_outside_the_agents_cgroup_scope_is_not_its_to_judge(setup):
    # two agents on one host, one per node (--cgroup-scope): each judges its own
    tree, _board, _values, events, make = setup
    tree.add("/n1/batch", {"stopped": 1})
    tree.add("/n2/batch", {"stopped": 1})
    det = make(stall_after=5, cgroups=r"/n[12]/batch",
               in_scope=lambda path: path == "/n1" or path.startswith("/n1/"))
    det.run_once(0)
    det.run_once(5)
    assert [(e["kind"], e["cgroup"]) for e in events] == [("job_stalled", "/n1/batch")]


def test_some_processes_stopped_is_not_a_stall(setup):
    tree, _board, _values, events, make = setup
    tree.add("/slurm/job_7", {"stopped": 1, "sleeping": 1, "zombie": 3})
    det = make(stall_after=1)
    for t in range(10):
        det.run_once(t)
    assert events == []


def test_a_blind_cgroup_is_judged_only_on_stopped(setup):
    tree, board, values, events, make = setup
    cg = tree.add("/slurm/job_7", {"running": 1})
    board.add_blind("rdma", lambda: {cg})
    det = make(stall_after=5)
    values[cg] = 1
    det.run_once(0)
    values[cg] = 2
    det.run_once(1)
    det.run_once(50)
    assert events == []
    tree.set("/slurm/job_7", {"stopped": 1})
    det.run_once(51)
    det.run_once(57)
    assert kinds(events) == [("job_stalled", "stopped")]


def test_which_cgroups_are_watched(setup):
    tree, _board, values, events, make = setup
    unit = tree.add("/system.slice/cron.service", {"sleeping": 1})
    plain = tree.add("/batch/a", {"sleeping": 1})
    other = tree.add("/other/b", {"sleeping": 1})
    det = make(stall_after=5, cgroups=r"/batch/.*")
    for cg in (unit, plain, other):
        values[cg] = 1
    det.run_once(0)
    for cg in (unit, plain, other):
        values[cg] = 2
    det.run_once(1)
    det.run_once(10)
    assert [e["cgroup"] for e in events] == ["/batch/a"]
    assert [s.value for s in list(det.collect())[1].samples] == [1]


def test_a_stopped_job_of_three_tasks_is_one_stall_named_by_the_job(setup):
    tree, _board, _values, events, make = setup
    tree.add("/slurm/job_7", {})
    tree.add("/slurm/job_7/step_0", {})
    for t in range(3):
        tree.add(f"/slurm/job_7/step_0/task_{t}", {"stopped": 1})
    det = make(stall_after=5)
    for t in (0, 5, 310):
        det.run_once(t)
    assert kinds(events) == [("job_stalled", "stopped")]
    assert events[0]["job_id"] == "7" and "step" not in events[0] and "task" not in events[0]
    assert events[0]["processes"] == 3 and len(events[0]["cgroups"]) == 5
    for t in range(3):
        tree.set(f"/slurm/job_7/step_0/task_{t}", {"running": 1})
    det.run_once(311)
    assert kinds(events)[-1] == ("job_resumed", "stopped")
    assert events[-1]["stalled_for_s"] == 311


def test_a_job_spans_its_cgroups_and_progress_in_any_of_them_counts(setup):
    tree, _board, values, events, make = setup
    tree.add("/slurm/job_7", {})
    step = tree.add("/slurm/job_7/step_0", {"sleeping": 1})
    task = tree.add("/slurm/job_7/step_0/task_0", {"running": 1})
    det = make(stall_after=5)
    values[step] = values[task] = 1
    det.run_once(0)
    values[task] = 2
    det.run_once(1)
    values[step] = 2
    det.run_once(5)
    det.run_once(9)
    assert events == []
    det.run_once(10)
    assert kinds(events) == [("job_stalled", "no_progress")]
    assert events[0]["cgroup"] == "/slurm/job_7"
    assert events[0]["cgroups"] == ["/slurm/job_7", "/slurm/job_7/step_0",
                                    "/slurm/job_7/step_0/task_0"]
    assert events[0]["processes"] == 2


def test_an_ended_job_is_forgotten_and_a_new_one_starts_from_a_baseline(setup):
    tree, _board, values, events, make = setup
    cg = tree.add("/slurm/job_7", {"running": 1})
    det = make(stall_after=5)
    values[cg] = 1
    det.run_once(0)
    values[cg] = 2
    det.run_once(1)
    tree.remove("/slurm/job_7")
    det.run_once(2)
    assert list(det.collect())[1].samples[0].value == 0
    cg = tree.add("/slurm/job_7", {"running": 1})
    values[cg] = 2
    det.run_once(3)
    det.run_once(20)
    assert events == []


def test_a_failing_progress_source_is_left_out_not_fatal(setup, caplog):
    tree, board, values, events, make = setup
    cg = tree.add("/slurm/job_7", {"running": 1})

    def broken():
        raise OSError("map gone")
    board.add("net", broken)
    det = make(stall_after=5)
    values[cg] = 1
    det.run_once(0)
    values[cg] = 2
    det.run_once(1)
    det.run_once(6)
    assert kinds(events) == [("job_stalled", "no_progress")]
    assert events[0]["signals"] == ["io"]
    assert "progress source net: map gone" in caplog.text


def test_gpu_busy_seconds_grow_with_utilization_and_unmeasured_gpus_are_blind():
    from tracehound.subsystems.gpu import GpuBusy
    now = [100.0]
    busy = GpuBusy(clock=lambda: now[0])

    def look(*gpus):
        return busy.observe([{"utilization": u, "processes": [{"pid": p} for p in pids]}
                             for u, pids in gpus])
    look((0.5, [1, 2]), (None, [3]))
    assert busy.seconds == {1: 0.0, 2: 0.0} and busy.unmeasured == {3}
    now[0] = 110.0
    look((0.5, [1, 2]), (0.0, [3]), (1.0, [1]))     # pid 1 also on a second GPU
    assert busy.seconds == {1: 15.0, 2: 5.0, 3: 0.0} and busy.unmeasured == frozenset()
    now[0] = 120.0
    look((0.0, [1]))                                 # idle: no progress; 2 and 3 left
    assert busy.seconds == {1: 15.0}


def test_a_job_without_a_gpu_that_computes_is_working_and_one_that_sleeps_is_not(setup):
    tree, _board, values, events, make = setup
    cg = tree.add("/slurm/job_7", {"running": 1}, cpu_usec=0)
    det = make(stall_after=5)
    values[cg] = 1
    det.run_once(0)
    values[cg] = 2
    det.run_once(1)                                  # the last data it moves
    for t in range(2, 30):                           # then a CPU-bound phase: a full CPU
        tree.set("/slurm/job_7", cpu_usec=(t - 1) * 1_000_000)
        det.run_once(t)
    assert events == []
    for t in range(30, 36):                          # then 1 % of a CPU: waiting
        tree.set("/slurm/job_7", {"sleeping": 1}, cpu_usec=29_000_000 + (t - 29) * 10_000)
        det.run_once(t)
    assert kinds(events) == [("job_stalled", "no_progress")]
    assert events[0]["stalled_for_s"] == 5 and events[0]["cpu_seconds"] == 0.05


def gauge(det, name: str) -> float:
    return next(fam.samples[0].value for fam in det.collect() if fam.name == name)


def test_empty_subtrees_are_passed_over_and_a_users_directories_walked_last(setup, monkeypatch):
    """More directories than the walk's bound, made by a user below their own
    (one empty subtree, then populated ones): the job root made is watched,
    and the walk says it stopped short."""
    if os.geteuid() != 0:
        pytest.skip("chown needs root")
    tree, _board, _values, events, make = setup
    monkeypatch.setattr(stall, "MAX_CGROUPS", 8)
    tree.add("/a-user", {})
    os.chown(os.path.join(tree.root, "a-user"), 65534, 65534)
    for i in range(20):
        tree.add(f"/a-user/d{i:02d}", {"sleeping": 1})
    tree.add("/a-user/empty")
    with open(os.path.join(tree.root, "a-user", "empty", "cgroup.events"), "w") as f:
        f.write("populated 0\nfrozen 0\n")
    for i in range(50):
        os.makedirs(os.path.join(tree.root, "a-user", "empty", f"e{i}"))
    tree.add("/slurm/job_7/step_0/task_0", {"stopped": 1})
    det = make(stall_after=5)
    for t in (0, 5, 10):
        det.run_once(t)
    assert kinds(events) == [("job_stalled", "stopped")]
    assert gauge(det, "tracehound_stall_watched_workloads") == 1
    assert gauge(det, "tracehound_stall_walk_truncated") == 1
    monkeypatch.setattr(stall, "MAX_CGROUPS", 4096)
    det.run_once(12)
    assert gauge(det, "tracehound_stall_walk_truncated") == 0
