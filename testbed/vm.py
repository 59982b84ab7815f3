"""Boot a Debian 6.1 distribution kernel under virtme-ng and run a command in it.

The host kernel refuses fentry programs and lacks kprobes and RDMA; the Debian
kernel has all of them. virtme-ng boots it under QEMU with the host's root file
system shared read-only over 9p, so the guest sees the same binaries, Python
and checkout as the host. Prepare the host once with ``scripts/vm-setup``.

Results come back through a per-run exchange directory that is shared
read-write with the guest: the command's output, its exit code and a marker
file that tells when the guest has finished booting. The current directory is
shared read-write as well, so e.g. a junit xml written there by a test run in
the guest is on the host afterwards. Everything else the guest writes lands in
throw-away overlays or tmpfs.

Only the standard library is used, so this can run before the project's own
dependencies are installed. The VM tier's scenarios, run in one boot, are
tests/vm/scenarios.py's.
"""

from __future__ import annotations

import codecs
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Mapping, Optional, TextIO

from testbed.console_watch import ConsoleWatch

__all__ = [
    "VmBootError",
    "VmSetupError",
    "VmResult",
    "cache_dir",
    "kernel_image",
    "run_in_vm",
    "read_or_empty",
]

DEFAULT_CACHE = "/var/cache/tracehound/vm"
CONSOLE_TAIL_LINES = 60
# Host variables worth carrying into the guest; virtme-ng itself gives the
# guest a minimal PATH, which would hide pyenv/venv interpreters.
PASSTHROUGH_ENV = ("PATH", "HOME", "LANG", "LC_ALL", "PYTHONPATH", "VIRTUAL_ENV", "CI")
# virtme-ng rejects --rwdir paths with other characters.
_SAFE_PATH = re.compile(r"^[a-zA-Z0-9_+ /.-]+$")
SETUP_HINT = "run scripts/vm-setup (as root) first"


class VmSetupError(RuntimeError):
    """The host is not prepared to boot the test kernel."""


class VmBootError(RuntimeError):
    """The VM did not boot, crashed, or did not finish in time."""

    def __init__(self, message: str, console_tail: str = "", output: str = ""):
        details = message
        if output:
            details += "\n--- command output (tail) ---\n" + _tail(output, 40)
        details += "\n--- console tail ---\n" + (console_tail or "(empty)")
        super().__init__(details)
        self.console_tail = console_tail
        self.output = output


class VmGuestOops(VmBootError):
    """The guest kernel oopsed (console_watch.py): the boot was ended then."""


@dataclass
class VmResult:
    returncode: int
    output: str
    console_tail: str
    boot_seconds: float
    total_seconds: float
    kernel_release: str
    cgroup2: str

    @property
    def ok(self) -> bool:
        return self.returncode == 0


def cache_dir() -> Path:
    return Path(os.environ.get("TRACEHOUND_VM_CACHE", DEFAULT_CACHE))


def _version_key(path: Path) -> list:
    return [int(p) if p.isdigit() else p for p in re.split(r"(\d+)", path.name)]


def kernel_image() -> Path:
    """Path of the cached kernel image written by scripts/vm-setup."""
    override = os.environ.get("TRACEHOUND_VM_KERNEL_IMAGE")
    if override:
        candidates = [Path(override)]
    else:
        cache = cache_dir()
        candidates = []
        recorded = cache / "kernel-image"
        if recorded.is_file():
            candidates.append(Path(recorded.read_text().strip()))
        candidates += sorted(cache.glob("6.1.0-*-amd64/boot/vmlinuz-*"), key=_version_key, reverse=True)
    for image in candidates:
        if image.is_file():
            release = image.name.removeprefix("vmlinuz-")
            if not Path("/usr/lib/modules", release, "modules.dep").is_file():
                raise VmSetupError(f"kernel {image} found but /usr/lib/modules/{release} is missing; {SETUP_HINT}")
            return image
    raise VmSetupError(f"no cached 6.1 kernel image in {cache_dir()}; {SETUP_HINT}")


