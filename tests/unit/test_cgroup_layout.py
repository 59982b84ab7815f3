"""Which hierarchy the probes count by, from the mount table; and the cgroup
scope an agent exports."""
import pytest

from tests.unit.fixtures.fakeproc import add_cgroup, add_process
from tracehound.attribution.cgroup_layout import choose, v1_hierarchies
from tracehound.attribution.cgroups import CgroupResolver
from tracehound.attribution.owners import Owners, normal_scope
from tracehound.host.procs import parse_proc_cgroup
from tracehound.attribution.resolver import WorkloadResolver
from tracehound.errors import SetupError
from tracehound.host.mounts import MountTable

TMPFS = "31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755\n"
ROOTFS = "23 1 8:1 / / rw,relatime - ext4 /dev/sda1 rw\n"


def v1(mnt_id, ctl, root="/"):
    return (f"{mnt_id} 31 0:{mnt_id} {root} /sys/fs/cgroup/{ctl.replace(',', '_')} rw,relatime "
            f"- cgroup cgroup rw,{ctl}\n")


V2_AT_UNIFIED = "41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw\n"
V2_ONLY = "31 23 0:28 / /sys/fs/cgroup rw,relatime - cgroup2 cgroup2 rw,nsdelegate\n"


def table(tmp_path, text):
    p = tmp_path / "mountinfo"
    p.write_text(ROOTFS + text)
    return MountTable(str(p))


def test_a_v2_host_counts_by_v2(tmp_path):
    layout = choose(table(tmp_path, V2_ONLY))
    assert (layout.layout, layout.key, layout.root) == ("v2", "v2", "/sys/fs/cgroup")
    assert layout.describe() == "v2 at /sys/fs/cgroup (v2 host)"


def test_a_hybrid_host_counts_by_freezer_first(tmp_path):
    text = TMPFS + v1(32, "cpu,cpuacct") + v1(34, "cpuset") + v1(35, "memory") \
        + v1(37, "freezer") + V2_AT_UNIFIED
    layout = choose(table(tmp_path, text))
    assert (layout.layout, layout.key, layout.root) == ("hybrid", "freezer", "/sys/fs/cgroup/freezer")
    assert layout.v2_root == "/sys/fs/cgroup/unified"
    assert layout.describe() == ("v1 freezer at /sys/fs/cgroup/freezer "
                                 "(hybrid host: v2 at /sys/fs/cgroup/unified does not separate jobs)")
    # asked for explicitly, each key is what was asked
    assert choose(table(tmp_path, text), "memory").root == "/sys/fs/cgroup/memory"
    assert choose(table(tmp_path, text), "v2").root == "/sys/fs/cgroup/unified"


def test_without_freezer_cpuset_then_memory(tmp_path):
    assert choose(table(tmp_path, TMPFS + v1(35, "memory") + v1(34, "cpuset"))).key == "cpuset"
    assert choose(table(tmp_path, TMPFS + v1(35, "memory") + V2_AT_UNIFIED)).key == "memory"


def test_a_pure_v1_host_counts_by_v1_and_refuses_v2(tmp_path):
    mounts = table(tmp_path, TMPFS + v1(37, "freezer") + v1(35, "memory"))
    layout = choose(mounts)
    assert (layout.layout, layout.key, layout.v2_root) == ("v1", "freezer", None)
    assert "no cgroup2 mounted" in layout.describe()
    with pytest.raises(SetupError, match="no cgroup v2 hierarchy"):
        choose(mounts, "v2")


def test_a_missing_or_unknown_key_is_refused(tmp_path):
    mounts = table(tmp_path, V2_ONLY)
    with pytest.raises(SetupError, match="no v1 freezer"):
        choose(mounts, "freezer")
    with pytest.raises(SetupError, match="one of"):
        choose(mounts, "blkio")
    with pytest.raises(SetupError, match="no cgroup hierarchy"):
        choose(table(tmp_path, TMPFS + v1(38, "blkio")))


def test_a_subtree_bind_or_other_controller_is_no_key(tmp_path):
    # a container's view of a subtree gives paths /proc/PID/cgroup does not use
    text = TMPFS + v1(37, "freezer", root="/slurm/uid_0/job_1") + v1(38, "blkio") + V2_AT_UNIFIED
    assert v1_hierarchies(table(tmp_path, text)) == {}
    assert choose(table(tmp_path, text)).key == "v2"


