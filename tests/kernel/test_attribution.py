"""Workload labels on real cgroup trees: each manager's layout is built under
the cgroup v2 root, real I/O runs inside, and the scraped series carry the
workload's labels with exact byte counts.

No Slurm, kubelet or libvirt runs here: the trees are the ones they create
(paths from their sources), the pod log directory is the one the kubelet
writes, and the opaque-id Slurm job is identified the way the agent does on
a real node, by its root-owned slurmstepd's process title."""
import os
import shutil
import subprocess
import sys
import tempfile
import time
import uuid

import pytest

from .conftest import remove_cgroup, run_in_cgroup, series, start_agent, stop_agent

TAG = uuid.uuid4().hex[:8]
JOB = str(900000 + int(TAG[:4], 16))
OPAQUE_JOB = str(int(JOB) + 1)
POD_UID = str(uuid.uuid4())
CONTAINER_ID = uuid.uuid4().hex + uuid.uuid4().hex
LAYOUTS = {
    "slurm-v2": (f"/system.slice/slurmstepd.scope/job_{JOB}/step_0/user/task_0",
                 dict(workload="slurm", job_id=JOB, step="0", task="0")),
    "slurm-batch": (f"/system.slice/thtest{TAG}_slurmstepd.scope/job_{JOB}/step_batch/user/task_0",
                    dict(workload="slurm", job_id=JOB, step="batch")),
    "slurm-opaque": (f"/system.slice/slurmstepd.scope/th{TAG}x/step_0/user/task_0",
                     dict(workload="slurm", job_id=OPAQUE_JOB, step="0")),
    "kube-systemd": (f"/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod"
                     f"{POD_UID.replace('-', '_')}.slice/cri-containerd-{CONTAINER_ID}.scope",
                     dict(workload="kubernetes", namespace="thtest", pod=f"train-{TAG}",
                          container="trainer")),
    "kube-cgroupfs": (f"/kubepods/besteffort/pod{POD_UID}/{CONTAINER_ID}",
                      dict(workload="kubernetes", namespace="thtest", pod=f"train-{TAG}")),
    "libvirt": (f"/machine.slice/machine-qemu\\x2d7\\x2dth{TAG}.scope/libvirt/emulator",
                dict(workload="vm", vm=f"th{TAG}")),
    "systemd": (f"/system.slice/thtest-{TAG}.service", dict(workload="systemd",
                                                            unit=f"thtest-{TAG}.service")),
}


@pytest.fixture(scope="module")
def pod_logs():
    """The kubelet's log layout: /var/log/pods/<ns>_<pod>_<uid>/<container>/
    and /var/log/containers/<pod>_<ns>_<container>-<id>.log links into it."""
    root = tempfile.mkdtemp(prefix="thtest-kubelet-")
    pods = os.path.join(root, "pods")
    pod_dir = os.path.join(pods, f"thtest_train-{TAG}_{POD_UID}", "trainer")
    os.makedirs(pod_dir)
    open(os.path.join(pod_dir, "0.log"), "w").close()
    os.makedirs(os.path.join(root, "containers"))
    os.symlink(os.path.join(pod_dir, "0.log"), os.path.join(
        root, "containers", f"train-{TAG}_thtest_trainer-{CONTAINER_ID}.log"))
    yield pods
    shutil.rmtree(root)


def make_dirs(root: str, path: str, made: list) -> None:
    """mkdir -p ROOT/PATH, adding each directory it created to `made`
    (removed afterwards in reverse, so nothing that was there goes)."""
    d = root
    for part in path.strip("/").split("/"):
        d = os.path.join(d, part)
        if not os.path.isdir(d):
            os.mkdir(d)
            made.append(d)


@pytest.fixture(scope="module")
def trees(cgroup_root):
    """Creates every layout's directories; removes exactly those it created."""
    made = []
    for path, _ in LAYOUTS.values():
        make_dirs(cgroup_root, path, made)
    yield
    for d in reversed(made):
        remove_cgroup(d)


