"""The exit probe in this kernel: real processes in fresh cgroups end by a
signal, a crash, an error status, cleanly and by the OOM killer, and each is
counted once, for its cgroup, with the right reason; the detector reports
the OOM kill and the crash and nothing else."""
import os
import sys
import time
import uuid

import pytest

from tracehound.detect.exits import ExitsDetector
from tracehound.probes import object_path
from tracehound.probes.exits import ExitKey, ExitsProbe, ExitsProbeConfig

from .conftest import remove_cgroup

KILL, SEGV, ABRT = 9, 11, 6
PY = sys.executable

needs_object = pytest.mark.skipif(
    not os.path.exists(object_path("exits")),
    reason="exits.bpf.o not built: make -C src/tracehound/probes exits.bpf.o")


@pytest.fixture
def cgroups(cgroup_root):
    """cgroups(n) -> n fresh cgroups: [(directory, cgroup id)]."""
    made = []

    def make(n):
        out = []
        for _ in range(n):
            d = f"{cgroup_root}/thtest/{uuid.uuid4().hex[:12]}"
            os.makedirs(d)
            made.append(d)
            out.append((d, os.stat(d).st_ino))
        return out
    yield make
    for d in made:
        remove_cgroup(d)


def run(cgroup_dir: str, script: str, *, v1: str | None = None, cwd: str = "/") -> int:
    """Run a shell script that first joins the cgroup (and a v1 cgroup);
    returns the raw wait status, which says whether the process dumped core."""
    join = f'cd "{cwd}" && echo $$ > "{cgroup_dir}/cgroup.procs" && '
    if v1:
        join += f'echo $$ > "{v1}/cgroup.procs" && '
    pid = os.posix_spawn("/bin/sh", ["sh", "-c", join + script], os.environ, setpgroup=0)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return status
        time.sleep(0.02)
    os.kill(pid, KILL)
    os.waitpid(pid, 0)
    pytest.fail(f"{script!r} did not end in 120 s")


def counts_of(snap, cgid) -> dict:
    return {k: n for k, n in snap.counts.items() if k.cgroup_id == cgid}


@pytest.fixture(params=["tp_btf", "tracepoint"])
def probe(request):
    p = ExitsProbe(ExitsProbeConfig(mode=request.param)).start()
    if not p.available:
        pytest.fail(f"exit probe in {request.param} mode: {p.reason}")
    yield p
    p.close()
    p.close()


def py(code: str) -> str:
    return f"exec {PY} -c '{code}'"


THREADS = ("import os, signal, threading, time\n"
           "for _ in range(4): threading.Thread(target=time.sleep, args=(60,), daemon=True).start()\n"
           "time.sleep(0.2); os.kill(os.getpid(), signal.SIGKILL)")
# the main thread leaves first; the process dies later of its last thread's fault
LEADER_FIRST = ("import ctypes, os, signal, threading, time\n"
                "def work():\n    time.sleep(0.3)\n    os.kill(os.getpid(), signal.SIGSEGV)\n"
                "threading.Thread(target=work).start()\nctypes.CDLL(None).pthread_exit(None)")
THREAD_ENDS = ("import threading, sys\n"
               "t = threading.Thread(target=lambda: None); t.start(); t.join(); sys.exit(5)")


@needs_object
def test_each_process_is_counted_once_with_its_reason(probe, cgroups, tmp_path):
    (killed, k_id), (segv, s_id), (err, e_id), (clean, c_id), (threads, t_id), \
        (ends, n_id), (core, d_id), (leader, l_id) = cgroups(8)
    sent = time.time()
    assert os.WTERMSIG(run(killed, py("import os; os.kill(os.getpid(), 9)"))) == KILL
    reaped = time.time()
    assert os.WTERMSIG(run(segv, "ulimit -c 0; kill -SEGV $$")) == SEGV
    assert os.WEXITSTATUS(run(err, "exit 3")) == 3
    assert os.WEXITSTATUS(run(clean, "exit 0")) == 0
    assert os.WTERMSIG(run(threads, py(THREADS))) == KILL
    assert os.WEXITSTATUS(run(ends, py(THREAD_ENDS))) == 5
    assert os.WTERMSIG(run(leader, "ulimit -c 0; " + py(LEADER_FIRST))) == SEGV
    status = run(core, "ulimit -c unlimited 2>/dev/null; " + py(
        "import os, signal; os.kill(os.getpid(), signal.SIGABRT)"), cwd=str(tmp_path))
    dumped = os.WCOREDUMP(status)
    for name in os.listdir(tmp_path):
        os.remove(tmp_path / name)          # a core file is tens of MB

    snap = probe.snapshot()
    assert counts_of(snap, k_id) == {ExitKey(k_id, "signal", KILL): 1}
    assert counts_of(snap, s_id) == {ExitKey(s_id, "signal", SEGV): 1}
    assert counts_of(snap, e_id) == {ExitKey(e_id, "error", 0): 1}
    assert counts_of(snap, c_id) == {ExitKey(c_id, "clean", 0): 1}
    assert counts_of(snap, t_id) == {ExitKey(t_id, "signal", KILL): 1}      # 5 threads, 1 process
    assert counts_of(snap, n_id) == {ExitKey(n_id, "error", 0): 1}          # the thread that ended
    assert counts_of(snap, d_id) == {ExitKey(d_id, "signal", ABRT, bool(dumped)): 1}
    assert counts_of(snap, l_id) == {ExitKey(l_id, "signal", SEGV): 1}
    assert snap.last[ExitKey(l_id, "signal", SEGV)].comm == os.path.basename(PY)[:15]

    # the kill's time is the kernel's, between the fork and the reaping
    assert sent <= snap.last[ExitKey(k_id, "signal", KILL)].wall_time() <= reaped
    last = snap.last[ExitKey(e_id, "error", 0)]
    assert last.status == 3 and last.comm == "sh" and last.pid > 0
    assert snap.last[ExitKey(s_id, "signal", SEGV)].comm == "sh"
    assert ExitKey(c_id, "clean", 0) not in snap.last            # clean exits are not named
    assert snap.health == {"counters_full": 0, "last_full": 0}

    probe.retire({k_id, e_id})
    after = probe.snapshot()
    assert counts_of(after, k_id) == {} and counts_of(after, e_id) == {}
    assert ExitKey(e_id, "error", 0) not in after.last
    assert counts_of(after, s_id) == {ExitKey(s_id, "signal", SEGV): 1}


