"""The package as a node gets it: a wheel built once (here, where clang is),
installed in a fresh virtual environment, and run where no compiler is.

The agent runs in a mount namespace of its own where the LLVM tree (clang,
llc) is an empty directory and `make` is gone, from a working directory
outside the source tree, and counts one known write exactly: the CO-RE
objects it loads are the wheel's. The dependencies (pure Python) come from
the test environment; the package itself only from the wheel.
"""
import glob
import json
import os
import platform
import shutil
import subprocess
import sys
import sysconfig
import uuid

import pytest

from tests.conftest import ROOT
from tests.kernel.conftest import WORKER_ARGV, mount_of, series, start_agent, stop_agent

# what builds probes: the LLVM tree clang and llc live in, and make
COMPILERS = (os.path.dirname(os.path.realpath(shutil.which("clang") or "/usr/bin/clang")),)


@pytest.fixture(scope="module")
def wheel_venv(built_wheel, tmp_path_factory):
    wheel = built_wheel
    venv = tmp_path_factory.mktemp("wheel") / "venv"
    # as scripts/install makes it: Debian's own Python packages (python3-yaml) visible
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", "--system-site-packages",
                    str(venv)], check=True)
    site = subprocess.run([str(venv / "bin" / "python"), "-c",
                           "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True).stdout.strip()
    installed = subprocess.run([sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python"),
                                "install", "--no-index", "--no-deps", "--ignore-installed", "-q",
                                wheel], capture_output=True, text=True, timeout=300)
    assert installed.returncode == 0, installed.stdout + installed.stderr
    # then the dependencies from this environment, behind the venv's own packages
    with open(os.path.join(site, "test-dependencies.pth"), "w") as f:
        f.write(sysconfig.get_paths()["purelib"] + "\n")
    return wheel, venv


def test_the_wheel_names_its_architecture_and_carries_the_objects(wheel_venv):
    wheel, venv = wheel_venv
    platform = sysconfig.get_platform().replace("-", "_").replace(".", "_")
    assert os.path.basename(wheel).endswith(f"-py3-none-{platform}.whl"), wheel
    where = subprocess.run([str(venv / "bin" / "python"), "-c",
                            "import os, tracehound.probes as p; print(os.path.dirname(p.__file__))"],
                           capture_output=True, text=True, check=True, cwd="/").stdout.strip()
    assert where.startswith(str(venv)), where
    objects = sorted(os.path.basename(p) for p in glob.glob(os.path.join(where, "*.bpf.o")))
    built = sorted(os.path.basename(p) for p in glob.glob(
        os.path.join(ROOT, "src", "tracehound", "probes", "*.bpf.o")))
    assert objects and objects == built, (objects, built)


def test_an_agent_from_the_wheel_counts_exact_bytes_where_no_compiler_is(
        wheel_venv, hook_mode, cgroup_root, cgroup, tmpfs, tmp_path):
    _wheel, venv = wheel_venv
    script = "\n".join([
        "set -e",
        *(f"mount -t tmpfs -o size=1m,mode=0555 nocompiler {d}" for d in COMPILERS),
        'm=$(command -v make || true); [ -z "$m" ] || mount --bind /bin/false "$m"',
        'if clang --version >/dev/null 2>&1; then echo "clang still runs" >&2; exit 99; fi',
        f"cd {tmp_path}",
        'exec "$@"'])
    wrapper = ("unshare", "--mount", "--propagation", "private", "sh", "-c", script, "sh")
    agent = start_agent(hook_mode, wrapper=wrapper, cmd=(str(venv / "bin" / "tracehound"),))
    try:
        path = os.path.join(tmpfs, f"wheel-{uuid.uuid4().hex[:8]}")
        size = 3 * 2**20 + 17
        # written from the agent's mount namespace (unshare and sh exec'd into
        # the agent: its pid), whose copies of the mounts have ids of their own
        done = subprocess.run(["nsenter", f"--mount=/proc/{agent.proc.pid}/ns/mnt", *WORKER_ARGV,
                               f"{cgroup_root}{cgroup}/cgroup.procs",
                               json.dumps([["write", path, size, 65536]])],
                              capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        scraped = agent.scrape()
        got = series(scraped, "tracehound_io_write_bytes_total", cgroup=cgroup,
                     mountpoint=mount_of(tmpfs))
        assert got == size
        # it says what runs: the commit the wheel was built from, this kernel
        [build] = [dict(labels) for name, labels in scraped if name == "tracehound_build_info"]
        commit = subprocess.run(["git", "-C", ROOT, "describe", "--always", "--dirty",
                                 "--abbrev=12"], capture_output=True, text=True).stdout.strip()
        assert (build["commit"], build["kernel"]) == (commit or "unknown", platform.release())
        assert build["hook_modes"] and set(build["hook_modes"].split(",")) <= \
            {"fentry", "kprobe", "tracepoint", "tp_btf", "raw_tp", "uprobe"}, build
    finally:
        stop_agent(agent)
