"""Fault catalog: argument handling, target selection and blast radius, and
the state changes that need no special kernel feature (real child
processes, real rlimits, real files)."""
import os
import resource
import shutil
import signal
import subprocess
import sys
import time
import types

import pytest

from tracehound.chaos import faults as catalog
from tracehound.chaos.faults import FaultError, cgroupctl, gpu, net, targets
from tracehound.chaos.faults.io import IoThrottle
from tracehound.chaos.faults.io_space import IoFill, mount_of


@pytest.fixture
def child():
    """A real process to aim at, with a command line nothing else has."""
    tag = f"th{time.time_ns() % 10**9}"
    p = spawn(tag)
    p.tag = tag
    yield p
    p.kill()
    p.wait()


# what a test waits for at most: never reached unless something is broken
DEADLINE = 30


def spawn(tag: str) -> subprocess.Popen:
    p = subprocess.Popen([sys.executable, "-c", f"import time; time.sleep(600)  # {tag}"])
    deadline = time.monotonic() + DEADLINE
    while True:                             # until exec has replaced the forked test
        with open(f"/proc/{p.pid}/cmdline", "rb") as f:
            if tag.encode() in f.read():
                return p
        if time.monotonic() > deadline:
            p.kill()
            p.wait()
            pytest.fail(f"{tag}: the child did not exec within {DEADLINE} s")
        time.sleep(0.01)


def wait_state(pid, want, timeout=DEADLINE):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if targets.proc_state(pid) in want:
            return targets.proc_state(pid)
        time.sleep(0.02)
    return targets.proc_state(pid)


def pending_signals(pid) -> int:
    """The signals sent to pid and not yet acted on (its own and its group's)."""
    with open(f"/proc/{pid}/status") as f:
        fields = dict(line.split(":\t", 1) for line in f if ":\t" in line)
    return int(fields["SigPnd"], 16) | int(fields["ShdPnd"], 16)


def stop_reached(pid) -> bool:
    """Whether a SIGSTOP sent before this call reached pid: it is still
    pending, or it was taken, and a stop signal is taken and acted on in one
    step under the lock that /proc reads the pending set with. So pending
    first, the state after: no moment is missed and nothing need be waited for."""
    pending = pending_signals(pid) & (1 << (signal.SIGSTOP - 1))
    return bool(pending) or targets.proc_state(pid) == "T"


def test_catalog_has_every_fault_with_a_summary():
    names = set(catalog.catalog())
    assert {"io.throttle", "io.fill", "io.errors", "net.loss", "net.corrupt", "net.delay",
            "proc.kill", "proc.stop", "proc.stress", "rdma.memlock", "rdma.cgroup",
            "rdma.link_down", "gpu.burn", "gpu.memory", "gpu.dcgm_inject",
            "gpu.nccl"} <= names
    for fault in catalog.catalog().values():
        assert fault.summary and fault.where in ("host", "vm", "gpu")
        assert isinstance(fault.availability().ok, bool)


@pytest.mark.parametrize("name,args,fragment", [
    ("proc.stop", {}, "give exactly one target"),
    ("proc.stop", {"pid": 1.5}, "must be an integer"),
    ("proc.stop", {"pid": True}, "must be an integer, not a boolean"),
    ("proc.kill", {"pid": 5, "signal": "STOP"}, "must be one of"),
    ("proc.stress", {"cgroup": "job"}, "starting with /"),
    ("proc.stress", {"cgroup": "/a/../b"}, "must not contain '..'"),
    ("io.throttle", {"cgroup": "/j", "device": "/dev/vda"}, "at least one limit"),
    ("io.throttle", {"device": "/dev/vda", "wbps": 1}, "exactly one target: cgroup or job_id"),
    ("io.throttle", {"cgroup": "/j", "job_id": "7", "device": "/dev/vda", "wbps": 1},
     "exactly one target"),
    ("io.throttle", {"job_id": "7; rm", "device": "/dev/vda", "wbps": 1}, "not a Slurm job id"),
    ("net.loss", {"interface": "x", "percent": 10, "direction": "sideways"}, "egress"),
    ("gpu.nccl", {"command": [], "mode": "ib_disable"}, "must not be empty"),
    ("gpu.nccl", {"command": ["x"], "mode": "break_everything"}, "must be one of"),
    ("rdma.memlock", {"name": "("}, "not a valid regular expression"),
])
def test_argument_problems(name, args, fragment):
    problems = catalog.check_args(catalog.get(name), args)
    assert any(fragment in msg for _, msg in problems), problems


