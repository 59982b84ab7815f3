"""GPU <-> RDMA NIC affinity on a fake sysfs/procfs tree: which NIC a GPU
process holds open, and the PCIe / NUMA relation of that NIC to its GPU."""
import os

import pytest

from tracehound.gpu.affinity import Affinity
from tracehound.host.topology import Topology

from .fake_nvml import FakeGpu, FakeNvml
from .gpu_helpers import make_collector, make_host, scrape, value, write

GPU_PATH = "pci0000:3a/0000:3a:00.0/0000:3b:00.0/0000:3c:08.0/0000:3d:00.0"
NICS = {   # name: (sysfs device path, NUMA node)
    "mlx5_0": ("pci0000:3a/0000:3a:00.0/0000:3b:00.0/0000:3c:10.0/0000:3e:00.0", 0),
    "mlx5_1": ("pci0000:3a/0000:3a:02.0/0000:40:00.0", 0),
    "mlx5_2": ("pci0000:5d/0000:5d:00.0/0000:5e:00.0", 0),
    "mlx5_3": ("pci0000:d7/0000:d7:00.0/0000:d8:00.0", 1),
}


def pci_device(root, path, node):
    write(root, f"sys/devices/{path}/numa_node", f"{node}\n")
    link = os.path.join(root, "sys/bus/pci/devices", os.path.basename(path))
    os.makedirs(os.path.dirname(link), exist_ok=True)
    os.symlink(os.path.join(root, "sys/devices", path), link)
    return os.path.join(root, "sys/devices", path)


def rdma_host(tmp_path, holds):
    """holds: pid -> [uverbs numbers it has open]."""
    root = make_host(tmp_path, nodes={0: "0-3", 1: "4-7"},
                     procs={pid: (f"/slurm/job_{pid}", "0-3", "0") for pid in holds})
    pci_device(root, GPU_PATH, 0)
    for i, (name, (path, node)) in enumerate(sorted(NICS.items())):
        dev = pci_device(root, path, node)
        os.makedirs(os.path.join(root, "sys/class/infiniband", name))
        os.symlink(dev, os.path.join(root, "sys/class/infiniband", name, "device"))
        write(root, f"sys/class/infiniband_verbs/uverbs{i}/ibdev", name + "\n")
    for pid, uverbs in holds.items():
        fd_dir = os.path.join(root, "proc", str(pid), "fd")
        os.makedirs(fd_dir)
        os.symlink("/dev/null", os.path.join(fd_dir, "0"))
        os.symlink("socket:[1234]", os.path.join(fd_dir, "1"))
        for n, uv in enumerate(uverbs):
            os.symlink(f"/dev/infiniband/uverbs{uv}", os.path.join(fd_dir, str(10 + n)))
    return root


@pytest.mark.parametrize("nic, relation", [
    ("mlx5_0", "pcie_switch"),      # below the same switch as the GPU
    ("mlx5_1", "host_bridge"),      # same root complex, another root port
    ("mlx5_2", "numa_node"),        # another root complex on the GPU's node
    ("mlx5_3", "cross_numa"),
])
def test_relation_of_each_nic_to_the_gpu(tmp_path, nic, relation):
    aff = Affinity(Topology(rdma_host(tmp_path, {})))
    assert aff.relation("0000:3d:00.0", 0, aff.nics[nic]) == relation


def test_unknown_without_pci_in_sysfs(tmp_path):
    aff = Affinity(Topology(rdma_host(tmp_path, {})))
    assert aff.relation("0000:99:00.0", None, aff.nics["mlx5_0"]) == "unknown"
    assert aff.nics["mlx5_3"].pci_bus_id == "0000:d8:00.0" and aff.nics["mlx5_3"].numa_node == 1


def test_a_process_nics_are_the_uverbs_devices_it_holds(tmp_path):
    aff = Affinity(Topology(rdma_host(tmp_path, {1234: [0, 3, 3], 5678: []})))
    assert [n.name for n in aff.nics_of(1234)] == ["mlx5_0", "mlx5_3"]
    assert aff.nics_of(5678) == [] and aff.nics_of(999) == []


def test_no_rdma_on_the_host(tmp_path):
    aff = Affinity(Topology(make_host(tmp_path, procs={1: ("/a", "0", "0")})))
    assert aff.nics == {} and aff.nics_of(1) == []


def test_collector_exports_each_process_nic_pair(tmp_path):
    root = rdma_host(tmp_path, {1234: [0, 3], 5678: []})
    gpu = FakeGpu(uuid="GPU-aaaa", pci_bus_id="00000000:3D:00.0",
                  compute_procs=[(1234, 1 << 30), (5678, 1 << 30)])
    f = scrape(make_collector(FakeNvml([gpu]), root))
    fam = "tracehound_gpu_process_nic_misplaced"
    assert value(f, fam, gpu=0, pid=1234, cgroup="/slurm/job_1234", nic="mlx5_0",
                 relation="pcie_switch") == 0
    assert value(f, fam, pid=1234, nic="mlx5_3", relation="cross_numa") == 1
    assert len(f[fam]) == 2                     # 5678 holds no NIC: no series
