"""Each example experiment that can run on this host, end to end against a
real agent: the fault is really applied (checked on the kernel's own state
while the run is in flight), rolled back to exactly the state before, and
the report says whether tracehound saw it, and how fast."""
import glob
import json
import os
import re
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass

import pytest

from tests.conftest import ROOT, tracehound_cmd
from tests.kernel.conftest import USERS_DEFAULTS, start_agent, stop_agent
from tracehound.chaos.faults import workload_cgroup
from tracehound.host.procs import cgroup_v2_path

EXAMPLES = os.path.join(ROOT, "examples")
BLKIO = "/sys/fs/cgroup/blkio"


@dataclass
class Run:
    code: int
    out: str
    err: str
    seen: list
    record: dict

    def detection(self, probe: str) -> dict:
        return next(d for d in self.record["detections"] if d["probe"] == probe)


def run_example(agent, name: str, env: dict, watch=None) -> Run:
    """Run examples/<name> and record every distinct state watch() returns
    while it is in flight."""
    env = {**os.environ, "TRACEHOUND_METRICS_URL": agent.url, "CHAOS_HOLD_SECONDS": "1",
           **env}
    tmp = tempfile.mkdtemp(prefix="thtest-chaos-")
    # the examples start and stop their workloads with python providers: consented
    proc = subprocess.Popen(tracehound_cmd() + ["chaos", "run", os.path.join(EXAMPLES, name),
                                                "--yes", "--allow-code", "--journal",
                                                f"{tmp}/journal",
                                                "--report", f"{tmp}/report"],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    seen: list = []
    deadline = time.monotonic() + 90
    while proc.poll() is None and time.monotonic() < deadline:
        if watch is not None:
            state = watch()
            if not seen or seen[-1] != state:
                seen.append(state)
        time.sleep(0.02)
    if proc.poll() is None:
        proc.kill()
    out, err = proc.communicate()
    reports = glob.glob(f"{tmp}/report/*-journal.json")
    assert reports, f"no report\n{out}\n{err}"
    with open(reports[0]) as f:
        record = json.load(f)
    md = glob.glob(f"{tmp}/report/*.md")[0]
    assert os.path.getsize(md) > 0
    subprocess.run(["rm", "-rf", tmp])
    return Run(proc.returncode, out, err, seen, record)


def read(path: str) -> str | None:
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return None


def procs_of(cgroup_root: str, cgroup: str) -> list[int]:
    text = read(f"{cgroup_root}{cgroup}/cgroup.procs")
    return [int(x) for x in text.split()] if text else []


def state_of(pid: int) -> str | None:
    text = read(f"/proc/{pid}/stat")
    return text.rpartition(")")[2].split()[0] if text else None


def blkio_path(pid: int) -> str | None:
    for line in (read(f"/proc/{pid}/cgroup") or "").splitlines():
        _, ctrls, path = line.split(":", 2)
        if "blkio" in ctrls.split(","):
            return path
    return None


def blkio_tree() -> dict:
    """Every blkio cgroup with its throttle settings (v1 hierarchy)."""
    out = {}
    for d, _, _ in os.walk(BLKIO):
        out[d] = {f: read(os.path.join(d, f)) for f in
                  ("blkio.throttle.write_bps_device", "blkio.throttle.read_bps_device")}
    return out


def unique(prefix: str) -> str:
    return f"{prefix}{uuid.uuid4().hex[:6]}"


@pytest.fixture(scope="module")
def agent(hook_mode):
    """An agent with the defaults a user gets (this module's own: the
    session's agent keys by the v2 tree for the tests that make cgroups there)."""
    a = start_agent(hook_mode, *USERS_DEFAULTS)
    yield a
    stop_agent(a)


@pytest.fixture
def chaos_cgroup(cgroup_root):
    """A cgroup path for the experiment to create; removed even on failure."""
    rel = f"/thtest/{unique('chaos-')}"
    # the tests' parent in the v1 hierarchies too, as a job's would be there:
    # the scaffolding makes its leaf where the parent exists
    made = []
    for root in workload_cgroup.v1_roots():
        if not os.path.isdir(f"{root}/thtest"):
            workload_cgroup.make_v1_dir(f"{root}/thtest")
            made.append(f"{root}/thtest")
    yield rel
    from tracehound.chaos.scaffold import stop_workload
    stop_workload(rel, "/var/tmp")
    for directory in made:
        try:
            os.rmdir(directory)
        except OSError:
            pass        # another test's cgroup still in it: the last one removes it
    subprocess.run(["rm", "-rf", f"{BLKIO}/tracehound-chaos"], capture_output=True)


def assert_detected(run: Run, probe: str, by_tracehound: bool = True) -> float:
    d = run.detection(probe)
    assert d["detected"], d
    assert d["tracehound_signal"] is by_tracehound
    assert d["mttd_seconds"] is not None and d["mttd_seconds"] >= 0, d   # after the fault
    print(f"{probe}: detected, MTTD {d['mttd_seconds']:.2f} s")
    return d["mttd_seconds"]


def test_io_throttle(agent, cgroup_root, chaos_cgroup):
    before = blkio_tree()
    own = blkio_path(os.getpid())
    v2 = os.path.exists(f"{cgroup_root}/thtest/io.max") or "io" in (
        read(f"{cgroup_root}/cgroup.controllers") or "").split()

    def watch():
        pids = procs_of(cgroup_root, chaos_cgroup)
        if not pids:
            return None
        where = blkio_path(pids[0])
        limit = read(f"{BLKIO}{where}/blkio.throttle.write_bps_device") if where != "/" else ""
        return where, limit, read(f"{cgroup_root}{chaos_cgroup}/io.max")

    run = run_example(agent, "io-throttle.yaml", {"CHAOS_CGROUP": chaos_cgroup}, watch)
    assert run.code == 0, run.err
    states = [s for s in run.seen if s is not None]
    if v2:
        assert any("wbps=1048576" in (s[2] or "") for s in states), states
    else:
        throttled = [s for s in states if s[0].startswith("/tracehound-chaos/")]
        assert throttled and throttled[0][1].endswith(" 1048576"), states
        assert states[0][0] == own and states[-1][0] == own, states
    assert blkio_tree() == before
    assert_detected(run, "tracehound-sees-slow-writes")
    assert run.record["faults"][0]["rollback"] == "done"


def test_io_fill(agent, chaos_cgroup):
    scratch = f"/run/thtest-{unique('fill-')}"

    def watch():
        if not os.path.ismount(scratch):
            return None
        fills = glob.glob(f"{scratch}/.tracehound-chaos-fill-*")
        st = os.statvfs(scratch)
        return bool(fills), st.f_bavail * st.f_frsize < (1 << 20)

    try:
        run = run_example(agent, "io-fill.yaml", {"CHAOS_CGROUP": chaos_cgroup,
                                                 "CHAOS_SCRATCH_DIR": scratch}, watch)
    finally:
        subprocess.run(["umount", "-l", scratch], capture_output=True)
        subprocess.run(["rmdir", scratch], capture_output=True)
    assert run.code == 0, run.err
    states = [s for s in run.seen if s is not None]
    # the fill file appears and leaves (almost) nothing free, then goes away
    assert (True, True) in states and states[-1][0] is False, states
    assert not os.path.exists(scratch) and f" {scratch} " not in read("/proc/self/mountinfo")
    assert_detected(run, "tracehound-sees-write-errors")


@pytest.fixture(scope="module")
def stall_agent(hook_mode):
    """An agent whose stall rule watches the tests' cgroups and fires after 3 s."""
    a = start_agent(hook_mode, *USERS_DEFAULTS, "--stall-after", "3",
                    "--stall-cgroups", "/thtest/chaos-.*")
    yield a
    stop_agent(a)


def test_proc_stop(stall_agent, cgroup_root, chaos_cgroup):
    def watch():
        pids = procs_of(cgroup_root, chaos_cgroup)
        return state_of(pids[0]) == "T" if pids else None

    run = run_example(stall_agent, "proc-stop.yaml", {"CHAOS_CGROUP": chaos_cgroup}, watch)
    assert run.code == 0, run.err
    states = [s for s in run.seen if s is not None]
    assert states == [False, True, False], states      # running, stopped, running again
    assert_detected(run, "tracehound-sees-stopped-process")
    mttd = assert_detected(run, "tracehound-reports-stalled-job")
    assert mttd >= 3                                   # not before --stall-after
    event = run.detection("tracehound-reports-stalled-job")["event"]
    assert event["cgroup"] == chaos_cgroup and event["processes"] == 1


def test_proc_kill(agent, cgroup_root, chaos_cgroup):
    pids_seen = set()

    def watch():
        pids = procs_of(cgroup_root, chaos_cgroup)
        pids_seen.update(pids)
        return tuple(pids)

    run = run_example(agent, "proc-kill.yaml", {"CHAOS_CGROUP": chaos_cgroup}, watch)
    assert run.code == 0, run.err
    assert len(pids_seen) == 1 and ((),) != tuple(run.seen[1:2])
    # dead: gone, or a zombie its new parent has not reaped yet
    assert run.seen[-1] == () and all(state_of(p) in (None, "Z") for p in pids_seen)
    assert "irreversible" in run.record["faults"][0]["rollback_note"]
    assert_detected(run, "tracehound-sees-kill")


def stressors(cgroup_root: str, cgroup: str) -> int:
    return sum(1 for p in procs_of(cgroup_root, cgroup)
               if (read(f"/proc/{p}/comm") or "").startswith("stress-ng"))


def test_proc_stress_io(agent, cgroup_root, chaos_cgroup):
    run = run_example(agent, "proc-stress-io.yaml", {"CHAOS_CGROUP": chaos_cgroup},
                      lambda: stressors(cgroup_root, chaos_cgroup) > 0)
    assert run.code == 0, run.err
    # no stressor, then stress-ng running in the cgroup, then none again
    assert run.seen == [False, True, False], run.seen
    assert not glob.glob("/var/tmp/.tracehound-chaos-stress-*")
    # the cgroup the experiment made, in the v2 tree and the v1 key hierarchies, is gone
    assert not any(os.path.exists(d) for d in workload_cgroup.dirs(chaos_cgroup))
    assert_detected(run, "tracehound-sees-write-bandwidth")


def test_proc_stress_cpu(agent, cgroup_root, chaos_cgroup):
    run = run_example(agent, "proc-stress-cpu.yaml", {"CHAOS_CGROUP": chaos_cgroup,
                                                     "CHAOS_CGROUP_FS": cgroup_root},
                      lambda: stressors(cgroup_root, chaos_cgroup) > 0)
    assert run.code == 0, run.err
    assert True in run.seen and run.seen[-1] is False
    assert_detected(run, "tracehound-sees-cpu-load")
    assert_detected(run, "kernel-sees-cpu-time", by_tracehound=False)


def test_proc_stress_memory(agent, cgroup_root, chaos_cgroup):
    run = run_example(agent, "proc-stress-memory.yaml", {"CHAOS_CGROUP": chaos_cgroup},
                      lambda: stressors(cgroup_root, chaos_cgroup) > 0)
    assert run.code == 0, run.err
    assert True in run.seen and run.seen[-1] is False
    assert not os.path.exists(f"{cgroup_root}{chaos_cgroup}")
    assert_detected(run, "tracehound-sees-memory-growth")


def netns_env(prefix: str) -> dict:
    tag = uuid.uuid4().hex[:5]
    return {"CHAOS_NETNS": f"th{prefix}{tag}a", "CHAOS_PEER_NETNS": f"th{prefix}{tag}b",
            "CHAOS_INTERFACE": f"th{tag}0", "CHAOS_PEER_INTERFACE": f"th{tag}1"}


def in_netns(ns: str, *argv: str) -> str | None:
    if not os.path.exists(f"/run/netns/{ns}"):
        return None
    out = subprocess.run(["ip", "netns", "exec", ns, *argv], capture_output=True, text=True)
    return out.stdout.strip() if out.returncode == 0 else "error: " + out.stderr.strip()


def test_net_loss(agent):
    env = netns_env("nl")
    ns, ifname = env["CHAOS_NETNS"], env["CHAOS_INTERFACE"]

    def watch():
        qdiscs = in_netns(ns, "tc", "qdisc", "show", "dev", ifname)
        if qdiscs is None or qdiscs.startswith("error"):
            return None
        filters = in_netns(ns, "tc", "filter", "show", "dev", ifname, "egress") or ""
        return qdiscs, "netfault" in filters or "netem" in qdiscs

    try:
        run = run_example(agent, "net-loss.yaml", env, watch)
    finally:
        for name in (ns, env["CHAOS_PEER_NETNS"]):
            subprocess.run(["ip", "netns", "del", name], capture_output=True)
    assert run.code == 0, run.err
    states = [s for s in run.seen if s is not None]
    flags = [s[1] for s in states]
    flags = [f for i, f in enumerate(flags) if i == 0 or flags[i - 1] != f]
    assert flags[-3:] == [False, True, False], states
    applied = next(i for i, s in enumerate(states) if s[1])
    assert applied > 0, states                          # the link was seen before the fault
    assert states[applied - 1] == states[-1]            # qdiscs exactly as before
    assert not os.path.exists(f"/run/netns/{ns}")
    assert_detected(run, "tracehound-sees-loss")
    # the job's cgroup, named for this run
    assert f'cgroup="/tracehound-chaos-tcp-job-{run.record["run_id"].rsplit("-", 1)[-1][:6]}"' in \
        run.detection("tracehound-sees-loss")["query"]
    assert_detected(run, "ping-sees-loss", by_tracehound=False)
    fault = run.record["faults"][0]
    if fault["state"]["method"] == "netem":
        # the drop is the kernel's netem qdisc, which keeps no count for the report
        assert all("netem" in s[0] and "loss 50%" in s[0] for s in states if s[1]), states
    else:
        # the tc BPF classifier counts what it dropped
        assert fault["observed"]["packets_dropped"] > 0, fault["observed"]
        assert fault["observed"]["packets_seen"] > fault["observed"]["packets_dropped"], fault


def test_rdma_memlock_changes_and_restores_the_limit(agent):
    tag = unique("")
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)",
                                f"thtest-memlock-{tag}"])
    try:
        limit = f"/proc/{sleeper.pid}/limits"

        def watch():
            return next((ln for ln in (read(limit) or "").splitlines()
                         if ln.startswith("Max locked memory")), None)

        before = watch()
        assert before is not None and before.split()[3] != "4096", before
        run = run_example(agent, "rdma-memlock.yaml",
                          {"CHAOS_TARGET": f"thtest-memlock-{tag}$",
                           "CHAOS_DETECT_TIMEOUT": "1"}, watch)
        assert run.code == 0, run.err
        assert run.seen[0] == before and run.seen[-1] == before
        assert any(s.split()[3] == "4096" for s in run.seen), run.seen
        # the fault took exactly the sleeper, and detection asks about its cgroup only
        (target,) = run.record["faults"][0]["state"]["procs"]
        assert target[0] == sleeper.pid, target
        det = run.detection("tracehound-sees-reg-mr-enomem")
        scope = re.search(r'cgroup=~"((?:[^"\\]|\\.)*)"', det["query"] or "")
        assert det["tracehound_signal"] and scope, det
        assert re.fullmatch(scope.group(1).replace("\\\\", "\\"),
                            cgroup_v2_path(sleeper.pid)), det
        # the sleeper registers no memory, so no failed registration is counted
        # for it, and the agent's /events answered (with no event) rather than failing
        event = run.detection("tracehound-raises-error-burst")
        assert det["detected"] is False, det
        assert event["detected"] is False and event["note"] == "", event
    finally:
        sleeper.kill()
        sleeper.wait()


