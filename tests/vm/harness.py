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
dependencies are installed.
"""

from __future__ import annotations

import codecs
import dataclasses
import json
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
from typing import Callable, Iterable, Mapping, Optional, TextIO

from console_watch import ConsoleWatch      # tests/vm is on sys.path wherever harness is

__all__ = [
    "VmBootError",
    "VmSetupError",
    "VmResult",
    "cache_dir",
    "kernel_image",
    "run_in_vm",
    "run_scenarios",
    "Scenario",
    "guest_script",
    "checks_of",
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


def _read(path: Path) -> str:
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
        ]
        for d in rw:
            argv.append(f"--rwdir={d}={d}")
        argv += ["--exec", f"sh {shlex.quote(str(xdir / 'init.sh'))}"]
        return _boot(argv, xdir, timeout, stream)
    finally:
        if not keep_dir:
            shutil.rmtree(xdir, ignore_errors=True)


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
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True)
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
                                      _tail(_read(console)), _read(out_file))
                if now - start > timeout:
                    _kill(proc)
                    phase = "booting" if boot_seconds < 0 else "running the command"
                    raise VmBootError(
                        f"VM timed out after {timeout:.0f} s while {phase}",
                        _tail(_read(console)),
                        _read(out_file),
                    )
        except BaseException:
            _kill(proc)
            raise
    total = time.monotonic() - start
    tail = _tail(_read(console))
    rc_text = _read(xdir / "rc").strip()
    if not rc_text.lstrip("-").isdigit():
        phase = "never started the command" if boot_seconds < 0 else "died before the command finished"
        raise VmBootError(f"VM {phase} (vng exit status {proc.returncode})", tail, _read(out_file))
    return VmResult(
        returncode=int(rc_text),
        output=_read(out_file),
        console_tail=tail,
        boot_seconds=boot_seconds,
        total_seconds=total,
        kernel_release=_read(xdir / "release").strip(),
        cgroup2=_read(xdir / "cgroup2").strip(),
    )


def _kill(proc: subprocess.Popen) -> None:
    if proc.poll() is not None:
        return
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()


@dataclass(frozen=True)
class Scenario:
    """One guest program of the VM tier. Every scenario the selected tests need
    runs in a single boot (a boot under TCG costs ~30 s before the first
    Python import): ``command`` is a bash command run from the repository
    root, with ``{results}`` standing for the scenario's own writable results
    directory; ``timeout`` bounds it alone.

    The scenarios of one ``lane`` run one after another; the lanes run side
    by side, sharing the guest's one CPU (GUEST_CPUS). Scenarios that share
    a device or state of the guest's (the soft-RoCE device, the RDMA pin
    root's default instance) share a lane."""
    name: str
    command: str
    timeout: float
    # run on the host before the boot, with the results directory (e.g. to
    # build a program the guest runs); raising keeps the scenario out of it
    prepare: Optional[Callable[[Path], None]] = None
    lane: str = "rdma"


# what a boot costs before the first scenario starts, and after the last ends
BOOT_ALLOWANCE_S = 240
# One vCPU, one host thread: the host tiers run beside the VM on a 2-CPU
# machine, and a second vCPU made three busy threads on two CPUs; a guest
# vCPU descheduled by the host while the other waits on it (an IPI, a lock)
# made its I/O scenario take 3.5x its time on an idle host (1,270 s against
# 368 s). Two vCPUs under TCG also wedged the guest when one patched kernel
# text (a BPF program attached or detached) that the other was running.
GUEST_CPUS = 1
OOPS_NOTE = "first-boot-oops.txt"     # base/this: why the guest was booted a second time
_SCENARIO_STEP = """mkdir -p {results}
echo "=== scenario {name}"
s=$(date +%s)
( cd {repo} && timeout --kill-after=10 {timeout:.0f} bash -c {command} ) > {results}/output 2>&1 < /dev/null
echo $? > {results}/rc.tmp && mv {results}/rc.tmp {results}/rc
echo $(( $(date +%s) - s )) > {results}/seconds
echo "=== scenario {name}: exit $(cat {results}/rc), $(cat {results}/seconds) s"
"""