@pytest.fixture(scope="module")
def stepd(cgroup_root, trees):
    """A root process whose executable is named slurmstepd and whose title
    names the job, in the opaque job's step cgroup, as on a Slurm node."""
    path = LAYOUTS["slurm-opaque"][0].rsplit("/user/", 1)[0] + "/slurm"
    os.makedirs(cgroup_root + path, exist_ok=True)
    bindir = tempfile.mkdtemp(prefix="thtest-stepd-")
    exe = os.path.join(bindir, "slurmstepd")
    shutil.copy(shutil.which("sleep"), exe)
    r, w = os.pipe()
    proc = subprocess.Popen(
        [sys.executable, "-c", "import os,sys; r=int(sys.argv[1]); os.read(r, 1); "
         "os.execv(sys.argv[2], [sys.argv[3], '3600'])", str(r), exe,
         f"slurmstepd: [{OPAQUE_JOB}.0]"], pass_fds=(r,))
    with open(cgroup_root + path + "/cgroup.procs", "w") as f:
        f.write(str(proc.pid))
    os.write(w, b"x")
    os.close(r)
    os.close(w)
    yield
    proc.kill()
    proc.wait()
    remove_cgroup(cgroup_root + path)
    shutil.rmtree(bindir)


@pytest.fixture(scope="module")
def attributed(hook_mode, cgroup_root, tmpfs, pod_logs, trees, stepd):
    agent = start_agent(hook_mode, "--pod-logs-dir", pod_logs)
    try:
        written = {}
        for i, (name, (path, _)) in enumerate(LAYOUTS.items()):
            size = 10_000 + 1_111 * i
            out = run_in_cgroup(cgroup_root, path,
                                [["write", os.path.join(tmpfs, f"attr-{name}"), size, 4096]])
            assert out == [size]
            written[name] = size
        yield agent.scrape(), written
    finally:
        stop_agent(agent)


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_series_carry_the_workload_labels(attributed, tmpfs, layout):
    metrics, written = attributed
    path, expected = LAYOUTS[layout]
    got = series(metrics, "tracehound_io_write_bytes_total", cgroup=path, mountpoint=tmpfs,
                 **expected)
    assert got == written[layout], (
        f"{layout}: no series with {expected}; series for this cgroup: "
        + str([dict(ls) for (n, ls), v in metrics.items()
               if n == "tracehound_io_write_bytes_total" and ("cgroup", path) in ls]))
    info = [dict(ls) for (n, ls), v in metrics.items()
            if n == "tracehound_workload_info" and ("cgroup", path) in ls]
    assert len(info) == 1 and expected.items() <= info[0].items(), info


def test_a_cgroup_gone_before_the_scrape_keeps_its_name(agent, cgroup_root, tmpfs):
    """A cgroup created, used and removed between two scrapes is exported
    once, after the agent's schedule retired it, under its path and
    workload, not under a bare id."""
    parent = f"/thtest/brief-{TAG}"
    rel = f"{parent}/brief-{TAG}.service"
    os.makedirs(cgroup_root + rel)
    try:
        size = 54_321
        assert run_in_cgroup(cgroup_root, rel,
                             [["write", os.path.join(tmpfs, "attr-brief"), size, 4096]]) == [size]
    finally:
        os.rmdir(cgroup_root + rel)
        os.rmdir(cgroup_root + parent)
    deadline = time.monotonic() + 60
    while not series(m := agent.scrape(), "tracehound_io_write_bytes_total", cgroup=rel):
        assert time.monotonic() < deadline, sorted(
            dict(ls)["cgroup"] for (n, ls), v in m.items()
            if n == "tracehound_io_write_bytes_total")
        time.sleep(0.2)
    got = series(m, "tracehound_io_write_bytes_total", cgroup=rel, mountpoint=tmpfs,
                 workload="systemd", unit=f"brief-{TAG}.service")
    assert got == size
    assert not series(agent.scrape(), "tracehound_io_write_bytes_total", cgroup=rel)