def _vng() -> str:
    found = shutil.which("vng") or shutil.which("vng", path=str(Path(sys.executable).parent))
    if not found:
        raise VmSetupError(f"virtme-ng (vng) is not installed; {SETUP_HINT}")
    if not shutil.which("qemu-system-x86_64"):
        raise VmSetupError(f"qemu-system-x86_64 is not installed; {SETUP_HINT}")
    return found


def is_available() -> Optional[str]:
    """None when a VM can be booted, else the reason why not."""
    try:
        kernel_image()
        _vng()
    except VmSetupError as exc:
        return str(exc)
    return None


# Runs as root inside the guest. virtme-ng mounts debugfs, tracefs and cgroup2
# (at /sys/fs/cgroup) itself but not bpffs; each mount is checked anyway so a
# virtme-ng upgrade that changes this fails loudly rather than mysteriously.
_GUEST_SCRIPT = """\
X={xdir}
uname -r > "$X/release"
: > "$X/started"
mnt() {{ mountpoint -q "$2" || {{ mkdir -p "$2" && mount -t "$1" "$1" "$2"; }} || echo "vm: cannot mount $1 on $2" >&2; }}
mnt bpf /sys/fs/bpf
mnt tracefs /sys/kernel/tracing
mnt debugfs /sys/kernel/debug
CG=$(awk '$3 == "cgroup2" {{ print $2; exit }}' /proc/mounts)
if [ -z "$CG" ]; then mnt cgroup2 /sys/fs/cgroup; CG=/sys/fs/cgroup; fi
echo "$CG" > "$X/cgroup2"
{env}
export TRACEHOUND_IN_VM=1 TRACEHOUND_VM_CGROUP2="$CG"
cd {cwd} || {{ echo 127 > "$X/rc"; exit 0; }}
bash "$X/command.sh" > "$X/output" 2>&1 < /dev/null
echo $? > "$X/rc"
"""


def _tail(text: str, lines: int = CONSOLE_TAIL_LINES) -> str:
    return "\n".join(text.splitlines()[-lines:])


def read_or_empty(path: Path) -> str:
    try:
        return path.read_text(errors="replace")
    except FileNotFoundError:
        return ""


def _check_safe(path: str) -> str:
    if not _SAFE_PATH.match(path):
        raise ValueError(f"virtme-ng cannot share {path!r}: only [a-zA-Z0-9_+ /.-] allowed")
    return path


def run_in_vm(
    command: str,
    timeout: float = 600,
    memory: str = "2G",
    cpus: int = 2,
    *,
    cwd: Optional[os.PathLike | str] = None,
    writable: Optional[Iterable[os.PathLike | str]] = None,
    env: Optional[Mapping[str, str]] = None,
    stream: Optional[TextIO] = None,
    keep_dir: bool = False,
) -> VmResult:
    """Boot the test kernel, run ``command`` with bash as root, and power off.

    ``cwd`` (default: the current directory) is where the command starts.
    ``writable`` lists host directories the guest may write to (default: cwd,
    unless cwd is ``/``); writes anywhere else vanish with the VM. ``env`` adds
    or overrides guest environment variables on top of the host's PATH, HOME,
    PYTHONPATH and VIRTUAL_ENV. ``stream``, if given, receives the command's
    output while it runs. A returned result always means the command ran to
    completion; boot failures, guest crashes and timeouts raise VmBootError.
    """
    image = kernel_image()
    vng = _vng()
    workdir = Path(cwd or os.getcwd()).resolve()
    if writable is None:
        writable = [] if str(workdir) == "/" else [workdir]
    rw = [_check_safe(str(Path(d).resolve())) for d in writable]

    xdir = Path(tempfile.mkdtemp(prefix="tracehound-vm-"))
    try:
        _check_safe(str(xdir))
        guest_env = {k: os.environ[k] for k in PASSTHROUGH_ENV if k in os.environ}
        guest_env.update(env or {})
        exports = "\n".join(f"export {k}={shlex.quote(v)}" for k, v in guest_env.items())
        (xdir / "command.sh").write_text(command + "\n")
        (xdir / "init.sh").write_text(
            _GUEST_SCRIPT.format(xdir=shlex.quote(str(xdir)), env=exports, cwd=shlex.quote(str(workdir)))
        )
        argv = [
            vng, "--run", str(image),
            "--disable-kvm",  # nested KVM hangs on these hosts; TCG is slow but works
            # Debian 12 only has qemu's old C virtiofsd, which fails to start;
            # virtme-ng would wait ~3 s for it on every boot before using 9p.
            "--force-9p",
            "--verbose",  # kernel console to stderr: the only clue when boot fails
            "--memory", memory, "--cpus", str(cpus),
            "--cwd", "/",
            f"--rwdir={xdir}={xdir}",
            # vng asks for `-cpu max`, which under TCG includes 5-level paging:
            # every guest page walk one level deeper. Without it the same
            # scenario ran about a fifth faster (cgroup_v1: 57-60 s against
            # 76-77 s a boot, on an idle 2-CPU host); nothing here needs la57.
            "--qemu-opts=-cpu max,la57=off",
        ]
        for d in rw:
            argv.append(f"--rwdir={d}={d}")
        argv += ["--exec", f"sh {shlex.quote(str(xdir / 'init.sh'))}"]
        return _boot(argv, xdir, timeout, stream)
    finally:
        if not keep_dir:
            shutil.rmtree(xdir, ignore_errors=True)