def test_protected_processes_are_refused():
    for pid in (1, os.getpid(), os.getppid()):
        with pytest.raises(FaultError, match="protected"):
            targets.resolve_processes({"pid": pid})


def test_kernel_threads_never_match():
    with pytest.raises(FaultError, match="no process matches"):
        targets.resolve_processes({"name": "^kthreadd$"})


def test_blast_radius_limit(child):
    other = spawn(child.tag)
    try:
        fault = catalog.get("proc.stop")
        args = fault.with_defaults({"name": child.tag})
        with pytest.raises(FaultError, match="2 processes match, more than the blast-radius "
                                             "limit max_targets=1"):
            fault.prepare(args, "t1")
        prepared = fault.prepare({**args, "max_targets": 2}, "t1")
        assert len(prepared.targets) == 2
    finally:
        other.kill()
        other.wait()


def test_stop_and_continue_a_real_process(child):
    fault = catalog.get("proc.stop")
    prepared = fault.prepare(fault.with_defaults({"pid": child.pid}), "t2")
    fault.apply(prepared.state)
    assert wait_state(child.pid, "T") == "T"
    fault.rollback(prepared.state)
    assert wait_state(child.pid, "SR") in ("S", "R")
    fault.rollback(prepared.state)          # idempotent


def test_a_process_stopped_before_the_fault_stays_stopped(child):
    os.kill(child.pid, signal.SIGSTOP)      # stopped by someone else (a debugger, a job suspend)
    assert wait_state(child.pid, "T") == "T"
    try:
        fault = catalog.get("proc.stop")
        prepared = fault.prepare(fault.with_defaults({"pid": child.pid}), "t5")
        fault.apply(prepared.state)
        assert fault.rollback(prepared.state) == "left 1 process(es) stopped as found"
        # a SIGCONT takes effect while it is sent (the kernel resumes a stopped
        # process at once and tells its parent): neither happened
        assert targets.proc_state(child.pid) == "T"
        assert os.waitid(os.P_PID, child.pid, os.WCONTINUED | os.WNOHANG | os.WNOWAIT) is None
    finally:
        os.kill(child.pid, signal.SIGCONT)


def test_rollback_never_signals_a_reused_pid(child):
    fault = catalog.get("proc.stop")
    prepared = fault.prepare(fault.with_defaults({"pid": child.pid}), "t3")
    prepared.state["procs"][0][1] += 1      # as if the pid now belonged to another process
    fault.apply(prepared.state)
    assert not stop_reached(child.pid)
    # the check itself sees a stop that was sent
    os.kill(child.pid, signal.SIGSTOP)
    try:
        assert stop_reached(child.pid)
    finally:
        os.kill(child.pid, signal.SIGCONT)


def test_memlock_changes_and_restores_the_real_limit(child):
    def limits():
        with open(f"/proc/{child.pid}/limits") as f:
            return next(line for line in f if line.startswith("Max locked memory"))

    before = limits()
    fault = catalog.get("rdma.memlock")
    prepared = fault.prepare(fault.with_defaults({"pid": child.pid, "bytes": 4096}), "t4")
    fault.apply(prepared.state)
    assert resource.prlimit(child.pid, resource.RLIMIT_MEMLOCK)[0] == 4096
    assert limits().split()[3] == "4096"
    fault.rollback(prepared.state)
    assert limits() == before


def test_fill_refuses_the_root_fs_without_permission(tmp_path):
    # a directory of the root file system: the test's own where it is one
    path = next(d for d in (str(tmp_path), "/") if mount_of(d) == "/")
    fault = IoFill()
    with pytest.raises(FaultError, match="allow_root_fs"):
        fault.prepare(fault.with_defaults({"path": path, "free_bytes": 0}), "t5")


def test_fill_allocates_and_rollback_deletes(tmp_path):
    fault = IoFill()
    st = os.statvfs(tmp_path)
    keep = st.f_bavail * st.f_frsize - (2 << 20)
    args = fault.with_defaults({"path": str(tmp_path), "free_bytes": keep,
                                "allow_root_fs": True, "max_bytes": 64 << 20})
    prepared = fault.prepare(args, "t6")
    extra = fault.apply(prepared.state)
    assert os.path.exists(prepared.state["file"]) and extra["allocated"] > 0
    fault.rollback(prepared.state)
    assert os.listdir(tmp_path) == []
    with pytest.raises(FaultError, match="blast-radius limit max_bytes"):
        fault.prepare({**args, "free_bytes": 0, "max_bytes": 1}, "t7")


