"""A user with a delegated cgroup subtree (what systemd gives every user, as
user@UID.service), as uid 65534, against the real agent: a directory named
like a Slurm job's where the user does I/O labels nothing as that job, while
a tree root made as Slurm does (the step and task directories handed to the
job's user, as slurmd's cgroup/v1 plugin leaves them) keeps its job, step
and task; 4,100 empty directories do not hide a real job's stall."""
import json
import os
import signal
import subprocess
import time
import urllib.request
import uuid

import pytest

from tracehound.chaos.faults import targets

from .conftest import remove_cgroup, require_tools, run_in_cgroup, start_agent, stop_agent

NOBODY = 65534
TAG = int(uuid.uuid4().hex[:4], 16)
FORGED_JOB, REAL_JOB = str(700000 + TAG), str(800000 + TAG)
JOB_PATH = "slurm/uid_0/job_{}/step_0/task_0"
# moves itself into the delegated cgroup as root, then, as the user, makes the
# job-like path below it, moves itself there (allowed: the user owns the
# delegated cgroup's cgroup.procs) and writes 25 blocks of 4 KiB
AS_USER = ('echo $$ > "$1/cgroup.procs" && exec setpriv --reuid={uid} --regid={uid} '
           '--clear-groups sh -c \'mkdir -p "$1" && echo $$ > "$1/cgroup.procs" && '
           'exec dd if=/dev/zero of="$2" bs=4096 count=25 status=none\' sh "$2" "$3"')


def delegate(directory: str, uid: int) -> None:
    """What systemd does for Delegate=yes: the directory and the files that
    let its owner make children and move processes between them."""
    for name in ("", "cgroup.procs", "cgroup.threads", "cgroup.subtree_control"):
        os.chown(os.path.join(directory, name), uid, uid)


@pytest.fixture
def trees(cgroup_root, cgroup):
    base = cgroup_root + cgroup
    made = [base + "/deleg", base + "/root"]
    for d in made:
        os.mkdir(d)
    delegate(base + "/deleg", NOBODY)
    real = base + "/root/" + JOB_PATH.format(REAL_JOB)
    os.makedirs(real)
    for d in (real.rsplit("/", 1)[0], real):            # step_0, task_0: the job's user's
        delegate(d, NOBODY)
    yield cgroup + "/deleg", cgroup + "/root"
    for top in made:
        for dirpath, _dirs, _files in sorted(os.walk(top), key=lambda w: -len(w[0])):
            remove_cgroup(dirpath)


