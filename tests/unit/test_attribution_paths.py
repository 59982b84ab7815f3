"""cgroup path -> workload labels, from the path alone (no sources, no I/O)."""
import pytest

from tracehound.attribution import kubernetes, slurm, systemd
from tracehound.attribution.resolver import WorkloadResolver
from tracehound.attribution.workload import WORKLOAD_LABELS, Workload

CID = "9f8e7d6c5b4a39281706f5e4d3c2b1a09f8e7d6c5b4a39281706f5e4d3c2b1a0"
UID = "6f1c9a52-2d8e-4b7a-9c3e-0a1b2c3d4e5f"
UID_ = UID.replace("-", "_")
STATIC_UID = "8b1a9953c4611296a827abf8c47804d7"     # static pods: a config hash


def path_only():
    return WorkloadResolver(job_id_source=None, pod_source=None)


SLURM_CASES = [
    # cgroup/v2
    ("/system.slice/slurmstepd.scope/job_42", "42", "", ""),
    ("/system.slice/slurmstepd.scope/job_42/step_0", "42", "0", ""),
    ("/system.slice/slurmstepd.scope/job_42/step_0/user", "42", "0", ""),
    ("/system.slice/slurmstepd.scope/job_42/step_0/user/task_3", "42", "0", "3"),
    ("/system.slice/slurmstepd.scope/job_42/step_0/user/task_special", "42", "0", "special"),
    ("/system.slice/slurmstepd.scope/job_42/step_0/slurm", "42", "0", ""),
    ("/system.slice/slurmstepd.scope/job_42/step_batch/user/task_0", "42", "batch", "0"),
    ("/system.slice/slurmstepd.scope/job_42/step_extern/user/task_special", "42", "extern", "special"),
    ("/system.slice/slurmstepd.scope/job_42/step_interactive/user/task_0", "42", "interactive", "0"),
    ("/system.slice/slurmstepd.scope/job_1234567/step_17/user/task_127", "1234567", "17", "127"),
    ("/system.slice/slurmstepd.scope/job_99/step_0+1/user/task_0", "99", "0+1", "0"),
    # multiple slurmd per host: "<nodename>_slurmstepd.scope"
    ("/system.slice/node-07_slurmstepd.scope/job_5/step_batch/user/task_0", "5", "batch", "0"),
    ("/system.slice/slurmstepd_node-07.scope/job_5/step_1", "5", "1", ""),
    # slurmd inside a container: the scope below the container's cgroup
    ("/docker.slice/docker-abc.scope/system.slice/slurmstepd.scope/job_8/step_0/user/task_1", "8", "0", "1"),
    # Slurm's own cgroups: no job
    ("/system.slice/slurmstepd.scope", "", "", ""),
    ("/system.slice/slurmstepd.scope/system", "", "", ""),
    # cgroup/v1 (as seen in a v1 controller)
    ("/slurm/uid_1000/job_7/step_batch/task_0", "7", "batch", "0"),
    ("/slurm/uid_1000/job_7/step_extern/task_0", "7", "extern", "0"),
    ("/slurm/uid_1000/job_7/step_2/task_15", "7", "2", "15"),
    ("/slurm/uid_1000/job_7/step_2", "7", "2", ""),
    ("/slurm/uid_1000/job_7", "7", "", ""),
    ("/slurm/uid_1000", "", "", ""),
    ("/slurm", "", "", ""),
    ("/slurm/system", "", "", ""),
    ("/slurm_node-07/uid_0/job_31/step_batch/task_0", "31", "batch", "0"),
    ("/slurm_n1/uid_54321/job_31/step_3", "31", "3", ""),
]


@pytest.mark.parametrize(("path", "job", "step", "task"), SLURM_CASES)
def test_slurm_layouts(path, job, step, task):
    w = path_only().resolve(path)
    assert w == Workload(kind="slurm", job_id=job, step=step, task=task), path