def test_io_max_line_is_restored_exactly(tmp_path, monkeypatch):
    """cgroup v2 bookkeeping on a stand-in tree (this host binds io to v1)."""
    root = tmp_path / "cg"
    job = root / "a" / "job"
    job.mkdir(parents=True)
    (root / "cgroup.controllers").write_text("cpu io memory\n")
    (root / "cgroup.subtree_control").write_text("io\n")
    (root / "a" / "cgroup.subtree_control").write_text("memory\n")
    old = "254:0 rbps=max wbps=500 riops=max wiops=max"
    (job / "io.max").write_text(old + "\n8:0 rbps=1 wbps=max riops=max wiops=max\n")
    monkeypatch.setattr("tracehound.chaos.faults.io.cgroup2_root", lambda: str(root))
    monkeypatch.setattr("tracehound.chaos.faults.io.block_device", lambda spec: "254:0")
    fault = IoThrottle()
    args = fault.with_defaults({"cgroup": "/a/job", "device": "/x", "wbps": 1024})
    prepared = fault.prepare(args, "t8")
    assert prepared.state["mode"] == "v2"
    assert prepared.state["enable"] == [str(root / "a")]
    assert prepared.state["previous"] == old
    fault.apply(prepared.state)
    assert (job / "io.max").read_text() == "254:0 wbps=1024"
    assert (root / "a" / "cgroup.subtree_control").read_text() == "+io"
    fault.rollback(prepared.state)
    assert (job / "io.max").read_text() == old


def test_enabling_needs_the_controller_at_the_root(tmp_path):
    (tmp_path / "cgroup.controllers").write_text("memory\n")
    (tmp_path / "j").mkdir()
    with pytest.raises(FaultError, match="io controller is not available"):
        cgroupctl.ancestors_to_enable(str(tmp_path), str(tmp_path / "j"), "io")


def test_network_faults_refuse_the_host_namespace():
    for name in ("net.loss", "rdma.link_down"):
        fault = catalog.get(name)
        args = fault.with_defaults({"interface": "eth0", "percent": 5})
        if name == "rdma.link_down":
            args.pop("percent")
        with pytest.raises(FaultError, match="host's own network namespace"):
            fault.prepare(args, "t9")


def test_loss_threshold_mapping():
    from tracehound.chaos.faults.tcbpf import threshold
    assert threshold(0) == 0 and threshold(100) == 0xFFFFFFFF
    assert threshold(50) == pytest.approx(0x7FFFFFFF, abs=1)


def test_delay_availability_is_honest(monkeypatch):
    monkeypatch.setattr(net, "netem_available", lambda: False)
    avail = catalog.get("net.delay").availability()
    assert not avail.ok and "sch_netem" in avail.reason
    assert catalog.get("net.loss").availability().reason.startswith("tc BPF")


def test_device_mapper_availability_is_honest():
    """What this kernel has, asked independently of the fault: the control
    node, then the targets dmsetup (Debian: dmsetup, installed by
    scripts/install --dev) lists."""
    assert shutil.which("dmsetup"), "dmsetup is missing: scripts/install --dev installs it"
    avail = catalog.get("io.errors").availability()
    if not os.path.exists("/dev/mapper/control"):
        assert (avail.ok, avail.reason) == (
            False, "no device-mapper in this kernel (/dev/mapper/control is missing)")
        return
    listed = subprocess.run(["dmsetup", "targets"], capture_output=True, text=True)
    have = {line.split()[0] for line in listed.stdout.splitlines() if line.strip()}
    if listed.returncode != 0:
        assert not avail.ok and avail.reason.startswith("no device-mapper driver in this kernel")
    elif {"error", "flakey"} <= have:
        assert avail.ok, avail
    else:
        assert not avail.ok and "error and flakey targets" in avail.reason


def fake_torch(mismatch_every=0):
    calls = {"matmul": 0}

    class Matrix:
        def __matmul__(self, other):
            calls["matmul"] += 1
            return ("product", calls["matmul"])

    torch = types.ModuleType("torch")
    torch.cuda = types.SimpleNamespace(is_available=lambda: True, device_count=lambda: 1,
                                       synchronize=lambda dev: None,
                                       mem_get_info=lambda dev: (1000, 4000))
    torch.randn = lambda *shape, device: Matrix()
    torch.allclose = lambda a, b, rtol, atol: not (mismatch_every and
                                                   a[1] % mismatch_every == 0)
    torch.uint8 = "uint8"
    held = {}

    def empty(n, dtype, device):
        held["bytes"] = n
        return types.SimpleNamespace(fill_=lambda v: None)
    torch.empty = empty
    return torch, calls, held


