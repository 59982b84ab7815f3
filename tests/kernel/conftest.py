"""Host-kernel tier: the real agent, real BPF in this kernel, real cgroups,
real file systems, scraped over HTTP."""
import contextlib
import glob
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tracehound import defaults
from tracehound.host.mounts import MountTable

from testbed.cgroups import exec_in_cgroup, remove_cgroup  # noqa: F401  (tests import them here)
from tests.conftest import ROOT, tracehound_cmd

WORKER = os.path.join(os.path.dirname(__file__), "worker.py")
# The worker needs only the standard library: isolated (-I) and without the
# site step (-S) it starts in 1.7 s instead of 3.5 s in the VM tier's guest
# (emulated CPU, root over 9p), where the I/O suite starts it in nearly every
# test and mode; 40 ms instead of 97 ms here.
WORKER_ARGV = [sys.executable, "-I", "-S", WORKER]


def require_tools(*tools: str) -> None:
    """Fail, naming what is missing, unless every tool is on PATH: each one
    the kernel tier uses is installed by scripts/install --dev, so a missing
    one is a broken install, never a reason to skip."""
    missing = [t for t in tools if shutil.which(t) is None]
    if missing:
        pytest.fail(f"{', '.join(missing)} not installed: scripts/install --dev installs "
                    f"{'it' if len(missing) == 1 else 'them'}")


def _cgroup2_root():
    return MountTable().cgroup2_root()


def pytest_collection_modifyitems(config, items):
    reason = None
    if os.geteuid() != 0:
        reason = "needs root: loads BPF programs into this kernel"
    elif _cgroup2_root() is None:
        reason = "needs a mounted cgroup v2 hierarchy"
    for item in items:
        if "tests/kernel" in str(item.fspath):
            item.add_marker(pytest.mark.root)
            if reason:
                item.add_marker(pytest.mark.skip(reason=reason))


class Agent:
    def __init__(self, proc, url):
        self.proc = proc
        self.url = url

    def scrape_text(self) -> str:
        # a scrape takes ~0.2 s in the VM tier's guest, but the guest can
        # stall for many seconds when the host tiers load the machine beside it
        with urllib.request.urlopen(self.url, timeout=30) as r:
            return r.read().decode()

    def scrape(self) -> dict:
        """{(sample name, frozenset(labels)): value}"""
        out = {}
        for fam in text_string_to_metric_families(self.scrape_text()):
            for s in fam.samples:
                out[(s.name, frozenset(s.labels.items()))] = s.value
        return out


# What a plain `tracehound run` counts by, which start_agent's own choices
# replace unless given: on this hybrid host `auto` keys by the v1 freezer
# hierarchy, and a cgroup of no workload shares one latency histogram per
# mount. The examples' workloads must be seen there.
USERS_DEFAULTS = ("--cgroup-key", "auto", "--latency-histograms", defaults.LATENCY_HISTOGRAMS)


