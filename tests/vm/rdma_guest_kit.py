"""What the RDMA guest programs share, run as root inside the VM: where things
are, soft-RoCE on a veth pair, the agent and the verbs program as processes
to drive, and the kernel's and the agent's counts to compare. The scenarios
are rdma_guest_checks.py's (and the app, port, chaos and explain programs')."""
from __future__ import annotations

import json
import math
import os
import queue
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from tracehound import defaults
from tracehound.host import rdma as kernel_view

sys.path.insert(0, str(Path(__file__).resolve().parent))
from guest_checks import Checks  # noqa: E402,F401  (the guest programs take it from here)

HERE = Path(__file__).resolve().parent
APP = HERE / "rdma_verbs_app.py"
PY = sys.executable
CG = os.environ.get("TRACEHOUND_VM_CGROUP2", "/sys/fs/cgroup")
DEVICE, NETDEV, PEER = "rxe0", "thveth0", "thveth1"
GRACE_S = 2.0
# the RDMA detector's turn (the agent's default) and how often, among its
# turns, it compares the mirror with the kernel's own view
DETECT_INTERVAL_S = defaults.RDMA_DETECT_INTERVAL_S
KERNEL_CHECK_S = 5.0
TYPES = ("ctx", "pd", "cq", "mr", "srq", "qp")
STEP_OP = {"ctx": "create_ctx", "pd": "alloc_pd", "cq": "create_cq", "mr": "reg_mr",
           "srq": "create_srq", "qp": "create_qp"}
NO_CAP_IPC_LOCK = ["setpriv", "--inh-caps=-ipc_lock", "--bounding-set=-ipc_lock"]


def sh(cmd: str) -> str:
    out = subprocess.run(cmd, shell=True, capture_output=True, text=True, check=False)
    if out.returncode:
        raise RuntimeError(f"{cmd}: exit {out.returncode}: {out.stderr.strip()}")
    return out.stdout


# How long a guest check waits for a condition it expects to come (the
# agent catching up with the kernel, a link coming up): a deadline a
# starved emulated guest beside a loaded host still meets (10 s did not).
# A condition that holds ends the wait at once.
SETTLE_S = 60.0
AGENT_START_S = 480.0


def wait_until(fn, timeout: float, interval: float = 0.1):
    deadline = time.monotonic() + timeout
    while True:
        value = fn()
        if value or time.monotonic() > deadline:
            return value
        time.sleep(interval)


class Lines:
    """A child's output lines, collected by a thread so pipes never fill."""

    def __init__(self, stream):
        self.lines: list[str] = []
        self.queue: queue.Queue = queue.Queue()
        self.closed = threading.Event()
        threading.Thread(target=self._read, args=(stream,), daemon=True).start()

    def _read(self, stream):
        for line in stream:
            self.lines.append(line)
            self.queue.put(line)
        self.queue.put(None)
        self.closed.set()

    def wait_for(self, prefix: str, timeout: float) -> str | None:
        deadline = time.monotonic() + timeout
        while (left := deadline - time.monotonic()) > 0:
            try:
                line = self.queue.get(timeout=left)
            except queue.Empty:
                return None
            if line is None:
                return None
            if line.startswith(prefix):
                return line
        return None

    def text(self) -> str:
        return "".join(self.lines)