# The emulated guest's one vCPU runs at this nice value where the host lets
# it (root): beside the host tiers' twenty Slurm health programs every 4 s,
# a guest at the host's priority was starved until its agents missed 5 s
# probes and 15 s readings. What the guest measures is wall-clock bound; the
# host's tests wait on conditions.
GUEST_NICE = -5


def _before_host_tests() -> None:
    try:
        os.setpriority(os.PRIO_PROCESS, 0, GUEST_NICE)
    except PermissionError:
        pass


def _boot(argv: list[str], xdir: Path, timeout: float, stream: Optional[TextIO]) -> VmResult:
    console = xdir / "console.log"
    out_file = xdir / "output"
    start = time.monotonic()
    boot_seconds = -1.0
    streamed = 0
    decoder = codecs.getincrementaldecoder("utf-8")("replace")
    watch = ConsoleWatch(console)
    with open(console, "wb") as log:
        # A new session lets a timeout kill vng and its qemu child together.
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                                start_new_session=True, preexec_fn=_before_host_tests)
        try:
            while True:
                try:
                    proc.wait(timeout=0.25)
                    finished = True
                except subprocess.TimeoutExpired:
                    finished = False
                now = time.monotonic()
                if boot_seconds < 0 and (xdir / "started").exists():
                    boot_seconds = now - start
                if stream is not None and out_file.exists():
                    with open(out_file, "rb") as f:
                        f.seek(streamed)
                        data = f.read()
                    streamed += len(data)
                    chunk = decoder.decode(data, final=finished)
                    if chunk:
                        stream.write(chunk)
                        stream.flush()
                if finished:
                    break
                oops = watch.oops()
                if oops:
                    _kill(proc)
                    raise VmGuestOops(f"the guest kernel oopsed after {now - start:.0f} s: {oops}",
                                      _tail(read_or_empty(console)), read_or_empty(out_file))
                if now - start > timeout:
                    _kill(proc)
                    phase = "booting" if boot_seconds < 0 else "running the command"
                    raise VmBootError(
                        f"VM timed out after {timeout:.0f} s while {phase}",
                        _tail(read_or_empty(console)),
                        read_or_empty(out_file),
                    )
        except BaseException:
            _kill(proc)
            raise
    total = time.monotonic() - start
    tail = _tail(read_or_empty(console))
    rc_text = read_or_empty(xdir / "rc").strip()
    if not rc_text.lstrip("-").isdigit():
        phase = "never started the command" if boot_seconds < 0 else "died before the command finished"
        raise VmBootError(f"VM {phase} (vng exit status {proc.returncode})", tail, read_or_empty(out_file))
    return VmResult(
        returncode=int(rc_text),
        output=read_or_empty(out_file),
        console_tail=tail,
        boot_seconds=boot_seconds,
        total_seconds=total,
        kernel_release=read_or_empty(xdir / "release").strip(),
        cgroup2=read_or_empty(xdir / "cgroup2").strip(),
    )


def _kill(proc: subprocess.Popen) -> None:
    if proc.poll() is not None:
        return
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()
