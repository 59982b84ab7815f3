"""Each agent instance's RDMA pins on a real bpffs: real maps pinned, each
instance in its own directory, only its own stale pins replaced, nothing
left at close, and a pin root a user could have made or swapped never used.
The probe's maps are real BPF maps made here (an RDMA device is not needed
to see where the probe pins, what it unlinks and what it leaves)."""
import ctypes
import os
import subprocess
from types import SimpleNamespace

import pytest

from tracehound import defaults, instance
from tracehound.bpf import libbpf
from tracehound.probes import rdma, rdma_pins

BPF_MAP_TYPE_ARRAY = 2


def new_map() -> int:
    """A real one-entry array map; its fd."""
    fn = libbpf.lib().bpf_map_create
    fn.restype = ctypes.c_int
    fn.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_uint32, ctypes.c_uint32,
                   ctypes.c_uint32, ctypes.c_void_p]
    fd = fn(BPF_MAP_TYPE_ARRAY, b"thtest_pin", 4, 8, 1, None)
    assert fd >= 0, libbpf.strerror(libbpf.errno_of(fd))
    return fd


def map_id(fd: int) -> int:
    with open(f"/proc/self/fdinfo/{fd}") as f:
        return int(next(ln.split()[1] for ln in f if ln.startswith("map_id:")))


def pinned_id(path) -> int:
    """The id of the map pinned at PATH."""
    fd = libbpf.lib().bpf_obj_get(str(path).encode())
    assert fd >= 0, f"nothing pinned at {path}"
    try:
        return map_id(fd)
    finally:
        os.close(fd)


def pin_elsewhere(path) -> int:
    """A map of no agent pinned at PATH (a killed agent's, a user's); its id."""
    fd = new_map()
    try:
        assert libbpf.lib().bpf_obj_pin(fd, str(path).encode()) == 0
        return map_id(fd)
    finally:
        os.close(fd)


@pytest.fixture
def pin_root(tmp_path, monkeypatch):
    bpffs = tmp_path / "bpffs"
    bpffs.mkdir()
    subprocess.run(["mount", "-t", "bpf", "bpf", str(bpffs)], check=True)
    monkeypatch.setattr(defaults, "PIN_ROOT", str(bpffs / "tracehound"))
    fds = []
    try:
        yield bpffs / "tracehound", fds
    finally:
        for fd in fds:
            os.close(fd)
        subprocess.run(["umount", str(bpffs)], check=True)


def pinning_probe(name: str, fds: list) -> tuple[rdma.RdmaProbe, dict]:
    """A probe of instance NAME holding real maps; and their ids by map name."""
    probe = rdma.RdmaProbe(rdma.RdmaProbeConfig(instance=name))
    probe._maps = {}
    for m in ("rdma_objects", "app_objects"):
        fds.append(new_map())
        probe._maps[m] = SimpleNamespace(fd=fds[-1])
    return probe, {m: map_id(v.fd) for m, v in probe._maps.items()}


def test_each_instance_pins_apart_replaces_only_its_own_stale_pins_and_leaves_nothing(pin_root):
    root, fds = pin_root
    (root / "n1").mkdir(parents=True)
    stale = pin_elsewhere(root / "n1" / "rdma_objects")     # left by a killed n1
    (a, a_ids), (b, b_ids) = pinning_probe("n1", fds), pinning_probe("n2", fds)
    a._pin()
    b._pin()
    assert pinned_id(root / "n1" / "rdma_objects") == a_ids["rdma_objects"] != stale
    assert pinned_id(root / "n2" / "rdma_app_objects") == b_ids["app_objects"]
    assert sorted(os.listdir(root / "n2")) == ["rdma_app_objects", "rdma_objects"]
    a.close()
    assert sorted(os.listdir(root)) == ["n2"]
    assert pinned_id(root / "n2" / "rdma_objects") == b_ids["rdma_objects"]
    b.close()
    assert not root.exists()


def test_the_default_instance_removes_pins_from_before_instances(pin_root):
    root, fds = pin_root
    root.mkdir()
    pin_elsewhere(root / "rdma_objects")                     # an older agent's
    probe, ids = pinning_probe("default", fds)
    probe._pin()
    assert sorted(os.listdir(root)) == ["default"]
    assert pinned_id(root / "default" / "rdma_objects") == ids["rdma_objects"]
    probe.close()
    assert not root.exists()


def test_removing_a_pin_directory_keeps_other_instances_and_the_root_they_share(pin_root):
    root, _fds = pin_root
    (root / "a").mkdir(parents=True)
    (root / "b").mkdir()
    held = pin_elsewhere(root / "b" / "rdma_objects")
    rdma_pins.remove_pin_dir(instance.pin_dir("a"))
    assert sorted(os.listdir(root)) == ["b"]
    # never recursive: a directory that still holds a pin stays
    rdma_pins.remove_pin_dir(instance.pin_dir("b"))
    assert pinned_id(root / "b" / "rdma_objects") == held
    os.unlink(root / "b" / "rdma_objects")
    rdma_pins.remove_pin_dir(instance.pin_dir("b"))
    assert not root.exists()


def test_a_symlinked_pin_root_is_not_followed(pin_root, tmp_path, caplog):
    # bpffs is often mounted mode 1777: any user may make the name first
    root, fds = pin_root
    victim = tmp_path / "victim"
    (victim / "n1").mkdir(parents=True)
    (victim / "n1" / "rdma_objects").write_text("not the agent's")
    root.symlink_to(victim)
    probe, _ids = pinning_probe("n1", fds)
    probe._pin()
    probe.close()
    assert (victim / "n1" / "rdma_objects").read_text() == "not the agent's"
    assert sorted(os.listdir(victim / "n1")) == ["rdma_objects"]
    assert "mirror not pinned" in caplog.text and "symbolic link" in caplog.text


@pytest.mark.parametrize("where", ["root", "instance"])
def test_a_pin_directory_others_can_write_is_not_used(pin_root, caplog, where):
    root, fds = pin_root
    (root / "n1").mkdir(parents=True)
    os.chmod(root if where == "root" else root / "n1", 0o777)
    someones = pin_elsewhere(root / "n1" / "rdma_objects")
    probe, _ids = pinning_probe("n1", fds)
    probe._pin()
    probe.close()
    assert pinned_id(root / "n1" / "rdma_objects") == someones
    assert sorted(os.listdir(root / "n1")) == ["rdma_objects"]
    assert "writable by it alone" in caplog.text