class Agent:
    def __init__(self, *extra: str):
        self.proc = subprocess.Popen(
            [PY, "-m", "tracehound", "run", "--listen", "127.0.0.1:0",
             "--rdma-grace", str(GRACE_S), *extra],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        self.out = Lines(self.proc.stdout)
        # 100-250 s in an emulated guest beside the host tiers (the RDMA
        # probe's fentry programs and its libibverbs scan): a deadline, not
        # a wait, as the I/O tier's agents have
        line = self.out.wait_for("tracehound: serving metrics on ", AGENT_START_S)
        if line is None:
            # and none left behind holding the instance's lock for the next
            self.proc.kill()
            self.proc.wait()
            raise RuntimeError(f"agent did not start within {AGENT_START_S:g} s:\n"
                               + self.out.text())
        self.url = line.split()[-1]
        # probes are reported once the probe-info collector answers for rdma
        wait_until(lambda: "rdma" in self.out.text() and self.scrape_ok(), 120, 0.5)

    def scrape_ok(self) -> bool:
        try:
            return any(n == "tracehound_probe_info" for (n, _) in self.metrics())
        except OSError:
            return False

    def metrics(self) -> dict:
        with urllib.request.urlopen(self.url, timeout=20) as r:
            text = r.read().decode()
        return {(s.name, frozenset(s.labels.items())): s.value
                for fam in text_string_to_metric_families(text) for s in fam.samples}

    def value(self, name: str, **labels) -> float:
        want = set(labels.items())
        return sum(v for (n, ls), v in self.metrics().items() if n == name and want <= set(ls))

    def by_label(self, name: str, label: str, **labels) -> dict[str, float]:
        want, out = set(labels.items()), {}
        for (n, ls), v in self.metrics().items():
            if n == name and want <= set(ls):
                key = dict(ls)[label]
                out[key] = out.get(key, 0) + v
        return out

    def detector_turns(self, seconds: float, detector: str = "rdma", timeout: float = 180) -> bool:
        """Wait until the agent's detector has taken, from now on, enough turns
        to span `seconds` of its schedule (turns come at most one interval
        apart), so a rule allowed to fire only after a grace period has
        looked past it. Under TCG the detector thread can lag any clock, so
        its turns are counted rather than the seconds slept."""
        turns = math.ceil(seconds / DETECT_INTERVAL_S) + 2
        start = self.value("tracehound_detector_runs_total", detector=detector)
        return bool(wait_until(lambda: self.value("tracehound_detector_runs_total",
                                                  detector=detector) >= start + turns,
                               timeout, 0.2))

    def stop(self) -> int:
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return -9


class App:
    """rdma_verbs_app.py started inside a cgroup (before it creates anything)."""

    def __init__(self, cgroup: str, *args: str, wrap=()):
        procs = f"{CG}{cgroup}/cgroup.procs"
        self.proc = subprocess.Popen(
            ["sh", "-c", 'echo $$ > "$0" && exec "$@"', procs, *wrap, PY, str(APP), *args],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        self.out = Lines(self.proc.stdout)
        line = self.out.wait_for("RESULT ", 180)
        if line is None:
            self.proc.kill()
            raise RuntimeError("verbs app gave no result:\n" + self.out.text())
        self.result = json.loads(line[len("RESULT "):])
        self.pid = self.result["pid"]

    def exit(self) -> None:
        self.proc.stdin.write("\n")
        self.proc.stdin.flush()
        self.proc.wait(timeout=60)

    def kill(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=60)


def kernel_modes(agent: Agent) -> dict[str, str]:
    """Hook mode of each kernel-side RDMA probe (rdma.app is the uprobes)."""
    return {ln.split()[2]: ln.split()[4] for ln in agent.out.lines
            if ln.startswith("tracehound: probe rdma.") and ln.split()[2] != "rdma.app"}


def kernel_counts(pid: int) -> dict[str, int]:
    out: dict[str, int] = {}
    for o in kernel_view.objects(pid=pid):
        out[o.type] = out.get(o.type, 0) + 1
    return out


def mirror_counts(agent: Agent, cgroup: str) -> dict[str, int]:
    return {t: int(n) for t, n in agent.by_label("tracehound_rdma_objects", "type",
                                                 cgroup=cgroup).items() if n}


def totals_agree(agent: Agent):
    """Mirror vs `rdma resource show` for every (device, type); the diff or {}"""
    names = kernel_view.devices()
    kernel = {(names.get(d, str(d)), t): n for (d, t), n in kernel_view.summary().items() if n}
    mirror = {}
    for (n, ls), v in agent.metrics().items():
        if n == "tracehound_rdma_objects" and v:
            ls = dict(ls)
            key = (ls["device"], ls["type"])
            mirror[key] = mirror.get(key, 0) + int(v)
    return {k: (mirror.get(k, 0), kernel.get(k, 0))
            for k in set(kernel) | set(mirror) if mirror.get(k, 0) != kernel.get(k, 0)}


def listening(port: int) -> bool:
    """Whether a TCP socket listens on `port`, without connecting to it (the
    pingpong server accepts exactly one connection)."""
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            local, state = line.split()[1], line.split()[3]
            if state == "0A" and int(local.rsplit(":", 1)[1], 16) == port:
                return True
    return False


def link_local_ready() -> bool:
    """The default GID is the netdev's link-local address: while that is
    tentative (duplicate address detection), connecting a QP to it fails."""
    out = sh(f"ip -6 addr show dev {NETDEV} scope link")
    return "inet6" in out and "tentative" not in out


def setup_rxe() -> None:
    """A fresh soft-RoCE device: the scenarios of one boot each start from
    their own (an earlier one's device and links are removed first)."""
    sh("modprobe rdma_rxe && modprobe ib_uverbs")
    sh(f"rdma link delete {DEVICE} 2>/dev/null; ip link delete {NETDEV} 2>/dev/null; true")
    sh(f"ip link add {NETDEV} type veth peer name {PEER}")
    sh(f"ip link set {NETDEV} up && ip link set {PEER} up")
    sh(f"rdma link add {DEVICE} type rxe netdev {NETDEV}")
    port = f"/sys/class/infiniband/{DEVICE}/ports/1/state"
    if not wait_until(lambda: "ACTIVE" in Path(port).read_text(), 30):
        raise RuntimeError(f"{DEVICE} port never became ACTIVE: {Path(port).read_text()}")
    sh(f"echo +rdma > {CG}/cgroup.subtree_control")
    for d in ("rdmatest", "rdmatest/app", "rdmatest/limited"):
        os.makedirs(f"{CG}/{d}", exist_ok=True)
        if d == "rdmatest":
            sh(f"echo +rdma > {CG}/{d}/cgroup.subtree_control")
    Path(f"{CG}/rdmatest/limited/rdma.max").write_text(f"{DEVICE} hca_handle=1 hca_object=1\n")


def anomaly_events(agent: Agent, kind: str, **fields) -> list[dict]:
    """The agent's JSON event lines of this kind (after the log prefix)."""
    out = []
    for line in list(agent.out.lines):
        if '"rdma_anomaly"' in line and "{" in line:
            event = json.loads(line[line.index("{"):])
            if event["kind"] == kind and all(event.get(k) == v for k, v in fields.items()):
                out.append(event)
    return out
