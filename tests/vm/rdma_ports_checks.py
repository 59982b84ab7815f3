"""RDMA port counters and link flaps on a real soft-RoCE port, run as root
inside the VM (see test_vm_rdma_ports.py).

    rdma_ports_checks.py RESULTS_DIR

Sets up rxe0 on a veth pair, runs ibv_rc_pingpong over the loopback GID,
then compares what host.rdma_ports.PortReader and RdmaPortCollector report
with sysfs, and takes the netdev down and up twice under a PortWatcher. The
agent is not started: these classes are checked on their own.
"""
from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from prometheus_client import CollectorRegistry, generate_latest  # noqa: E402
from prometheus_client.parser import text_string_to_metric_families  # noqa: E402
from rdma_guest_kit import (DEVICE, NETDEV, Checks, link_local_ready, listening,  # noqa: E402
                            setup_rxe, sh, wait_until, SETTLE_S)

from tracehound.collectors.rdma_ports import RdmaPortCollector  # noqa: E402
from tracehound.detect.rdma_ports import PortWatcher  # noqa: E402
from tracehound.host.rdma_ports import NOT_COUNTERS, PortReader  # noqa: E402

PORT = Path(f"/sys/class/infiniband/{DEVICE}/ports/1")
ITERS, SIZE, PINGPONG_MTU = 200, 4096, 1024    # ibv_rc_pingpong's default path MTU is 1024
PINGPONG_TCP_PORT = 18515
PINGPONG = ["ibv_rc_pingpong", "-d", DEVICE, "-g", "0", "-n", str(ITERS), "-s", str(SIZE)]


def listing(path: Path):
    return sorted(os.listdir(path)) if path.is_dir() else None


def sysfs_hw_counters() -> dict[str, int]:
    """The plain way: open and read every file."""
    d = PORT / "hw_counters"
    return {f: int((d / f).read_text()) for f in os.listdir(d) if f not in NOT_COUNTERS}


def rxe_port(reader: PortReader):
    return next((p for p in reader.read().ports if (p.device, p.port) == (DEVICE, 1)), None)


def scrape(reader: PortReader) -> dict:
    registry = CollectorRegistry()
    registry.register(RdmaPortCollector(reader))
    text = generate_latest(registry).decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for fam in text_string_to_metric_families(text) for s in fam.samples}


