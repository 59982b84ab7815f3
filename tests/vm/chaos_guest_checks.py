"""The VM-only chaos experiments, run as root inside the VM (see test_vm_chaos.py).

    chaos_guest_checks.py RESULTS_DIR
    chaos_guest_checks.py verbs-loop memlock|objects DEVICE   (a workload, see below)

Sets up soft-RoCE and starts the agent as rdma_guest_checks.py does, then
runs examples/rdma-memlock.yaml, rdma-cgroup.yaml, rdma-link-down.yaml,
io-throttle.yaml, net-loss.yaml, net-delay.yaml and io-errors.yaml (in its
error and flakey modes) with `tracehound chaos run`, watching the kernel's
own state (/proc/PID/limits, rdma.max, `ip -j link`, io.max, `tc qdisc`,
`dmsetup table`) while each is in flight and after it. Every check is
written to RESULTS_DIR/checks.json as soon as it is decided.

A run killed with SIGKILL and `tracehound chaos recover` are the host's to
prove (tests/kernel/test_chaos_recover.py: rdma.link_down on a veth among
six faults, and an experiment's own rollbacks; test_chaos_kill_points.py: a
kill at every journal line): nothing in them needs this kernel or an RDMA
device.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import rdma_guest_kit as rg
from chaos_guest_run import HOST_MPL_CACHE, MPL_DIR, ChaosRun, judge, lifted_after
from explain_guest import JobWriter, explain_ranks_first, job_cgroup, remove_job_cgroup

VERBS_CGROUP = "/thchaos-rdma"
LINK_NETNS, PEER_NETNS, LINK_IF, LINK_RXE = "thchaos-rdma-a", "thchaos-rdma-b", "thrdma0", "rxe1"
DM_NAME, DM_MOUNT, DM_IMAGE = "thchaos-io", "/tmp/thchaos-io-mnt", "/tmp/thchaos-io.img"
IO_CGROUP = "/thchaos-io-errors"
IO_FLAKEY_CGROUP = "/thchaos-io-flakey"
THROTTLE_CGROUP = "/thchaos-io-throttle"
NET_NETNS, NET_IF = "thchaos-a", "thchaos0"
# the names the checks look at, given to the examples (whose own end with ${run})
NET_NAMES = {"CHAOS_NETNS": NET_NETNS, "CHAOS_PEER_NETNS": "thchaos-b",
             "CHAOS_INTERFACE": NET_IF, "CHAOS_PEER_INTERFACE": "thchaos1"}
LINK_NAMES = {"CHAOS_NETNS": LINK_NETNS, "CHAOS_PEER_NETNS": PEER_NETNS,
              "CHAOS_INTERFACE": LINK_IF, "CHAOS_PEER_INTERFACE": "thrdma1"}
MEMLOCK = 64 << 20
MR_SIZE = 1 << 20


def verbs_loop(mode: str, device: str) -> int:
    """Keep making verbs objects so a fault shows up as failed verbs. memlock:
    register and release a 1 MiB MR over and over; objects: open a context,
    a PD and a CQ and close them again, over and over."""
    import pyverbs.enums as e
    from pyverbs.cq import CQ
    from pyverbs.device import Context
    from pyverbs.mr import MR
    from pyverbs.pd import PD
    from pyverbs.pyverbs_error import PyverbsError

    ctx = Context(name=device) if mode == "memlock" else None
    pd = PD(ctx) if ctx else None
    ready = False
    while True:
        held = []
        try:
            if mode == "memlock":
                held.append(MR(pd, MR_SIZE, e.IBV_ACCESS_LOCAL_WRITE))
            else:
                held.append(Context(name=device))
                held.append(PD(held[0]))
                held.append(CQ(held[0], 4))
        except PyverbsError:
            pass
        for obj in reversed(held):
            obj.close()
        if not ready:
            print(f"READY {os.getpid()}", flush=True)
            ready = True
        time.sleep(0.1)


class Workload:
    """verbs_loop in a child, optionally in a cgroup and with CAP_IPC_LOCK
    dropped (root ignores RLIMIT_MEMLOCK otherwise)."""

    def __init__(self, mode: str, cgroup: str | None = None, wrap=()):
        argv = [*wrap, rg.PY, str(Path(__file__).resolve()), "verbs-loop", mode, rg.DEVICE]
        if cgroup:
            argv = ["sh", "-c", 'echo $$ > "$0" && exec "$@"', f"{rg.CG}{cgroup}/cgroup.procs",
                    *argv]
        self.proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     text=True)
        self.out = rg.Lines(self.proc.stdout)
        if self.out.wait_for("READY ", 120) is None:
            self.proc.kill()
            raise RuntimeError(f"verbs loop ({mode}) never got going:\n{self.out.text()}")
        self.pid = self.proc.pid

    def stop(self) -> None:
        self.proc.kill()
        self.proc.wait(timeout=30)


def memlock_limits(pid: int):
    for line in Path(f"/proc/{pid}/limits").read_text().splitlines():
        if line.startswith("Max locked memory"):
            return tuple(line.split()[3:5])
    return None


def memlock_experiment(c: rg.Checks, agent: rg.Agent) -> None:
    wrap = [*rg.NO_CAP_IPC_LOCK, "prlimit", f"--memlock={MEMLOCK}:{MEMLOCK}"]
    # the verbs loop is a rank of job 4243, which explain is then asked about
    app = Workload("memlock", cgroup=job_cgroup("4243"), wrap=wrap)
    try:
        before = memlock_limits(app.pid)
        run = ChaosRun("rdma-memlock.yaml", {"TRACEHOUND_METRICS_URL": agent.url,
                                              "CHAOS_TARGET": "verbs-loop memlock"},
                       lambda: memlock_limits(app.pid))
        judge(c, "memlock", run, before, ("4096", str(MEMLOCK)), memlock_limits(app.pid))
        event = next((d for d in run.record.get("detections") or []
                      if d.get("probe") == "tracehound-raises-error-burst"), {})
        c.record("memlock_event_detected", event.get("detected") is True
                 and (event.get("event") or {}).get("errno") == "ENOMEM",
                 f"detection {event}\n{run.context()}")
        explain_ranks_first(c, "memlock_explained", agent.url, "4243",
                            ("rdma_verb_errors", "rdma_app_verb_errors"), {"errno": "ENOMEM"})
        run.cleanup()
    finally:
        app.stop()
        remove_job_cgroup("4243")


def rdma_max() -> str | None:
    try:
        return Path(f"{rg.CG}{VERBS_CGROUP}/rdma.max").read_text().strip()
    except OSError:
        return None


def cgroup_experiment(c: rg.Checks, agent: rg.Agent) -> None:
    os.makedirs(f"{rg.CG}{VERBS_CGROUP}", exist_ok=True)
    app = Workload("objects", cgroup=VERBS_CGROUP)
    try:
        before = rdma_max()
        run = ChaosRun("rdma-cgroup.yaml", {"TRACEHOUND_METRICS_URL": agent.url,
                                             "CHAOS_CGROUP": VERBS_CGROUP,
                                             "CHAOS_RDMA_DEVICE": rg.DEVICE}, rdma_max)
        judge(c, "rdma_cgroup", run, before, f"{rg.DEVICE} hca_handle=1 hca_object=1",
              rdma_max())
        run.cleanup()
    finally:
        app.stop()


def link_state(netns: str = LINK_NETNS, ifname: str = LINK_IF) -> str | None:
    out = subprocess.run(["ip", "-n", netns, "-j", "link", "show", "dev", ifname],
                         capture_output=True, text=True, check=False)
    if out.returncode:
        return None
    flags = json.loads(out.stdout or "[{}]")[0].get("flags", [])
    return "UP" if "UP" in flags else "DOWN"


def attach_rxe_when_created() -> threading.Thread:
    """The example makes its own veth pair right before taking it down: put
    a soft-RoCE device on it the moment it exists, so that the link going
    down is an RDMA port going down."""
    def attach():
        if not rg.wait_until(lambda: os.path.exists(f"/run/netns/{LINK_NETNS}"), 120, 0.005):
            return
        subprocess.run(["nsenter", f"--net=/run/netns/{LINK_NETNS}", "sh", "-c",
                        f"for i in $(seq 600); do rdma link add {LINK_RXE} type rxe netdev "
                        f"{LINK_IF} 2>/dev/null && exit 0; done; exit 1"], check=False)
    t = threading.Thread(target=attach, daemon=True)
    t.start()
    return t


def link_world() -> tuple:
    """What the link-down example leaves behind: namespaces, the link, rxe1."""
    return (sorted(n for n in os.listdir("/run/netns") if n.startswith("thchaos"))
            if os.path.isdir("/run/netns") else [],
            link_state(), os.path.exists(f"/sys/class/infiniband/{LINK_RXE}"))


def link_down_experiment(c: rg.Checks, agent: rg.Agent) -> None:
    before = link_world()
    attacher = attach_rxe_when_created()
    errors_before = agent.value("tracehound_rdma_async_events_total", device=LINK_RXE,
                                event="PORT_ERR")
    run = ChaosRun("rdma-link-down.yaml", {"TRACEHOUND_METRICS_URL": agent.url, **LINK_NAMES},
                   link_state)
    attacher.join(timeout=30)
    port_errors = agent.value("tracehound_rdma_async_events_total", device=LINK_RXE,
                              event="PORT_ERR") - errors_before
    # the RDMA core unregisters rxe1 after its netdev is gone, asynchronously
    rg.wait_until(lambda: link_world() == before, rg.SETTLE_S, 0.2)
    run.seen.append(f"PORT_ERR on {LINK_RXE}: {port_errors}")
    judge(c, "link_down", run, before, "DOWN after UP", link_world(), applied_when=went_down)
    run.cleanup()


def went_down(seen: list) -> bool:
    """Down after having been up: a new veth starts down, then the example
    brings it up before the fault takes it down."""
    return "UP" in seen and "DOWN" in seen[seen.index("UP"):]


def make_dm_device() -> None:
    rg.sh("modprobe loop; modprobe dm-mod; modprobe dm-flakey; true")
    rg.sh(f"truncate -s 32M {DM_IMAGE}")
    loop = rg.sh(f"losetup -f --show {DM_IMAGE}").strip()
    rg.sh(f"dmsetup create {DM_NAME} --table '0 65536 linear {loop} 0'")
    rg.sh(f"mkfs.ext4 -q -O ^has_journal /dev/mapper/{DM_NAME}")
    os.makedirs(DM_MOUNT, exist_ok=True)
    rg.sh(f"mount -o errors=continue /dev/mapper/{DM_NAME} {DM_MOUNT}")


def dm_state() -> tuple:
    table = subprocess.run(["dmsetup", "table", DM_NAME], capture_output=True, text=True)
    status = subprocess.run(["dmsetup", "status", DM_NAME], capture_output=True, text=True)
    return table.stdout.strip(), status.stdout.strip()


def io_max() -> tuple:
    """(the throttled cgroup exists, its io.max or None). The rollback also
    takes back the io controller it enabled, and io.max goes with it."""
    path = f"/sys/fs/cgroup{THROTTLE_CGROUP}"
    try:
        with open(f"{path}/io.max") as f:
            return True, f.read().strip()
    except OSError:
        return os.path.isdir(path), None


def io_throttle_experiment(c: rg.Checks, agent: rg.Agent) -> None:
    """cgroup v2 io.max on a real block device (the host binds io to v1)."""
    if not os.path.exists(f"/dev/mapper/{DM_NAME}"):
        make_dm_device()
    limit = "wbps=1048576"
    run = ChaosRun("io-throttle.yaml", {"TRACEHOUND_METRICS_URL": agent.url,
                                         "CHAOS_CGROUP": THROTTLE_CGROUP,
                                         "CHAOS_DATA_DIR": DM_MOUNT}, io_max)
    d = run.detection()
    if d.get("mttd_seconds") is not None:
        c.timing("io_throttle_mttd_s", d["mttd_seconds"])
    c.record("io_throttle_detected", run.code == 0 and d.get("detected") is True
             and d.get("tracehound_signal") is True, f"detection {d}\n{run.context()}")
    applied = lambda state: bool(state[1]) and limit in state[1]  # noqa: E731
    c.record("io_throttle_fault_applied", any(applied(x) for x in run.seen),
             f"expected an io.max line with {limit}\n{run.context()}")
    # the limit went while the cgroup still existed (before the workload's removal)
    lifted = lifted_after(run.seen, applied, present=lambda state: state[0] and not state[1])
    c.record("io_throttle_rolled_back", lifted and io_max() == (False, None),
             f"(exists, io.max) states {run.seen}\n{run.context()}")
    run.cleanup()


def qdiscs() -> tuple | None:
    out = subprocess.run(["tc", "-n", NET_NETNS, "-j", "qdisc", "show", "dev",
                          NET_IF], capture_output=True, text=True)
    if out.returncode != 0:
        return None
    return tuple(sorted(q.get("kind", "") for q in json.loads(out.stdout or "[]")))


def netem_experiment(c: rg.Checks, agent: rg.Agent, key: str, example: str, probe: str,
                     env: dict | None = None) -> dict:
    """A netem fault (which the VM kernel has; the host has only the BPF
    classifier), judged by the ping probe's reading. Returns that detection."""
    rg.sh("modprobe sch_netem")
    run = ChaosRun(example, {"TRACEHOUND_METRICS_URL": agent.url, **NET_NAMES, **(env or {})},
                   qdiscs)
    ping = next((d for d in run.record.get("detections") or []
                 if d.get("probe") == probe), {})
    if ping.get("mttd_seconds") is not None:
        c.timing(f"{key}_mttd_s", ping["mttd_seconds"])
    faults = run.record.get("faults") or []
    c.record(f"{key}_detected", run.code == 0 and ping.get("detected") is True,
             f"detection {ping}\n{run.context()}")
    # and tracehound itself: the TCP job's retransmissions or round-trip time
    own = next((d for d in run.record.get("detections") or []
                if d.get("probe", "").startswith("tracehound-sees-")), {})
    if own.get("mttd_seconds") is not None:
        c.timing(f"{key}_tracehound_mttd_s", own["mttd_seconds"])
    c.record(f"{key}_tracehound_detected", own.get("detected") is True
             and own.get("tracehound_signal") is True and "/tracehound-chaos-tcp-job" in
             own.get("query", ""), f"detection {own}\n{run.context()}")
    applied = lambda state: bool(state) and "netem" in state  # noqa: E731
    c.record(f"{key}_fault_applied", any(applied(x) for x in run.seen)
             and "netem" in json.dumps(faults), f"qdiscs seen {run.seen}\n{run.context()}")
    c.record(f"{key}_rolled_back", lifted_after(run.seen, applied),
             f"qdiscs seen {run.seen}\n{run.context()}")
    run.cleanup()
    return ping


