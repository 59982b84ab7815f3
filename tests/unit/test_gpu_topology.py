"""sysfs/procfs topology reading on a temporary tree, and the GPU's NUMA node."""
import pytest

from tracehound.gpu.device import enumerate_gpus
from tracehound.host.topology import (
    Placement,
    Topology,
    cpus_from_mask_words,
    normalize_pci_bus_id,
    parse_cpulist,
)

from .fake_nvml import FakeGpu, FakeNvml
from .gpu_helpers import make_host, write


@pytest.mark.parametrize("text,cpus", [
    ("0-3,8,10-11\n", {0, 1, 2, 3, 8, 10, 11}),
    ("5", {5}),
    ("", set()),
    ("0-7:2", {0, 2, 4, 6}),
])
def test_parse_cpulist(text, cpus):
    assert parse_cpulist(text) == cpus


def test_cpu_mask_words():
    assert cpus_from_mask_words([0b1011, 1]) == {0, 1, 3, 64}
    assert cpus_from_mask_words([0, 0]) == set()


@pytest.mark.parametrize("nvml_id,sysfs_id", [
    ("00000000:3B:00.0", "0000:3b:00.0"),
    (b"00000001:C1:00.0\x00", "0001:c1:00.0"),
    ("0000:3b:00.0", "0000:3b:00.0"),
    ("00010000:01:00.0", "10000:01:00.0"),     # behind Intel VMD
])
def test_pci_bus_ids_match_sysfs(nvml_id, sysfs_id):
    assert normalize_pci_bus_id(nvml_id) == sysfs_id


def test_sysfs_and_procfs_reading(tmp_path):
    root = make_host(tmp_path, nodes={0: "0-3", 1: "4-7"},
                     pci={"0000:3b:00.0": 1, "0000:86:00.0": -1},
                     nics={("net", "eth0"): 1, ("net", "veth9"): None, ("infiniband", "mlx5_1"): -1},
                     procs={42: ("/slurm/uid_0/job_5/step_0", "2-5", "0")})
    topo = Topology(root)
    assert topo.pci_numa_node("00000000:3B:00.0") == 1
    assert topo.pci_numa_node("00000000:86:00.0") is None      # firmware says -1
    assert topo.pci_numa_node("00000000:99:00.0") is None      # no such device
    assert topo.cpu_nodes() == {0: 0, 1: 0, 2: 0, 3: 0, 4: 1, 5: 1, 6: 1, 7: 1}
    assert [(n.device, n.subsystem, n.numa_node) for n in topo.nics()] == [
        ("eth0", "net", 1), ("mlx5_1", "infiniband", -1)]
    assert topo.process_cgroup(42) == "/slurm/uid_0/job_5/step_0"
    assert topo.process_cgroup(43) is None
    assert topo.process_placement(42) == Placement(frozenset({2, 3, 4, 5}), frozenset({0}))
    assert topo.process_placement(43) is None


def test_root_cgroup_line(tmp_path):
    write(tmp_path, "proc/9/cgroup", "0::/\n")
    assert Topology(str(tmp_path)).process_cgroup(9) == "/"


@pytest.mark.parametrize("cpus,mems,gpu_node,misplaced", [
    ({4, 5}, {1}, 0, True),        # everything on node 1
    ({4, 5}, {0}, 0, True),        # memory near, CPUs far
    ({0, 1}, {1}, 0, True),        # CPUs near, memory far
    ({3, 4}, {0, 1}, 0, False),    # spans both nodes: may run near the GPU
    ({0}, {0}, 0, False),
    (set(), set(), 0, False),      # unknown: never judged
    ({4}, {1}, 1, False),
])
def test_misplacement_rule(tmp_path, cpus, mems, gpu_node, misplaced):
    topo = Topology(make_host(tmp_path, nodes={0: "0-3", 1: "4-7"}))
    assert topo.misplaced(Placement(frozenset(cpus), frozenset(mems)), gpu_node) is misplaced


def test_gpu_node_from_sysfs_then_nvml_affinity(tmp_path):
    root = make_host(tmp_path, nodes={0: "0-63", 1: "64-127"}, pci={"0000:3b:00.0": 0})
    nvml = FakeNvml([
        FakeGpu(uuid="GPU-a", pci_bus_id="00000000:3B:00.0", cpu_affinity=[0, 1 << 63]),
        # no sysfs entry: NVML's ideal CPUs (64-127) sit on node 1
        FakeGpu(uuid="GPU-b", pci_bus_id="00000000:86:00.0", cpu_affinity=[0, (1 << 64) - 1]),
        # affinity spans both nodes: unknown
        FakeGpu(uuid="GPU-c", pci_bus_id="00000000:87:00.0", cpu_affinity=[1, 1]),
    ])
    gpus, lost = enumerate_gpus(nvml, Topology(root))
    assert [(g.uuid, g.pci_bus_id, g.numa_node) for g in gpus] == [
        ("GPU-a", "0000:3b:00.0", 0), ("GPU-b", "0000:86:00.0", 1), ("GPU-c", "0000:87:00.0", None)]
    assert lost == []