def start_agent(hook_mode: str, *extra: str, wrapper: tuple[str, ...] = (),
                cmd: tuple[str, ...] = ()) -> Agent:
    """An agent of this environment's tracehound (or `cmd`), under `wrapper`."""
    # an instance of its own (unless the test names one): agents of one run
    # overlap, the session's and a test's, and each would refuse the other
    own = () if "--instance" in extra else ("--instance", f"thtest-{uuid.uuid4().hex[:12]}")
    # the tests make their cgroups in the v2 tree; on a hybrid host auto would
    # count by a v1 hierarchy (test_cgroup_v1.py asks for that itself)
    if "--cgroup-key" not in extra:
        own += ("--cgroup-key", "v2")
    # the tests' cgroups are of no workload, whose latency the default sums per
    # mount: every label set keeps its histogram, as the tests read them
    # (the default is the cluster tier's, whose agents time real Slurm jobs)
    if "--latency-histograms" not in extra:
        own += ("--latency-histograms", "cgroup-mount")
    proc = subprocess.Popen([*wrapper, *(cmd or tracehound_cmd()), "run", "--listen", "127.0.0.1:0",
                             "--hook-mode", hook_mode, *own, *extra],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines = []
    # a second or two here; in the VM tier's guest (emulated CPU, Python over
    # 9p) 25 to 70 s, and up to four minutes for an fentry agent timing fsync
    # alone while the host tiers share the CPUs (252 s seen): a deadline for
    # the agent's first lines, never reached by one that starts
    deadline = time.monotonic() + 480
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        lines.append(line)
        # up to /metrics: another thread's log line may follow on the same line
        m = re.search(r"serving metrics on (https?://\S+?/metrics)", line)
        if m:
            # the mode lines follow; wait until all probes are reported
            url = m.group(1)
            while True:
                line = proc.stdout.readline()
                lines.append(line)
                if "mode" not in line or "io.rename" in line:
                    break
            return Agent(proc, url)
    proc.kill()
    pytest.fail("agent did not start:\n" + "".join(lines) + (proc.stdout.read() or ""))


def stop_agent(agent: Agent) -> None:
    agent.proc.terminate()
    try:
        agent.proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        agent.proc.kill()
        pytest.fail("agent ignored SIGTERM for 20 s")


@pytest.fixture(scope="session", autouse=True)
def forget_test_instances():
    """An agent leaves its lock file (unlinking one races with the next
    agent of its name) and its state directory: the tests' own instances
    (thtest-*) end with the session, after every agent of theirs stopped."""
    yield
    for path in glob.glob("/run/tracehound/thtest-*.lock"):
        with contextlib.suppress(OSError):
            os.unlink(path)
    for path in glob.glob("/var/lib/tracehound/instances/thtest-*"):
        shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(scope="session")
def hook_mode(request):
    return request.config.getoption("--hook-mode")


@pytest.fixture(scope="session")
def agent(hook_mode):
    a = start_agent(hook_mode)
    yield a
    stop_agent(a)


@pytest.fixture(scope="session")
def cgroup_root():
    return _cgroup2_root()


@pytest.fixture
def cgroup(cgroup_root):
    """A fresh child cgroup; yields its path relative to the cgroup2 root."""
    rel = f"/thtest/{uuid.uuid4().hex[:12]}"
    path = cgroup_root + rel
    os.makedirs(path)
    yield rel
    remove_cgroup(path)


@pytest.fixture(scope="session")
def tmpfs():
    d = tempfile.mkdtemp(prefix="thtest-tmpfs-")
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=512m", "thtest", d], check=True)
    yield d
    subprocess.run(["umount", "-l", d], check=False)
    os.rmdir(d)


@pytest.fixture(scope="session")
def ext4():
    """A small ext4 of its own on a loop device: no other program's I/O
    touches this mount (the host's root ext4 also serves every program's
    libraries, which would add page-cache fills of their own)."""
    base = tempfile.mkdtemp(prefix="thtest-ext4-")
    image, mnt = os.path.join(base, "image"), os.path.join(base, "mnt")
    os.mkdir(mnt)
    with open(image, "wb") as f:
        f.truncate(128 << 20)
    subprocess.run(["mkfs.ext4", "-q", "-F", image], check=True)
    subprocess.run(["modprobe", "loop"], check=False, capture_output=True)
    subprocess.run(["mount", "-o", "loop", image, mnt], check=True)
    yield mnt
    subprocess.run(["umount", "-l", mnt], check=False)
    subprocess.run(["rm", "-rf", base], check=False)


@pytest.fixture
def disk_dir():
    """A directory on a disk-backed file system: the root ext4 on a host; in
    the VM tier (read-only 9p root) a writable shared directory it names."""
    base = os.environ.get("TRACEHOUND_TEST_DISK_DIR", "/var/tmp")
    d = tempfile.mkdtemp(prefix="thtest-disk-", dir=base)
    yield d
    subprocess.run(["rm", "-rf", d], check=False)


def run_in_cgroup(cgroup_root: str, cgroup: str, plan: list) -> list:
    """Run the worker inside the cgroup; returns each operation's result."""
    procs = cgroup_root + cgroup + "/cgroup.procs"
    out = subprocess.run([*WORKER_ARGV, procs, json.dumps(plan)],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def series(metrics: dict, name: str, **labels) -> float:
    want = set(labels.items())
    return sum(v for (n, ls), v in metrics.items() if n == name and want <= set(ls))


def mount_of(path: str) -> str:
    return findmnt(path, "TARGET")


def fstype_of(path: str) -> str:
    return findmnt(path, "FSTYPE")


def findmnt(path: str, column: str) -> str:
    return subprocess.run(["findmnt", "-n", "-o", column, "--target", path],
                          capture_output=True, text=True, check=True).stdout.strip()


@pytest.fixture(scope="session")
def built_wheel(tmp_path_factory) -> str:
    """The package as it ships, built once from this tree (probes compiled in)."""
    out = tmp_path_factory.mktemp("wheel")
    built = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-build-isolation",
                            "--no-deps", "-q", "-w", str(out), ROOT],
                           capture_output=True, text=True, timeout=600)
    shutil.rmtree(os.path.join(ROOT, "build"), ignore_errors=True)
    for info in glob.glob(os.path.join(ROOT, "src", "*.egg-info")):
        shutil.rmtree(info, ignore_errors=True)
    assert built.returncode == 0, built.stdout + built.stderr
    [wheel] = glob.glob(str(out / "tracehound-*.whl"))
    return wheel
