"""What the agent makes of the kernel's cgroup names: paths decoded as the
tree walk decodes them, the hierarchy found in /proc/cgroups, and names from
another frame (a cgroup namespace of the agent's own) not used."""
import pytest

from tracehound.attribution.cgroups import CgroupResolver
from tracehound.errors import TracehoundError
from tracehound.probes.cgroup_names import NAME_LEN, decode_path, hierarchy_id

PROC_CGROUPS = """#subsys_name\thierarchy\tnum_cgroups\tenabled
cpuset\t3\t5\t1
freezer\t7\t40\t1
memory\t0\t120\t1
"""


@pytest.mark.parametrize("raw, path", [
    (b"/job_1/step_0\0" + b"\0" * 50, "/job_1/step_0"),
    (b"/a\xff b\0garbage after the end", "/a\udcff b"),
    (b"/" + b"x" * (NAME_LEN + 100), "/" + "x" * (NAME_LEN - 1)),
    (b"not/absolute\0", None),
    (b"\0/hidden\0", None),
])
def test_a_kernel_name_is_decoded_as_the_tree_walk_would(raw, path):
    assert decode_path(raw) == path


def test_the_hierarchy_is_the_one_its_controller_is_bound_to(tmp_path):
    f = tmp_path / "cgroups"
    f.write_text(PROC_CGROUPS)
    assert hierarchy_id("v2", str(f)) == 0
    assert hierarchy_id("freezer", str(f)) == 7
    with pytest.raises(TracehoundError, match="memory controller is bound to no v1"):
        hierarchy_id("memory", str(f))     # on v2 here
    with pytest.raises(TracehoundError, match="blkio"):
        hierarchy_id("blkio", str(f))


def test_names_from_above_the_agents_tree_are_not_used(tmp_path):
    (tmp_path / "job").mkdir()
    ino = (tmp_path / "job").stat().st_ino
    kernel = {ino: "/kubepods/agent-pod/job", 99: "/kubepods/agent-pod/other"}
    resolver = CgroupResolver(str(tmp_path))
    resolver.names = kernel.get
    resolver._created(ino, "/job")
    assert resolver.names is None
    resolver.new_scrape()
    assert resolver.path(99) == "unknown:99"


def test_a_name_that_differs_otherwise_does_not_stop_the_kernels_names(tmp_path):
    """A v1 cgroup renamed before the watcher looked: one stale name, not a
    reason to stop asking the kernel."""
    kernel = {5: "/old-name", 99: "/gone"}
    resolver = CgroupResolver(str(tmp_path))
    resolver.names = kernel.get
    resolver._created(5, "/new-name")
    assert resolver.names is not None
    resolver.new_scrape()
    assert resolver.path(99) == "/gone"
