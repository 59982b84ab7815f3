"""A workload is decoded only from directories root made: below the first
directory root does not own (a delegated subtree, Slurm's step directory
handed to the job's user), a job, pod or VM its owner named is not taken.
Trees of plain directories with the owners cgroupfs would show."""
import os

import pytest

from tracehound.attribution.resolver import WorkloadResolver
from tracehound.attribution.workload import UNATTRIBUTED, Workload

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="chown needs root")
USER = 65534
DELEGATED = "/user.slice/user-1000.slice/user@1000.service"
POD = "/kubepods/besteffort/pod0b0e5a3e-1111-4222-8333-944445555666/" + "c" * 64


def tree(root, path: str, user_from: int | None = None) -> None:
    """mkdir -p ROOT/PATH; the directories from component USER_FROM on owned by USER."""
    d = str(root)
    for i, part in enumerate(path.strip("/").split("/")):
        d = os.path.join(d, part)
        os.makedirs(d, exist_ok=True)
        if user_from is not None and i >= user_from:
            os.chown(d, USER, USER)


def resolver(root) -> WorkloadResolver:
    return WorkloadResolver(str(root), job_id_source=None, pod_source=None)


def test_a_job_named_below_a_delegated_subtree_is_no_job(tmp_path):
    forged = DELEGATED + "/app.slice/slurm/uid_0/job_1234/step_0/task_0"
    tree(tmp_path, forged, user_from=2)
    assert resolver(tmp_path).resolve(forged) == Workload(kind="systemd", unit="user@1000.service")


def test_a_pod_or_a_vm_named_below_a_users_directory_is_none(tmp_path):
    for path in ("/thtest/mine" + POD, "/thtest/mine/machine.slice/machine-qemu\\x2d1\\x2dvm1.scope"):
        tree(tmp_path, path, user_from=1)
        assert resolver(tmp_path).resolve(path) == UNATTRIBUTED, path


def test_slurms_own_tree_keeps_its_job_step_and_task_though_the_step_is_the_users(tmp_path):
    # as slurmd's cgroup/v1 plugin leaves it: slurm_n1, uid_N and job_J root's
    path = "/slurm_n1/uid_1000/job_77/step_0/task_3"
    tree(tmp_path, path, user_from=3)
    assert resolver(tmp_path).resolve(path) == Workload(kind="slurm", job_id="77", step="0",
                                                        task="3")
    # what the job's user makes in their own step stays their own job's
    inside = "/slurm_n1/uid_1000/job_77/step_0/slurm/uid_0/job_999"
    tree(tmp_path, inside, user_from=3)
    assert resolver(tmp_path).resolve(inside).job_id == "77"


def test_a_forged_job_removed_before_it_was_looked_at_is_still_no_job(tmp_path):
    forged = DELEGATED + "/slurm/uid_0/job_1234"
    tree(tmp_path, DELEGATED, user_from=2)             # made, used and removed by the user
    assert resolver(tmp_path).resolve(forged) == Workload(kind="systemd", unit="user@1000.service")


def test_a_real_job_removed_before_it_was_looked_at_keeps_its_labels(tmp_path):
    tree(tmp_path, "/slurm_n1/uid_1000")
    assert resolver(tmp_path).resolve("/slurm_n1/uid_1000/job_5/step_0").job_id == "5"


def test_a_users_own_units_keep_their_names(tmp_path):
    path = DELEGATED + "/user.slice/podman-4242.scope"
    tree(tmp_path, path, user_from=2)
    assert resolver(tmp_path).resolve(path) == Workload(kind="systemd", unit="podman-4242.scope")


def test_without_a_cgroup_root_the_path_alone_decides():
    path = DELEGATED + "/slurm/uid_0/job_1234"
    assert WorkloadResolver(None, job_id_source=None, pod_source=None).resolve(path).job_id == "1234"
