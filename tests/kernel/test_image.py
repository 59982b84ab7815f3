"""The container image as a node runs it: built by scripts/build-image from
the wheel (a Debian 12 base by debootstrap, no registry), written as an OCI
archive, unpacked here layer by layer, and run as a container runs it: the
image's own root, with the host's /proc, /sys, /dev and /run, as the
DaemonSet mounts them. Its agent counts one known write exactly.
"""
import json
import os
import subprocess
import tarfile
import uuid

import pytest

from tests.conftest import ROOT
from tests.kernel.conftest import mount_of, series, start_agent, stop_agent

IMAGE_PATH = "/usr/sbin:/usr/bin:/sbin:/bin"


def blob(archive: tarfile.TarFile, digest: str) -> tarfile.ExFileObject:
    algorithm, hexdigest = digest.split(":")
    return archive.extractfile(f"blobs/{algorithm}/{hexdigest}")


@pytest.fixture(scope="module")
def image(built_wheel, tmp_path_factory):
    """(its OCI config, its root file system unpacked)."""
    out = tmp_path_factory.mktemp("image")
    built = subprocess.run([os.path.join(ROOT, "scripts", "build-image"), "--wheel", built_wheel,
                            "--out", str(out)], capture_output=True, text=True, timeout=900)
    assert built.returncode == 0, built.stdout + built.stderr
    path = built.stdout.strip().splitlines()[-1]
    assert os.path.basename(path) == "tracehound-0.1.0.oci.tar", built.stdout
    rootfs = out / "rootfs"
    rootfs.mkdir()
    with tarfile.open(path) as archive:
        index = json.load(archive.extractfile("index.json"))
        [entry] = index["manifests"]
        manifest = json.load(blob(archive, entry["digest"]))
        config = json.load(blob(archive, manifest["config"]["digest"]))
        for layer in manifest["layers"]:
            with tarfile.open(fileobj=blob(archive, layer["digest"]), mode="r:*") as t:
                t.extractall(rootfs, numeric_owner=True)
    os.unlink(path)
    return config, rootfs


def test_the_image_runs_the_agent_and_carries_no_compiler(image):
    config, rootfs = image
    run = config["config"]
    assert run["Entrypoint"] == ["/opt/tracehound/bin/tracehound"]
    assert run["Cmd"] == ["run", "--listen", "127.0.0.1:9560"]
    labels = run["Labels"]
    commit = subprocess.run(["git", "-C", ROOT, "describe", "--always", "--dirty", "--abbrev=12"],
                            capture_output=True, text=True).stdout.strip()
    assert (labels["org.opencontainers.image.version"],
            labels["org.opencontainers.image.revision"]) == ("0.1.0", commit or "unknown")
    for tool in ("clang", "llc", "make", "gcc", "cc", "bpftool"):
        assert not any(os.path.lexists(rootfs / d / tool) for d in ("usr/bin", "bin", "usr/local/bin")), tool
    libbpf = list((rootfs / "usr/lib/x86_64-linux-gnu").glob("libbpf.so.1*"))
    assert libbpf, "libbpf1 is missing"


def test_an_agent_in_the_image_counts_exact_bytes(image, hook_mode, cgroup_root, cgroup, tmpfs):
    _config, rootfs = image
    script = "\n".join([
        "set -e",
        *(f"mount --rbind /{d} {rootfs}/{d}" for d in ("proc", "sys", "dev", "run")),
        f"mkdir -p {rootfs}{tmpfs}",
        f"mount --bind {tmpfs} {rootfs}{tmpfs}",
        'exec "$@"'])
    wrapper = ("unshare", "--mount", "--propagation", "private", "sh", "-c", script, "sh")
    agent = start_agent(hook_mode, wrapper=wrapper,
                        cmd=("chroot", str(rootfs), "/usr/bin/env", "-i", f"PATH={IMAGE_PATH}",
                             "/opt/tracehound/bin/tracehound"))
    try:
        path = os.path.join(tmpfs, f"image-{uuid.uuid4().hex[:8]}")
        size = 2 * 2**20 + 29
        # written inside the agent's container: its mounts, its root, the image's python3
        writer = ("import os, sys\n"
                  "fd = os.open(sys.argv[1], os.O_WRONLY | os.O_CREAT | os.O_TRUNC)\n"
                  "left = int(sys.argv[2])\n"
                  "while left:\n"
                  "    left -= os.write(fd, bytes(min(left, 65536)))\n")
        done = subprocess.run(
            ["nsenter", f"--mount=/proc/{agent.proc.pid}/ns/mnt",
             f"--root=/proc/{agent.proc.pid}/root", "/usr/bin/env", "-i", f"PATH={IMAGE_PATH}",
             "sh", "-c", 'echo $$ > "$0" && exec python3 -c "$1" "$2" "$3"',
             f"{cgroup_root}{cgroup}/cgroup.procs", writer, path, str(size)],
            capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        scraped = agent.scrape()
        assert series(scraped, "tracehound_io_write_bytes_total", cgroup=cgroup,
                      mountpoint=mount_of(tmpfs)) == size
        [build] = [dict(labels) for name, labels in scraped if name == "tracehound_build_info"]
        assert build["version"] == "0.1.0"
    finally:
        stop_agent(agent)