def netem_loss_experiment(c: rg.Checks, agent: rg.Agent) -> None:
    netem_experiment(c, agent, "netem_loss", "net-loss.yaml", "ping-sees-loss")


def netem_delay_experiment(c: rg.Checks, agent: rg.Agent) -> None:
    """100 ms on the way out: the round trip ping measures carries it once,
    and goes back to the emulated link's own after the rollback."""
    ping = netem_experiment(c, agent, "netem_delay", "net-delay.yaml", "ping-sees-delay",
                            {"CHAOS_DELAY_MS": "100"})
    if ping.get("value") is not None:
        c.timing("netem_delay_ping_rtt_ms", ping["value"])


def io_errors_run(agent: rg.Agent, cgroup: str, env: dict | None = None) -> tuple:
    """examples/io-errors.yaml on the VM's device-mapper disk: (table and
    status before, the run)."""
    if not os.path.exists(f"/dev/mapper/{DM_NAME}"):
        make_dm_device()
    before = dm_state()
    # the detection ends at the first failed write counted; its deadline is
    # one a starved guest meets (a flapping disk was once seen after 90 s)
    run = ChaosRun("io-errors.yaml", {"TRACEHOUND_METRICS_URL": agent.url,
                                       "CHAOS_DM_NAME": DM_NAME, "CHAOS_MOUNTPOINT": DM_MOUNT,
                                       "CHAOS_CGROUP": cgroup, "CHAOS_DETECT_TIMEOUT": "120",
                                       **(env or {})}, dm_state)
    return before, run