def memory_v1_parent() -> str | None:
    """Where this process sits in the v1 memory hierarchy: test cgroups nest
    there, so they stay inside whatever limits it is under."""
    root = "/sys/fs/cgroup/memory"
    if not os.path.exists(os.path.join(root, "memory.limit_in_bytes")):
        return None
    with open("/proc/self/cgroup") as f:
        for line in f:
            _, controllers, path = line.rstrip("\n").split(":", 2)
            if "memory" in controllers.split(","):
                return os.path.join(root, path.lstrip("/"))
    return None


@pytest.fixture
def memory_cgroup():
    parent = memory_v1_parent()
    if parent is None:
        pytest.skip("no cgroup v1 memory controller on this host (the OOM test puts a "
                    "process under a small v1 memory.limit_in_bytes)")
    d = os.path.join(parent, f"thtest-{uuid.uuid4().hex[:12]}")
    os.mkdir(d)
    limit = str(48 << 20)
    with open(os.path.join(d, "memory.limit_in_bytes"), "w") as f:
        f.write(limit)
    if os.path.exists(os.path.join(d, "memory.memsw.limit_in_bytes")):
        with open(os.path.join(d, "memory.memsw.limit_in_bytes"), "w") as f:
            f.write(limit)       # no swap to escape into
    yield d
    remove_cgroup(d)


HOG = "import time\nx = []\nwhile True: x.append(bytearray(1 << 20))"


@needs_object
def test_an_oom_kill_is_counted_as_oom_and_reported_and_the_rest_is_not(
        probe, cgroups, memory_cgroup):
    (oom, o_id), (segv, s_id), (killed, k_id), (err, e_id) = cgroups(4)
    detector_events = []
    det = ExitsDetector(probe, emit=detector_events.append, cgroup_path=str)
    det.run_once(time.monotonic())

    status = run(oom, py(HOG), v1=memory_cgroup)
    assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == KILL, status
    run(segv, "ulimit -c 0; kill -SEGV $$")
    run(killed, "kill -KILL $$")
    run(err, "exit 3")

    snap = probe.snapshot()
    assert counts_of(snap, o_id) == {ExitKey(o_id, "oom", KILL): 1}
    assert snap.last[ExitKey(o_id, "oom", KILL)].comm == os.path.basename(PY)[:15]
    det.run_once(time.monotonic())
    ours = {o_id: "oom", s_id: "segv", k_id: "kill", e_id: "err"}
    fired = sorted((ours[int(e["cgroup"])], e["kind"], e["count"])
                   for e in detector_events if int(e["cgroup"]) in ours)
    assert fired == [("oom", "oom_kill", 1), ("segv", "process_crash", 1)]
    crash = next(e for e in detector_events if e["cgroup"] == str(s_id))
    assert crash["signal"] == "SEGV" and crash["comm"] == "sh" and crash["pid"] > 0
    # the next look finds nothing new
    detector_events.clear()
    det.run_once(time.monotonic())
    assert not [e for e in detector_events if int(e["cgroup"]) in ours]


@needs_object
def test_the_auto_mode_picks_tp_btf_here():
    p = ExitsProbe().start()
    try:
        assert p.available, p.reason
        assert p.modes() == {"exits": "tp_btf"}
    finally:
        p.close()