def test_rdma_link_down_on_a_veth(agent):
    env = netns_env("ld")
    ns, ifname = env["CHAOS_NETNS"], env["CHAOS_INTERFACE"]

    def watch():
        out = in_netns(ns, "ip", "-j", "link", "show", "dev", ifname)
        if not out or out.startswith("error"):
            return None
        return "UP" in json.loads(out)[0]["flags"]

    try:
        run = run_example(agent, "rdma-link-down.yaml", {**env, "CHAOS_DETECT_TIMEOUT": "1"},
                          watch)
    finally:
        for name in (ns, env["CHAOS_PEER_NETNS"]):
            subprocess.run(["ip", "netns", "del", name], capture_output=True)
    assert run.code == 0, run.err
    # the kernel saw the link go down while the fault was in (the detection),
    # and the watch saw it down and then up again at the end. The moment it is
    # up before the fault (the example makes it down, then sets it up) can be
    # shorter than the watch's pace on a loaded machine, so it is not required.
    assert_detected(run, "kernel-reports-link-down", by_tracehound=False)
    states = [s for s in run.seen if s is not None]
    assert False in states and states[-1] is True, run.seen


def test_net_corrupt(agent):
    env = netns_env("nc")
    try:
        run = run_example(agent, "net-corrupt.yaml", env)
    finally:
        for name in (env["CHAOS_NETNS"], env["CHAOS_PEER_NETNS"]):
            subprocess.run(["ip", "netns", "del", name], capture_output=True)
    assert run.code == 0, run.err
    assert run.record["faults"][0]["fault"] == "net.corrupt"
    assert run.record["faults"][0]["rollback"] == "done"
    assert_detected(run, "tracehound-sees-corruption")