def test_a_job_path_a_user_made_labels_nothing_as_that_job(agent, cgroup_root, trees, tmpfs):
    require_tools("setpriv", "dd")
    deleg, root_made = trees
    forged = f"{deleg}/{JOB_PATH.format(FORGED_JOB)}"
    real = f"{root_made}/{JOB_PATH.format(REAL_JOB)}"
    target = os.path.join(tmpfs, f"deleg-{TAG}")
    open(target, "w").close()
    os.chown(target, NOBODY, NOBODY)
    done = subprocess.run(["sh", "-c", AS_USER.format(uid=NOBODY), "sh", cgroup_root + deleg,
                           cgroup_root + forged, target], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr
    assert os.stat(cgroup_root + forged).st_uid == NOBODY          # the user made it
    assert run_in_cgroup(cgroup_root, real, [["write", target + "-real", 51_200, 4096]]) == [51_200]

    metrics = agent.scrape()
    writes = {frozenset(ls): v for (n, ls), v in metrics.items()
              if n == "tracehound_io_write_bytes_total" and ("mountpoint", tmpfs) in ls}
    of_forged = [dict(ls) for ls in writes if ("cgroup", forged) in ls]
    assert len(of_forged) == 1 and writes[frozenset(of_forged[0].items())] == 102_400
    assert "job_id" not in of_forged[0] and "workload" not in of_forged[0], of_forged
    assert not [ls for (_n, ls) in metrics if ("job_id", FORGED_JOB) in ls]
    of_real = [dict(ls) for ls in writes if ("cgroup", real) in ls]
    assert len(of_real) == 1 and writes[frozenset(of_real[0].items())] == 51_200
    assert {"workload": "slurm", "job_id": REAL_JOB, "step": "0", "task": "0"}.items() \
        <= of_real[0].items()


def stall_events(url: str, job: str, timeout: float) -> list[dict]:
    """The agent's job_stalled events of JOB, once there is one or at the deadline."""
    deadline, since, got = time.monotonic() + timeout, 0, []
    while time.monotonic() < deadline:
        with urllib.request.urlopen(url.removesuffix("/metrics") + f"/events?since={since}",
                                    timeout=10) as r:
            page = json.load(r)
        since = page["next"]
        got += [e for e in page["events"]
                if e.get("kind") == "job_stalled" and e.get("job_id") == job]
        if got:
            break
        time.sleep(0.5)
    return got


def test_thousands_of_a_users_empty_cgroups_do_not_hide_a_jobs_stall(hook_mode, cgroup_root,
                                                                      trees):
    require_tools("setpriv")
    deleg, root_made = trees
    made = subprocess.run(["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups",
                           "/usr/bin/python3", "-c", "import os, sys\nfor i in range(4100): "
                           "os.mkdir(os.path.join(sys.argv[1], f'd{i:04d}'))",
                           cgroup_root + deleg], capture_output=True, text=True, timeout=120)
    assert made.returncode == 0, made.stderr
    task = f"{root_made}/{JOB_PATH.format(REAL_JOB)}"
    rank = subprocess.Popen(["sh", "-c", 'echo $$ > "$0" && exec sleep 600',
                             cgroup_root + task + "/cgroup.procs"])
    agent = start_agent(hook_mode, "--stall-after", "2")
    try:
        rank.send_signal(signal.SIGSTOP)
        stalled = stall_events(agent.url, REAL_JOB, timeout=90)
        assert [e["reason"] for e in stalled] == ["stopped"], stalled
        metrics = agent.scrape()
        assert metrics[("tracehound_stall_walk_truncated", frozenset())] == 0
        assert metrics[("tracehound_pressure_cgroups_truncated", frozenset())] == 0
        states = {dict(ls).get("state"): v for (n, ls), v in metrics.items()
                  if n == "tracehound_cgroup_processes" and ("cgroup", task) in ls}
        assert states.get("stopped") == 1, states
    finally:
        stop_agent(agent)
        rank.kill()
        rank.wait()


def in_cgroup(pid: int, path: str) -> bool:
    with open(f"/proc/{pid}/cgroup") as f:
        return f"0::{path}\n" in f.read()


def test_a_chaos_job_target_takes_no_process_of_a_job_path_a_user_made(cgroup_root, trees):
    require_tools("setpriv")
    deleg, root_made = trees
    forged = f"{deleg}/{JOB_PATH.format(FORGED_JOB)}"
    real = f"{root_made}/{JOB_PATH.format(REAL_JOB)}"
    # the user makes the job-like path in the subtree delegated to them and
    # waits there; a rank of the real job waits in the tree root made
    user = subprocess.Popen(
        ["sh", "-c", 'echo $$ > "$0/cgroup.procs" && exec setpriv --reuid={0} --regid={0} '
         '--clear-groups sh -c \'mkdir -p "$0" && echo $$ > "$0/cgroup.procs" && exec sleep 600\' '
         '"$1"'.format(NOBODY), cgroup_root + deleg, cgroup_root + forged])
    rank = subprocess.Popen(["sh", "-c", 'echo $$ > "$0" && exec sleep 600',
                             cgroup_root + real + "/cgroup.procs"])
    try:
        deadline = time.monotonic() + 60
        while not (in_cgroup(user.pid, forged) and in_cgroup(rank.pid, real)):
            assert user.poll() is None and rank.poll() is None
            assert time.monotonic() < deadline, "the processes never reached their cgroups"
            time.sleep(0.1)
        assert targets.slurm_job_of(user.pid) is None
        assert user.pid not in targets.job_pids(FORGED_JOB)
        assert targets.slurm_job_of(rank.pid) == (REAL_JOB, "0")
        assert rank.pid in targets.job_pids(REAL_JOB)
    finally:
        for proc in (user, rank):
            proc.kill()
            proc.wait()