def test_gpu_burn_checks_every_result(monkeypatch, tmp_path):
    torch, calls, _ = fake_torch(mismatch_every=3)
    monkeypatch.setitem(sys.modules, "torch", torch)
    result = gpu.burn(0, 0.2, 64, str(tmp_path / "r.json"))
    assert result["backend"] == "torch" and result["iterations"] == calls["matmul"] - 1
    assert 0 < result["mismatches"] < result["iterations"]
    assert (tmp_path / "r.json").exists()
    assert catalog.get("gpu.burn").availability().ok


def test_gpu_memory_holds_a_fraction(monkeypatch, tmp_path):
    torch, _, held = fake_torch()
    monkeypatch.setitem(sys.modules, "torch", torch)
    result = gpu.hold_memory(0, None, 0.5, str(tmp_path / "m.json"), 0)
    assert held["bytes"] == 500 and result["bytes_held"] == 500


def test_gpu_faults_say_not_available_without_a_backend(monkeypatch):
    monkeypatch.setitem(sys.modules, "torch", None)
    monkeypatch.setitem(sys.modules, "cupy", None)
    fault = catalog.get("gpu.burn")
    assert not fault.availability().ok
    with pytest.raises(FaultError, match="not available here"):
        fault.prepare(fault.with_defaults({}), "t10")


def test_nccl_job_gets_the_overrides_and_is_ended(tmp_path):
    out = tmp_path / "env"
    fault = catalog.get("gpu.nccl")
    args = fault.with_defaults({"command": ["sh", "-c", f'echo "$NCCL_SOCKET_IFNAME" > {out}; '
                                                        "exec sleep 600"],
                                "mode": "wrong_ifname", "log": str(tmp_path / "log")})
    prepared = fault.prepare(args, "t11")
    prepared.state.update(fault.apply(prepared.state))
    deadline = time.monotonic() + DEADLINE
    while not (out.exists() and out.read_text().endswith("\n")) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert out.read_text().strip() == "tracehound-no-such-if0"
    fault.rollback(prepared.state)
    from tracehound.chaos.faults.proc import marked_pids
    assert marked_pids("t11") == []


def test_nccl_is_available_only_with_an_nvidia_driver(tmp_path, monkeypatch):
    from tracehound.chaos.faults import gpu
    fault = catalog.get("gpu.nccl")
    monkeypatch.setattr(gpu, "NVIDIA_DRIVER", str(tmp_path / "missing"))
    avail = fault.availability()
    assert not avail.ok and "no NVIDIA driver" in avail.reason
    version = tmp_path / "version"
    version.write_text("NVRM version: NVIDIA UNIX x86_64 Kernel Module  550.54.15\n")
    monkeypatch.setattr(gpu, "NVIDIA_DRIVER", str(version))
    assert fault.availability().ok


def selects(query: str, labels: dict) -> bool:
    from tracehound.chaos.metrics import parse_selector
    return all(m.matches(labels) for m in parse_selector(query).matchers)


def test_rdma_detections_look_at_the_targeted_cgroup_only():
    q = catalog.get("rdma.cgroup").detection({"cgroup": "rdmatest/limited"}).query
    assert selects(q, {"errno": "EAGAIN", "cgroup": "/rdmatest/limited"})
    assert not selects(q, {"errno": "EAGAIN", "cgroup": "/other-job"})
    mem = catalog.get("rdma.memlock")
    state = {"cgroups": ["/slurm/job_4.2-x", "/kubepods/pod+1"]}
    q = mem.detection(mem.with_defaults({"pid": 1}), state).query
    for cgroup in state["cgroups"]:
        assert selects(q, {"op": "reg_mr", "errno": "ENOMEM", "cgroup": cgroup})
    assert not selects(q, {"op": "reg_mr", "errno": "ENOMEM", "cgroup": "/slurm/job_4x2-x"})
    # before prepare (chaos list) it names no cgroup
    assert "cgroup" not in mem.detection(mem.with_defaults({"pid": 1})).query


def test_chaos_list_describes_every_fault(capsys):
    """`chaos list` asks each fault's detection before any argument is known
    ("<delay_ms>" in place of a number): none may fail on the placeholder."""
    from tracehound.chaos.cli import cmd_list
    assert cmd_list(None) == 0
    out = capsys.readouterr().out
    for name in catalog.catalog():
        assert f"\n{name} " in "\n" + out, name
    assert "> <delay_ms>/2000" in out