def pingpong() -> tuple[bool, str]:
    wait_until(link_local_ready, SETTLE_S, 0.2)
    server = subprocess.Popen(PINGPONG, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    wait_until(lambda: listening(PINGPONG_TCP_PORT) or server.poll() is not None, 30)
    client = subprocess.run([*PINGPONG, "localhost"], capture_output=True, text=True, timeout=120)
    try:
        out, _ = server.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        server.kill()
        out, _ = server.communicate()
    ok = server.returncode == 0 and client.returncode == 0
    return ok, f"server rc {server.returncode}: {out}\nclient rc {client.returncode}: " \
               f"{client.stdout}{client.stderr}"


def counters_scenario(c: Checks, reader: PortReader) -> None:
    layout = {"port": listing(PORT), "counters": listing(PORT / "counters"),
              "hw_counters": listing(PORT / "hw_counters"),
              "device_hw_counters": listing(PORT.parent.parent / "hw_counters")}
    c.record("rxe_sysfs_layout", layout["hw_counters"] is not None, json.dumps(layout))
    before = rxe_port(reader)
    c.record("reader_sees_rxe_port",
             before is not None and (before.state_id, before.state, before.phys_state_id,
                                     before.phys_state, before.link_layer, before.netdev)
             == (4, "ACTIVE", 5, "LinkUp", "Ethernet", NETDEV) and "sent_pkts" in before.hw_counters,
             before)
    t0 = time.monotonic()
    ok, out = pingpong()
    c.timing("pingpong_s", time.monotonic() - t0)
    c.record("pingpong_ran", ok, out)
    # the kernel refreshes hw_counters at most once per lifespan (10 ms): the
    # reader and a plain sysfs read agree once both came from one refresh
    reads = []

    def both_read_alike():
        t0 = time.monotonic()
        after = rxe_port(reader)
        c.timing("reader_read_s", time.monotonic() - t0)
        reads[:] = [after, sysfs_hw_counters()]
        return after is not None and after.hw_counters == reads[1]

    wait_until(both_read_alike, SETTLE_S, 0.05)
    after, plain = reads
    c.record("reader_matches_sysfs", after is not None and after.hw_counters == plain
             and after.counters == {}, f"reader {after and after.hw_counters}\nsysfs {plain}")
    m = scrape(reader)
    exported = {dict(ls)["counter"]: v for (n, ls), v in m.items()
                if n == "tracehound_rdma_port_hw_counter_total" and dict(ls)["device"] == DEVICE}
    state = m.get(("tracehound_rdma_port_state_id", (("device", DEVICE), ("port", "1"))))
    c.record("collector_matches_sysfs", exported == plain and state == 4,
             f"exported {exported}\nsysfs {plain}\nstate_id {state}")
    # both ends are on rxe0, so every data packet is sent and received by it
    want = 2 * ITERS * math.ceil(SIZE / PINGPONG_MTU)
    grew = {k: after.hw_counters.get(k, 0) - before.hw_counters.get(k, 0)
            for k in ("sent_pkts", "rcvd_pkts", "rdma_sends", "rdma_recvs")} if after and before else {}
    c.record("packet_counters_grew", grew.get("sent_pkts", 0) >= want and grew.get("rcvd_pkts", 0) >= want,
             f"growth {grew}; at least {want} data packets expected")
    errors = reader.read_errors()
    c.record("no_read_errors", not any(errors.values()), errors)


def state_id(reader: PortReader):
    return scrape(reader).get(("tracehound_rdma_port_state_id", (("device", DEVICE), ("port", "1"))))


def watch_until(watcher: PortWatcher, fired: list, kind: str, count: int, timeout: float) -> float | None:
    """Run the watcher as the agent's schedule would until `count` events of
    `kind` were fired; seconds it took, or None."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        watcher.run_once(time.monotonic())
        if sum(k == kind for k, _ in fired) >= count:
            return time.monotonic() - t0
        time.sleep(0.2)
    return None


def flap_scenario(c: Checks, reader: PortReader) -> None:
    fired: list = []
    watcher = PortWatcher(reader, lambda kind, **detail: fired.append((kind, detail)))
    watcher.run_once(time.monotonic())
    for cycle in (1, 2):
        sh(f"ip link set {NETDEV} down")
        took = watch_until(watcher, fired, "link_flap", cycle, 10)
        down_state = state_id(reader)
        watch_until(watcher, fired, "link_flap", cycle + 1, 1.5)     # no second one while down
        flaps = [d for k, d in fired if k == "link_flap"]
        last = flaps[-1] if flaps else {}
        if cycle == 1:
            c.timing("link_flap_detected_s", took if took is not None else -1)
            c.record("link_flap_fired_once", len(flaps) == 1 and down_state == 1 and
                     {k: last.get(k) for k in ("device", "port", "netdev", "from_state", "to_state")}
                     == dict(device=DEVICE, port=1, netdev=NETDEV, from_state="ACTIVE", to_state="DOWN")
                     and last.get("link_downed_increase", 0) >= 1,
                     f"fired {fired}; state_id while down {down_state}")
        else:
            c.record("link_flap_fired_again", len(flaps) == 2, fired)
        sh(f"ip link set {NETDEV} up")
        back = watch_until(watcher, fired, "link_restored", cycle, 20)
        watch_until(watcher, fired, "link_restored", cycle + 1, 1.0)
        restores = [d for k, d in fired if k == "link_restored"]
        if cycle == 1:
            c.timing("link_restored_detected_s", back if back is not None else -1)
            c.record("link_restored_fired_once", len(restores) == 1 and state_id(reader) == 4 and
                     restores[0].get("to_state") == "ACTIVE" and restores[0].get("down_for_s", 0) > 0,
                     fired)
    c.record("flap_events_in_order", [k for k, _ in fired] ==
             ["link_flap", "link_restored", "link_flap", "link_restored"], fired)
    wait_until(lambda: "ACTIVE" in (PORT / "state").read_text(), 30)


def main(results: Path) -> int:
    c = Checks(results)
    t0 = time.monotonic()
    setup_rxe()
    c.timing("setup_s", time.monotonic() - t0)
    reader = PortReader()
    counters_scenario(c, reader)
    flap_scenario(c, reader)
    c.timing("scenario_s", time.monotonic() - t0)
    return 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1])))
