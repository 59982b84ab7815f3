"""The start-time scan for libibverbs (probes/rdma_app.py) against files a
container user controls. A real process pivots into a root of its own in a
new mount namespace (as a container does), maps a library there and drops to
uid 65534; the test then does what that user could: replace the path by a
FIFO, by an absolute symlink to a host file, by another library, or map a
crafted ELF. The probe's own scan (rdma_app_scan.py, its uprobes attached for
real) must answer, refuse that file naming why, and still attach to the
system's libibverbs and to a genuine container copy, on overlayfs too."""
import ctypes
import json
import os
import select
import shutil
import subprocess
import sys
import tempfile

import pytest

from tests import crafted_elf
from tests.kernel.conftest import require_tools

HERE = os.path.dirname(__file__)
SCAN = os.path.join(HERE, "rdma_app_scan.py")
MAPPER = os.path.join(HERE, "verbs_mapper.py")
SYSTEM = crafted_elf.REAL_LIBIBVERBS
# generous: the scan answers in about a second; before it was bounded, a
# FIFO stopped it for good and 10^7 symbols took minutes
SCAN_DEADLINE_S = 60
INSIDE = "/usr/lib/x86_64-linux-gnu/libibverbs.so.1"


class Container:
    """A process that maps `inside` within `root` (see verbs_mapper.py)."""

    def __init__(self, root: str, inside: str = INSIDE):
        require_tools("unshare")
        self.root, self.inside = root, inside
        self.proc = subprocess.Popen(["unshare", "-m", "--propagation", "private", sys.executable,
                                      MAPPER, root, inside], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        ready, _, _ = select.select([self.proc.stdout], [], [], 30)
        line = self.proc.stdout.readline() if ready else ""
        if line.strip() != "mapped":
            self.close()
            pytest.fail(f"the mapping process did not start: {self.proc.stderr.read()[-500:]}")

    @property
    def host_path(self) -> str:
        """The mapped path, as this host names it."""
        return os.path.join(self.root, self.inside.lstrip("/"))

    @property
    def seen_as(self) -> str:
        return f"/proc/{self.proc.pid}/root{self.inside}"

    def close(self) -> None:
        self.proc.stdin.close()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.proc.stdout.close()
        self.proc.stderr.close()


@pytest.fixture
def root():
    path = tempfile.mkdtemp(prefix="th-verbs-root-")
    os.makedirs(os.path.join(path, os.path.dirname(INSIDE.lstrip("/"))))
    yield path
    shutil.rmtree(path)


@pytest.fixture
def container(root):
    made = []

    def make(library=None, inside=INSIDE) -> Container:
        dst = os.path.join(root, inside.lstrip("/"))
        os.makedirs(os.path.dirname(dst), exist_ok=True)
        (library or (lambda d: shutil.copyfile(SYSTEM, d)))(dst)
        made.append(Container(root, inside))
        return made[-1]

    yield make
    for c in made:
        c.close()


@pytest.fixture(scope="module")
def exiting():
    """Scans whose answer is read: each detaches its 30-60 uprobes on exit,
    a kernel grace period apiece (seconds in all), while the test goes on."""
    procs = []
    yield procs
    settle(procs)


def settle(procs: list) -> None:
    """Until every earlier scan has exited. A scan's uprobe attaches wait on
    the same kernel lock as another's detaches: begun while one still
    detaches, a scan runs past its wall-clock budget and leaves copies for
    a later look (as the agent would, on a busy node)."""
    while procs:
        proc = procs.pop()
        proc.wait(timeout=120)
        proc.stdout.close()
        proc.stderr.close()


@pytest.fixture
def scan(exiting):
    def run() -> dict:
        """What the probe's scan attached and refused; fails by name if it
        does not answer or dies before answering."""
        settle(exiting)
        proc = subprocess.Popen([sys.executable, SCAN], stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)
        exiting.append(proc)
        ready, _, _ = select.select([proc.stdout], [], [], SCAN_DEADLINE_S)
        if not ready:
            proc.kill()
            pytest.fail(f"the scan did not answer within {SCAN_DEADLINE_S} s")
        line = proc.stdout.readline()
        if not line:
            proc.wait(timeout=120)
            pytest.fail(f"the scan exited {proc.returncode}: {proc.stderr.read()[-1500:]}")
        return json.loads(line)
    return run


def refusal_of(result: dict, c: Container) -> str:
    """The one refusal naming the container's file; and nothing of it attached."""
    assert not [p for p in result["libraries"] if p.startswith(f"/proc/{c.proc.pid}/")], result
    assert SYSTEM in result["libraries"], result
    mine = [r for r in result["refused"] if f"/proc/{c.proc.pid}/root" in r]
    assert len(mine) == 1, result
    return mine[0]


def test_a_container_copy_is_attached_beside_the_systems(container, scan):
    c = container()
    result = scan()
    # other processes on this host may map libibverbs too (a VM's qemu does)
    assert {SYSTEM, c.seen_as} <= set(result["libraries"]), result
    # entry and return uprobes on 15 verbs, per library
    assert result["links"] == 2 * 15 * len(result["libraries"]), result


def test_a_path_replaced_by_a_fifo_is_refused_without_blocking(container, scan):
    c = container()
    os.unlink(c.host_path)
    os.mkfifo(c.host_path)
    assert "not a regular file (a FIFO)" in refusal_of(scan(), c)


def test_an_absolute_symlink_in_the_container_is_not_followed_to_the_host(container, tmp_path,
                                                                         scan):
    c = container()
    host_file = shutil.copyfile(SYSTEM, tmp_path / "libibverbs.so.1")   # a readable host file
    os.unlink(c.host_path)
    os.symlink(host_file, c.host_path)
    assert "a symbolic link, not followed" in refusal_of(scan(), c)


def test_an_absolute_directory_symlink_resolves_inside_the_container(container, root, tmp_path,
                                                                    scan):
    c = container()
    # the host has <tmp_path>/x86_64-linux-gnu/libibverbs.so.1; the container
    # points its library directory there, absolutely: inside its root, no such file
    shutil.copytree(os.path.dirname(c.host_path), tmp_path / "x86_64-linux-gnu")
    shutil.rmtree(os.path.join(root, "usr/lib"))
    os.symlink(tmp_path, os.path.join(root, "usr/lib"))
    assert "No such file or directory" in refusal_of(scan(), c)


@pytest.fixture
def silent_fuse(root):
    """A FUSE file system nobody serves, at <root>/fuse: a lookup in it waits
    until the connection is aborted (here, when its device is closed)."""
    mnt = os.path.join(root, "fuse")
    os.mkdir(mnt)
    dev = os.open("/dev/fuse", os.O_RDWR | os.O_CLOEXEC)
    libc = ctypes.CDLL(None, use_errno=True)
    options = f"fd={dev},rootmode=40000,user_id=0,group_id=0".encode()
    if libc.mount(b"silent", mnt.encode(), b"fuse", 0, options) != 0:
        os.close(dev)
        pytest.fail(f"cannot mount FUSE: {os.strerror(ctypes.get_errno())}")
    yield mnt
    os.close(dev)
    libc.umount2(mnt.encode(), 2)


def test_a_path_into_a_file_system_that_never_answers_is_refused(silent_fuse, container, root,
                                                                  scan):
    c = container()
    # the library directory becomes a link into the FUSE mount, inside the root
    shutil.rmtree(os.path.join(root, "usr/lib"))
    os.symlink("/fuse", os.path.join(root, "usr/lib"))
    assert "its file system does not answer" in refusal_of(scan(), c)


def test_a_path_swapped_for_another_library_is_refused(container, scan):
    c = container()
    os.unlink(c.host_path)                  # the process keeps its mapping
    shutil.copyfile(SYSTEM, c.host_path)    # a genuine library, but not the one mapped
    assert "is not the file the process maps" in refusal_of(scan(), c)


def test_a_version_section_of_the_wrong_type_is_refused(container, scan):
    c = container(crafted_elf.wrong_type_versions)
    assert "no symbol version table" in refusal_of(scan(), c)


def test_a_dynamic_symbol_table_of_ten_million_entries_is_refused(container, scan):
    c = container(crafted_elf.ten_million_symbols)
    assert "is larger than" in refusal_of(scan(), c)


@pytest.fixture
def overlay_libdir(root, tmp_path):
    """The container's library directory an overlayfs (as an image is), the
    system's libibverbs in its lower layer."""
    libdir = os.path.join(root, os.path.dirname(INSIDE.lstrip("/")))
    for d in ("lower", "upper", "work"):
        (tmp_path / d).mkdir()
    shutil.copyfile(SYSTEM, tmp_path / "lower" / os.path.basename(INSIDE))
    subprocess.run(["mount", "-t", "overlay", "overlay", "-o",
                    f"lowerdir={tmp_path}/lower,upperdir={tmp_path}/upper,"
                    f"workdir={tmp_path}/work", libdir], check=True)
    yield libdir
    subprocess.run(["umount", libdir], check=True)


def test_a_container_library_on_overlayfs_is_attached(overlay_libdir, container, scan):
    """The process maps the overlay file, which /proc/PID/maps names by its
    lower layer's inode before Linux 6.8 and by its own since: either way
    the scan attaches to the file the process maps."""
    c = container(library=lambda _dst: None)        # the overlay has it already
    assert os.stat(c.host_path).st_dev == os.stat(overlay_libdir).st_dev
    result = scan()
    assert {SYSTEM, c.seen_as} <= set(result["libraries"]), result
    assert not [r for r in result["refused"] if f"/proc/{c.proc.pid}/" in r], result