def test_path_of_pid_reads_the_keys_hierarchy(tmp_path):
    proc = tmp_path / "proc"
    add_process(proc, 42, cgroup="6:freezer:/slurm/uid_0/job_7/step_0/task_0\n0::/\n")
    text = TMPFS + v1(37, "freezer") + V2_AT_UNIFIED
    assert choose(table(tmp_path, text)).path_of_pid(42, str(proc)) == \
        "/slurm/uid_0/job_7/step_0/task_0"
    assert choose(table(tmp_path, text), "v2").path_of_pid(42, str(proc)) == "/"
    assert choose(table(tmp_path, text)).path_of_pid(43, str(proc)) is None


def test_parse_proc_cgroup():
    paths = parse_proc_cgroup("12:freezer:/slurm/uid_5/job_1/step_0/task_0\n9:cpu,cpuacct:/\n"
                              "1:name=systemd:/s\n0::/s\ngarbage\n")
    assert paths["freezer"] == "/slurm/uid_5/job_1/step_0/task_0"
    assert paths["cpu"] == paths["cpuacct"] == "/"
    assert paths["name=systemd"] == paths[""] == "/s"


def test_a_shared_v2_cgroup_is_never_labelled_from_its_processes(tmp_path):
    """The v2 root of a hybrid host holds one process of a Slurm v1 job among
    the node's others: it is the root, not that job."""
    cg, proc = tmp_path / "unified", tmp_path / "proc"
    add_process(proc, "self", cgroup="6:freezer:/\n0::/\n")
    add_process(proc, 10, cgroup="6:freezer:/slurm_x/uid_0/job_9876/step_0/task_0\n0::/\n")
    add_process(proc, 11, cgroup="6:freezer:/\n0::/\n")
    add_cgroup(cg, "/", pids=(10, 11))
    resolver = WorkloadResolver(str(cg), proc_root=str(proc), job_id_source=None, pod_source=None)
    assert resolver.resolve("/").as_dict().get("job_id", "") == ""
    assert resolver.resolve("/").as_dict().get("workload", "") == ""


def test_scope_keeps_only_paths_at_or_under_it(tmp_path):
    owners = Owners(CgroupResolver(str(tmp_path)), WorkloadResolver(job_id_source=None,
                                                                    pod_source=None),
                    scope="/slurm_n1/")
    assert owners.in_scope("/slurm_n1") and owners.in_scope("/slurm_n1/uid_0/job_1")
    assert not owners.in_scope("/slurm_n10/uid_0/job_1")
    assert not owners.in_scope("/") and not owners.in_scope("/slurm_n2")
    assert normal_scope("/") is None and normal_scope(None) is None
    with pytest.raises(ValueError):
        normal_scope("slurm_n1")


def test_doctor_names_the_key_and_a_host_without_one(tmp_path):
    from tracehound.commands.doctor import cgroup_key_line
    line, ok = cgroup_key_line("auto", table(tmp_path, TMPFS + v1(37, "freezer")))
    assert ok and line.split() == ["[ok]", "cgroup", "key", "v1", "freezer", "at",
                                   "/sys/fs/cgroup/freezer", "(v1", "host:", "no", "cgroup2",
                                   "mounted)"]
    line, ok = cgroup_key_line("v2", table(tmp_path, TMPFS + v1(37, "freezer")))
    assert not ok and line.startswith("  [!!] cgroup key")


def test_a_process_is_labelled_from_its_own_path_in_the_counted_hierarchy(tmp_path):
    """An XID names a pid: pid 1 in the v1 root is no job, even while a job's
    process shares its v2 cgroup."""
    proc = tmp_path / "proc"
    add_process(proc, 1, cgroup="6:freezer:/\n0::/\n")
    add_process(proc, 5, cgroup="6:freezer:/slurm/uid_0/job_5/step_0/task_0\n0::/\n")
    text = TMPFS + v1(37, "freezer") + V2_AT_UNIFIED
    layout = choose(table(tmp_path, text))
    owners = Owners(CgroupResolver(str(tmp_path)),
                    WorkloadResolver(job_id_source=None, pod_source=None),
                    path_of_pid=lambda pid: layout.path_of_pid(pid, str(proc)))
    assert owners.of_pid(1) == {"cgroup": "/", **{k: "" for k in owners.of_pid(1) if k != "cgroup"}}
    assert owners.of_pid(5)["job_id"] == "5" and owners.of_pid(5)["workload"] == "slurm"