def test_opaque_job_directory_is_never_decoded_from_its_name():
    # Without a source the job id stays empty even when the name contains digits.
    for path in ("/system.slice/slurmstepd.scope/3f2a9c0e-1d4b/step_0/user/task_1",
                 "/system.slice/slurmstepd.scope/job42/step_0",
                 "/system.slice/slurmstepd.scope/job_42a/step_0",
                 "/slurm/uid_1000/a1b2c3/step_batch/task_0"):
        w = path_only().resolve(path)
        assert w.kind == "slurm" and w.job_id == "", path
    assert path_only().resolve("/system.slice/slurmstepd.scope/job42/step_0").step == "0"
    parsed = slurm.parse(systemd.split_path("/system.slice/slurmstepd.scope/opaque-7/step_1"))
    assert parsed.opaque and parsed.job_dir == "/system.slice/slurmstepd.scope/opaque-7"


@pytest.mark.parametrize("path", [
    "/system.slice/slurmd.service",                 # the daemon, not a job
    "/slurm_backup",                                # not Slurm's layout
    "/system.slice/slurmctld.service",
    "/user.slice/user-1000.slice/session-3.scope/job_42",
])
def test_not_slurm(path):
    assert path_only().resolve(path).kind != "slurm"


K8S_CASES = [
    # systemd driver, containerd
    (f"/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UID_}.slice/cri-containerd-{CID}.scope",
     "burstable", UID, CID, False),
    (f"/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{UID_}.slice/cri-containerd-{CID}.scope",
     "besteffort", UID, CID, False),
    (f"/kubepods.slice/kubepods-pod{UID_}.slice/cri-containerd-{CID}.scope", "guaranteed", UID, CID, False),
    # systemd driver, CRI-O and its monitor, cri-dockerd
    (f"/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UID_}.slice/crio-{CID}.scope",
     "burstable", UID, CID, False),
    (f"/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UID_}.slice/crio-conmon-{CID}.scope",
     "burstable", UID, CID, True),
    (f"/kubepods.slice/kubepods-pod{UID_}.slice/docker-{CID}.scope", "guaranteed", UID, CID, False),
    # processes nested inside the container's cgroup
    (f"/kubepods.slice/kubepods-pod{UID_}.slice/crio-{CID}.scope/container", "guaranteed", UID, CID, False),
    # pod level, static pod uid
    (f"/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{STATIC_UID}.slice",
     "burstable", STATIC_UID, "", False),
    # prefixed slices (kubelet in a kind node)
    ("/kubelet.slice/kubelet-kubepods.slice/kubelet-kubepods-besteffort.slice/"
     + f"kubelet-kubepods-besteffort-pod{UID_}.slice/cri-containerd-{CID}.scope", "besteffort", UID, CID, False),
    # cgroupfs driver
    (f"/kubepods/burstable/pod{UID}/{CID}", "burstable", UID, CID, False),
    (f"/kubepods/besteffort/pod{UID}/{CID}", "besteffort", UID, CID, False),
    (f"/kubepods/pod{UID}/{CID}", "guaranteed", UID, CID, False),
    (f"/kubepods/pod{UID}/crio-{CID}", "guaranteed", UID, CID, False),
    (f"/kubepods/burstable/pod{UID}/crio-conmon-{CID}", "burstable", UID, CID, True),
    (f"/kubepods/burstable/pod{UID}", "burstable", UID, "", False),
    (f"/docker/0123abcd/kubepods/besteffort/pod{UID}/{CID}", "besteffort", UID, CID, False),
]


@pytest.mark.parametrize(("path", "qos", "uid", "cid", "monitor"), K8S_CASES)
def test_kubernetes_layouts(path, qos, uid, cid, monitor):
    parsed = kubernetes.parse(systemd.split_path(path))
    assert parsed == kubernetes.KubePath(qos=qos, pod_uid=uid, container_id=cid, monitor=monitor)
    w = path_only().resolve(path)
    # No pod source: the pod is its uid, the container its short id
    # (conmon and the pod itself have no container).
    expect_container = "" if monitor or not cid else cid[:12]
    assert w == Workload(kind="kubernetes", pod=uid, container=expect_container), path


@pytest.mark.parametrize("path", [
    "/kubepods.slice", "/kubepods.slice/kubepods-burstable.slice",
    "/kubepods.slice/kubepods-besteffort.slice", "/kubepods", "/kubepods/burstable",
])
def test_kubernetes_qos_levels_have_no_pod(path):
    assert path_only().resolve(path) == Workload(kind="kubernetes")