def run_scenarios(scenarios: Iterable[Scenario], base: Path) -> dict[str, VmResult | VmBootError]:
    """Boot once and run every scenario, each in base/NAME: one after another
    within a lane, the lanes side by side. Returns, per scenario,
    its own result (exit status and output) or, for one the boot never
    finished (crash, overall timeout), the boot's error."""
    repo = Path(__file__).resolve().parents[2]
    scenarios = list(scenarios)
    lanes: dict[str, list[str]] = {}
    budgets: dict[str, float] = {}
    for sc in scenarios:
        results = base / sc.name
        lanes.setdefault(sc.lane, []).append(_SCENARIO_STEP.format(
            results=shlex.quote(str(results)), name=sc.name, repo=shlex.quote(str(repo)),
            timeout=sc.timeout, command=shlex.quote(sc.command.format(results=shlex.quote(str(results))))))
        budgets[sc.lane] = budgets.get(sc.lane, 0) + sc.timeout + 15
    script = "".join(f"(\n{''.join(steps)}) &\n" for steps in lanes.values()) + "wait\n"
    budget = max(budgets.values(), default=0) + BOOT_ALLOWANCE_S
    boot_error = None
    for attempt in (1, 2):
        try:
            whole = run_in_vm(script, timeout=budget, cwd=repo, writable=[base], memory="3G",
                              cpus=GUEST_CPUS)
        except VmGuestOops as exc:
            whole, boot_error = None, exc
            if attempt == 1:        # once: said in the tier's budget line and here
                (base / OOPS_NOTE).write_text(str(exc))
                print(f"\nVM: {str(exc).splitlines()[0]}; booting again", flush=True)
                for sc in scenarios:
                    shutil.rmtree(base / sc.name, ignore_errors=True)
                    (base / sc.name).mkdir()
                    if sc.prepare:
                        sc.prepare(base / sc.name)
                continue
        except VmBootError as exc:
            whole, boot_error = None, exc
        break
    # what the boot says of all of them (after a crash: its console, no timings)
    shared = whole or VmResult(0, "", boot_error.console_tail, -1.0, -1.0, "", "")
    out: dict[str, VmResult | VmBootError] = {}
    for sc in scenarios:
        rc = _read(base / sc.name / "rc").strip()
        if not rc.lstrip("-").isdigit():
            out[sc.name] = boot_error or VmBootError(f"scenario {sc.name} left no exit status")
            continue
        out[sc.name] = dataclasses.replace(shared, returncode=int(rc),
                                           output=_read(base / sc.name / "output"))
    return out


def guest_script(script: str, *args: str, timeout: float, name: str = "",
                 prepare: Optional[Callable[[Path], None]] = None, lane: str = "rdma") -> Scenario:
    """A tests/vm/SCRIPT that writes checks.json into its results directory;
    ARGS may name ``{results}`` too."""
    extra = "".join(f" {a}" for a in args)
    return Scenario(name or script.removesuffix(".py"),
                    f"{shlex.quote(sys.executable)} tests/vm/{script} {{results}}{extra}", timeout,
                    prepare, lane)


def checks_of(result: VmResult, results: Path) -> tuple[VmResult, dict]:
    """A check scenario's result and the checks.json it wrote as it went
    (what it decided before a crash or a timeout still comes back)."""
    report = results / "checks.json"
    data = (json.loads(report.read_text()) if report.exists()
            else {"checks": {}, "timings": {}})
    print(f"\n{results.name}: timings {data['timings']}")
    return result, data


def assert_check(result: VmResult, data: dict, name: str) -> None:
    check = data["checks"].get(name)
    assert check is not None, f"check {name} never ran; guest output:\n{result.output[-6000:]}"
    assert check["ok"], f"{name}: {check['detail']}"


def assert_completed(result: VmResult, data: dict) -> None:
    """The guest scenario ran to its end (every check after that is its own test)."""
    assert result.returncode == 0, \
        f"guest scenario failed (exit {result.returncode}):\n{result.output[-6000:]}"
    assert "scenario_s" in data["timings"], result.output[-6000:]