def io_errors_experiment(c: rg.Checks, agent: rg.Agent) -> None:
    if not os.path.exists(f"/dev/mapper/{DM_NAME}"):
        make_dm_device()
    # a rank of job 4244 checkpoints to the same disk: explain names its failed writes
    rank = JobWriter(job_cgroup("4244"), DM_MOUNT)
    try:
        before, run = io_errors_run(agent, IO_CGROUP)
        judge(c, "io_errors", run, before, ("0 65536 error", "0 65536 error"), dm_state())
        explain_ranks_first(c, "io_errors_explained", agent.url, "4244", "write_errors",
                            {"mountpoint": DM_MOUNT})
        run.cleanup()
    finally:
        rank.stop()
        remove_job_cgroup("4244")


def io_flakey_experiment(c: rg.Checks, agent: rg.Agent) -> None:
    """The same example with a flapping disk: one second up, one down."""
    before, run = io_errors_run(agent, IO_FLAKEY_CGROUP, {
        "CHAOS_IO_ERRORS_MODE": "flakey", "CHAOS_UP_SECONDS": "1", "CHAOS_DOWN_SECONDS": "1"})
    # the same device and offset, 1 s up, 1 s down (the kernel adds a feature count)
    flakey = before[0].replace(" linear ", " flakey ") + " 1 1 "
    judge(c, "io_flakey", run, before, flakey, dm_state(),
          applied_when=lambda seen: any(state[0].startswith(flakey) for state in seen))
    run.cleanup()