VM_CASES = [
    (r"/machine.slice/machine-qemu\x2d1\x2dvm1.scope", "vm1"),
    (r"/machine.slice/machine-qemu\x2d1\x2dvm1.scope/libvirt", "vm1"),
    (r"/machine.slice/machine-qemu\x2d1\x2dvm1.scope/libvirt/emulator", "vm1"),
    (r"/machine.slice/machine-qemu\x2d1\x2dvm1.scope/libvirt/vcpu0", "vm1"),
    (r"/machine.slice/machine-qemu\x2d12\x2dgpu\x2dworker\x2d3.scope/libvirt/vcpu15", "gpu-worker-3"),
    (r"/machine.slice/machine-qemu\x2d4\x2dtrain\x2esmall.scope/libvirt/iothread1", "train.small"),
    (r"/machine.slice/machine-qemu\x2d2\x2dcaf\xc3\xa9.scope/vcpu1", "café"),
    (r"/machine.slice/machine-qemu\x2dlegacy.scope/emulator", "legacy"),   # libvirt < 1.3: no domain id
    ("/machine/qemu-3-db.libvirt-qemu", "db"),
    ("/machine/qemu-3-db-primary.libvirt-qemu/emulator", "db-primary"),
    ("/machine/qemu-3-db.libvirt-qemu/vcpu2", "db"),
    ("/machine/olddomain.libvirt-qemu/vcpu0", "olddomain"),
    ("/machine/_cpu.special.libvirt-qemu/emulator", "cpu.special"),   # libvirt's "_" escape
]


@pytest.mark.parametrize(("path", "vm"), VM_CASES)
def test_libvirt_layouts(path, vm):
    assert path_only().resolve(path) == Workload(kind="vm", vm=vm)


SYSTEMD_CASES = [
    ("/system.slice/sshd.service", "sshd.service"),
    ("/system.slice/slurmd.service", "slurmd.service"),
    ("/user.slice/user-1000.slice/session-3.scope", "session-3.scope"),
    ("/user.slice/user-1000.slice/user@1000.service/app.slice/app-gnome-term-42.scope", "app-gnome-term-42.scope"),
    ("/user.slice/user-1000.slice/user@1000.service", "user@1000.service"),
    ("/user.slice/user-1000.slice", "user-1000.slice"),         # only slices: the innermost one
    ("/system.slice", "system.slice"),
    ("/init.scope", "init.scope"),
    (r"/system.slice/system-systemd\x2dfsck.slice/systemd-fsck@dev-disk-by\x2duuid-12ab.service",
     "systemd-fsck@dev-disk-by-uuid-12ab.service"),
    ("/system.slice/docker.service/stray", "docker.service"),   # below a unit: that unit
    (r"/machine.slice/machine-nspawn\x2dbox.scope", "machine-nspawn-box.scope"),  # not a libvirt VM
]


@pytest.mark.parametrize(("path", "unit"), SYSTEMD_CASES)
def test_systemd_units(path, unit):
    assert path_only().resolve(path) == Workload(kind="systemd", unit=unit)


@pytest.mark.parametrize("path", ["/", "/thtest/job1", "unknown:4242", ""])
def test_unattributed(path):
    assert path_only().resolve(path).values() == ("",) * len(WORKLOAD_LABELS)


@pytest.mark.parametrize(("escaped", "plain"), [
    (r"qemu\x2d1\x2dvm1", "qemu-1-vm1"),
    (r"a\x2fb", "a/b"),
    (r"caf\xc3\xa9", "café"),
    (r"upper\x2D", "upper-"),
    ("no-escapes.service", "no-escapes.service"),
    (r"bad\xzz", r"bad\xzz"),
])
def test_systemd_unescape(escaped, plain):
    assert systemd.unescape(escaped) == plain


def test_values_follow_the_label_order():
    w = Workload(kind="k", job_id="j", step="s", task="t", namespace="n", pod="p",
                 container="c", vm="v", unit="u")
    assert WORKLOAD_LABELS == ("workload", "job_id", "step", "task", "namespace", "pod",
                               "container", "vm", "unit")
    assert w.values() == ("k", "j", "s", "t", "n", "p", "c", "v", "u")
    assert w.as_dict()["workload"] == "k" and w.as_dict()["unit"] == "u"