EXPERIMENTS = ("memlock_experiment", "cgroup_experiment", "link_down_experiment",
               "io_throttle_experiment", "netem_loss_experiment", "netem_delay_experiment",
               "io_errors_experiment", "io_flakey_experiment")


def main(results: Path, only: tuple = EXPERIMENTS) -> int:
    """Every experiment (the VM tier), or ONLY those (bench/explain/vm.py)."""
    c = rg.Checks(results)
    t0 = time.monotonic()
    if HOST_MPL_CACHE.is_dir():
        shutil.copytree(HOST_MPL_CACHE, MPL_DIR, dirs_exist_ok=True)
    os.makedirs(MPL_DIR, exist_ok=True)
    rg.setup_rxe()
    agent = rg.Agent()
    c.timing("agent_start_s", time.monotonic() - t0)
    try:
        for experiment in (globals()[name] for name in EXPERIMENTS if name in only):
            t = time.monotonic()
            try:
                experiment(c, agent)
            except Exception as exc:  # the others still run and report
                c.record(f"{experiment.__name__}_crashed", False, repr(exc))
            c.timing(f"{experiment.__name__}_s", time.monotonic() - t)
    finally:
        agent.stop()
    c.timing("scenario_s", time.monotonic() - t0)
    return 0


if __name__ == "__main__":
    if sys.argv[1] == "verbs-loop":
        sys.exit(verbs_loop(sys.argv[2], sys.argv[3]))
    # argv: RESULTS [NAME,NAME...] (the experiments to run; all by default)
    sys.exit(main(Path(sys.argv[1]), tuple(sys.argv[2].split(",")) if len(sys.argv) > 2
                  else EXPERIMENTS))
