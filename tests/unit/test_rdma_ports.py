"""RDMA port counters: the sysfs reader on fake trees (odd values, vanishing
directories, huge and non-UTF-8 files), the metric families, and the
link-flap rule's transitions."""
import os
import shutil
import time

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from tracehound.collectors.rdma_ports import RdmaPortCollector
from tracehound.detect.rdma_ports import PortWatcher
from tracehound.host import rdma_ports as rp

PMA = {"symbol_error": 3, "link_downed": 1, "port_rcv_errors": 0, "port_xmit_data": 1000,
       "port_rcv_data": 250, "port_xmit_wait": 17}
RXE_HW = {"sent_pkts": 2000, "rcvd_pkts": 2000, "out_of_seq_request": 0, "rcvd_rnr_err": 0,
          "retry_exceeded_err": 0, "link_downed": 0}


def write(path, data):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data if isinstance(data, bytes) else f"{data}\n".encode())


def add_port(root, dev, port=1, state="4: ACTIVE", phys="5: LinkUp", rate="100 Gb/sec (4X EDR)",
             link_layer="InfiniBand", counters=None, hw=None, netdev=None):
    """A port under devices/<dev>, linked from root/<dev> as sysfs does."""
    devdir = root.parent / "devices" / dev
    link = root / dev
    if not link.is_symlink():
        root.mkdir(parents=True, exist_ok=True)
        devdir.mkdir(parents=True, exist_ok=True)
        link.symlink_to(devdir)
    p = devdir / "ports" / str(port)
    for name, value in (("state", state), ("phys_state", phys), ("rate", rate),
                        ("link_layer", link_layer)):
        if value is not None:
            write(p / name, value)
    for sub, values in (("counters", counters), ("hw_counters", hw)):
        for name, value in (values or {}).items():
            write(p / sub / name, value)
    if netdev is not None:
        write(p / "gid_attrs" / "ndevs" / "0", netdev)
    return p


@pytest.fixture
def root(tmp_path):
    return tmp_path / "class" / "infiniband"


def node(root):
    add_port(root, "mlx5_0", 1, counters=PMA, hw={"out_of_sequence": 5, "rnr_nak_retry_err": 2})
    add_port(root, "mlx5_0", 2, state="1: DOWN", phys="3: Disabled", counters=PMA)
    write(root.parent / "devices" / "mlx5_0" / "hw_counters" / "fatal_errors", 0)
    add_port(root, "rxe0", 1, rate="10 Gb/sec (1X FDR10)", link_layer="Ethernet",
             hw={**RXE_HW, "lifespan": 12}, netdev="thveth0")


def by_key(snap):
    return {(p.device, p.port): p for p in snap.ports}


# --- reader ------------------------------------------------------------------

def test_reads_state_rate_counters_and_hw_counters_of_every_port(root):
    node(root)
    reader = rp.PortReader(str(root))
    snap = reader.read()
    ports = by_key(snap)
    assert sorted(ports) == [("mlx5_0", 1), ("mlx5_0", 2), ("rxe0", 1)]
    ib, down, rxe = ports[("mlx5_0", 1)], ports[("mlx5_0", 2)], ports[("rxe0", 1)]
    assert (ib.state_id, ib.state, ib.phys_state_id, ib.phys_state) == (4, "ACTIVE", 5, "LinkUp")
    assert ib.up and not down.up and (down.state, down.phys_state) == ("DOWN", "Disabled")
    assert ib.counters == PMA and ib.hw_counters == {"out_of_sequence": 5, "rnr_nak_retry_err": 2}
    assert (ib.link_layer, ib.rate, ib.netdev) == ("InfiniBand", "100 Gb/sec (4X EDR)", "")
    # lifespan is the kernel's cache setting, not a counter
    assert rxe.hw_counters == RXE_HW and rxe.counters == {}
    assert (rxe.netdev, rxe.link_layer) == ("thveth0", "Ethernet")
    assert snap.device_hw_counters == {"mlx5_0": {"fatal_errors": 0}}
    assert reader.read_errors() == dict.fromkeys(rp.READ_ERROR_REASONS, 0)


def test_a_host_without_rdma_reads_as_empty(tmp_path):
    reader = rp.PortReader(str(tmp_path / "absent"))
    assert reader.read().ports == [] and sum(reader.read_errors().values()) == 0


@pytest.mark.parametrize("raw", [b"abc\n", b"-1\n", b"1.5\n", b"", b"\n", b"0x10\n", "²\n".encode(),
                                 "١٢\n".encode(), b"\xff\xfe\n", b"1" * 21, b"12 34\n", b"+5\n"])
def test_a_value_that_is_not_an_unsigned_integer_is_skipped_and_counted(root, raw):
    p = add_port(root, "mlx5_0", counters={"symbol_error": 7})
    write(p / "counters" / "port_rcv_errors", raw)
    reader = rp.PortReader(str(root))
    assert reader.read().ports[0].counters == {"symbol_error": 7}
    assert reader.read_errors()["malformed"] == 1


def test_the_largest_64_bit_value_and_whitespace_are_fine(root):
    add_port(root, "mlx5_0", counters={"port_xmit_data": f" {2**64 - 1} \n"})
    assert rp.PortReader(str(root)).read().ports[0].counters == {"port_xmit_data": 2**64 - 1}


def test_a_huge_file_is_skipped_without_reading_it_whole(root):
    p = add_port(root, "mlx5_0", counters={"symbol_error": 1})
    write(p / "counters" / "port_rcv_errors", b"1" * (4 << 20))
    write(p / "rate", b"x" * (1 << 20))
    reader = rp.PortReader(str(root))
    port = reader.read().ports[0]
    assert port.counters == {"symbol_error": 1} and port.rate == ""
    assert reader.read_errors()["too_large"] == 2


def test_odd_names_and_non_utf8_contents_are_skipped(root):
    p = add_port(root, "mlx5_0", state=b"4: ACT\xffIVE\n", phys=b"5 LinkUp\n", link_layer=b"\xc3\x28\n",
                 counters={"symbol_error": 2}, netdev=b"eth\x00x\n")
    os.close(os.open(os.fsencode(p / "counters") + b"/bad\xff", os.O_CREAT | os.O_WRONLY))
    write(p / "counters" / "has space", 1)
    (root / "dev\udcff").symlink_to(p.parent.parent)       # a non-UTF-8 device name
    write(p.parent / "x1", b"")                             # a port that is not a number
    reader = rp.PortReader(str(root))
    port = by_key(reader.read())[("mlx5_0", 1)]
    assert (port.state, port.state_id, port.phys_state, port.link_layer, port.netdev) == \
        ("", None, "", "", "")
    assert port.counters == {"symbol_error": 2}
    errors = reader.read_errors()
    assert errors["bad_name"] == 4 and errors["malformed"] == 2


def test_a_fifo_or_a_directory_where_a_value_belongs_neither_hangs_nor_raises(root):
    p = add_port(root, "mlx5_0", state=None, counters={"symbol_error": 4})
    (p / "state").mkdir()
    os.mkfifo(p / "counters" / "port_rcv_errors")
    reader = rp.PortReader(str(root))
    port = reader.read().ports[0]
    assert port.state == "" and port.counters == {"symbol_error": 4}
    errors = reader.read_errors()
    assert errors["unreadable"] == 1 and errors["malformed"] == 1


def test_a_device_or_port_that_vanishes_mid_read_is_skipped(root, monkeypatch):
    add_port(root, "mlx5_0", counters=PMA)
    add_port(root, "mlx5_1", counters=PMA)
    add_port(root, "mlx5_1", 2, counters=PMA)
    (root / "mlx5_9").symlink_to(root.parent / "devices" / "gone")    # listed, never there
    real_port = rp._Pass.port

    def port_then_unplug(walk, device, name, ports_fd, full):
        if device == "mlx5_1":      # the whole device goes while its first port is read
            shutil.rmtree(root.parent / "devices" / "mlx5_1", ignore_errors=True)
        return real_port(walk, device, name, ports_fd, full)

    monkeypatch.setattr(rp._Pass, "port", port_then_unplug)
    reader = rp.PortReader(str(root))
    assert sorted(by_key(reader.read())) == [("mlx5_0", 1)]
    assert reader.read_errors()["vanished"] == 3


def test_the_light_read_takes_only_state_netdev_and_link_downed(root):
    add_port(root, "mlx5_0", counters=PMA, hw={"link_downed": 4, "rnr_nak_retry_err": 2}, netdev="ib0x")
    port = rp.PortReader(str(root)).read(full=False).ports[0]
    assert port.counters == {"link_downed": 1} and port.hw_counters == {"link_downed": 4}
    assert (port.state, port.phys_state, port.netdev, port.rate) == ("ACTIVE", "LinkUp", "ib0x", "")


def test_read_errors_accumulate_across_reads(root):
    add_port(root, "mlx5_0", counters={"symbol_error": "bad"})
    reader = rp.PortReader(str(root))
    for _ in range(3):
        reader.read()
    assert reader.read_errors()["malformed"] == 3


def test_parsers():
    assert rp.parse_state(b"5: ACTIVE_DEFER\n") == (5, "ACTIVE_DEFER")
    assert rp.parse_state(b"7: Phy Test\n") == (7, "Phy Test")
    assert rp.parse_state(b"ACTIVE") is None and rp.parse_state(b"4:") is None
    assert rp.rate_bytes_per_second("2.5 Gb/sec (1X SDR)") == 2.5e9 / 8
    assert rp.rate_bytes_per_second("400 Gb/sec (4X NDR)") == 50e9
    assert rp.rate_bytes_per_second("fast") is None and rp.rate_bytes_per_second("x Gb/sec") is None


def test_a_node_with_8_hcas_of_60_counters_reads_in_milliseconds(root):
    for i in range(8):
        add_port(root, f"mlx5_{i}", counters={f"pma_{n}": n for n in range(40)},
                 hw={f"hw_{n}": n for n in range(20)})
    reader = rp.PortReader(str(root))
    best = min(_timed(reader.read) for _ in range(5))
    assert sum(len(p.counters) + len(p.hw_counters) for p in reader.read().ports) == 480
    assert best < 0.05, f"{best * 1000:.1f} ms"


def _timed(fn):
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


# --- collector ---------------------------------------------------------------

def scrape(reader):
    registry = CollectorRegistry()
    registry.register(RdmaPortCollector(reader))
    text = generate_latest(registry).decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for fam in text_string_to_metric_families(text) for s in fam.samples}


def test_the_collector_exports_counters_states_and_read_errors(root):
    node(root)
    write(root.parent / "devices" / "rxe0" / "ports" / "1" / "hw_counters" / "send_err", b"?\n")
    m = scrape(rp.PortReader(str(root)))
    pfx = "tracehound_rdma_port_"
    want = [  # (family, labels in sorted order, value)
        ("counter_total", ("symbol_error", "mlx5_0", "1"), 3),
        ("counter_total", ("port_xmit_data", "mlx5_0", "2"), 1000),
        ("data_bytes_total", ("mlx5_0", "transmit", "1"), 4000),   # 4-octet words x4
        ("data_bytes_total", ("mlx5_0", "receive", "1"), 1000),
        ("hw_counter_total", ("sent_pkts", "rxe0", "1"), 2000),
        ("hw_counter_total", ("fatal_errors", "mlx5_0", ""), 0),   # device-wide
        ("state_id", ("mlx5_0", "1"), 4),
        ("state_id", ("mlx5_0", "2"), 1),
        ("physical_state_id", ("mlx5_0", "2"), 3),
        ("rate_bytes_per_second", ("rxe0", "1"), 1.25e9),
        ("info", ("rxe0", "Ethernet", "thveth0", "1"), 1),
        ("read_errors_total", ("malformed",), 1),
        ("read_errors_total", ("vanished",), 0),
    ]
    got = {(n.removeprefix(pfx), tuple(v for _, v in ls)): value for (n, ls), value in m.items()}
    assert [got.get((fam, labels)) for fam, labels, _ in want] == [v for _, _, v in want]
    assert not any(n.endswith("_total") and dict(ls).get("counter") == "lifespan" for n, ls in m)
    assert not any(dict(ls).get("counter") == "send_err" for n, ls in m)


def test_a_port_with_an_unreadable_state_has_no_state_series(root):
    add_port(root, "mlx5_0", state="garbage", counters={"symbol_error": 1})
    m = scrape(rp.PortReader(str(root)))
    assert not [k for k in m if k[0] == "tracehound_rdma_port_state_id"]
    assert m[("tracehound_rdma_port_physical_state_id", (("device", "mlx5_0"), ("port", "1")))] == 5


def test_the_collector_of_a_host_without_rdma_has_only_zero_read_errors(tmp_path):
    m = scrape(rp.PortReader(str(tmp_path / "none")))
    assert {n for n, _ in m} == {"tracehound_rdma_port_read_errors_total"}
    assert set(m.values()) == {0}


# --- link-flap rule ----------------------------------------------------------

class Scripted:
    """A reader whose ports the test sets between reads."""

    def __init__(self):
        self.ports = {}
        self.fulls = []

    def set(self, state="ACTIVE", downed=None, hw_downed=None, device="mlx5_0", port=1,
            netdev="", phys=None):
        counters = {} if downed is None else {"link_downed": downed}
        hw = {} if hw_downed is None else {"link_downed": hw_downed}
        phys = phys or ("LinkUp" if state == "ACTIVE" else "Disabled")
        self.ports[(device, port)] = rp.PortSample(device, port, state=state, phys_state=phys,
                                                   netdev=netdev, counters=counters, hw_counters=hw)

    def drop(self, device="mlx5_0", port=1):
        del self.ports[(device, port)]

    def read(self, full=True):
        self.fulls.append(full)
        return rp.PortsSnapshot(ports=list(self.ports.values()))


def watcher(**kw):
    reader, fired = Scripted(), []
    w = PortWatcher(reader, lambda kind, **detail: fired.append((kind, detail)), **kw)
    return reader, w, fired


def test_a_port_leaving_active_is_one_flap_and_coming_back_one_restore():
    reader, w, fired = watcher()
    reader.set("ACTIVE", downed=5, netdev="")
    w.run_once(1.0)
    assert fired == [] and reader.fulls == [False]       # baseline; the light read
    reader.set("DOWN", downed=6)
    w.run_once(2.0)
    assert fired == [("link_flap", dict(device="mlx5_0", port=1, netdev="", from_state="ACTIVE",
                                        to_state="DOWN", phys_state="Disabled",
                                        link_downed_increase=1))]
    for t, (state, downed) in enumerate([("DOWN", 6), ("DOWN", 8), ("INIT", 8), ("ARMED", 9)]):
        reader.set(state, downed=downed, phys="LinkUp")
        w.run_once(3.0 + t)
    assert len(fired) == 1                               # still down: no repeat
    reader.set("ACTIVE", downed=9)
    w.run_once(7.5)
    kind, detail = fired[1]
    assert kind == "link_restored"
    assert detail["from_state"] == "ARMED" and detail["to_state"] == "ACTIVE"
    assert detail["down_for_s"] == 5.5 and detail["link_downed_increase"] == 3
    w.run_once(8.0)
    assert len(fired) == 2
    reader.set("DOWN", downed=10)                         # down again: a new flap
    w.run_once(9.0)
    assert [k for k, _ in fired] == ["link_flap", "link_restored", "link_flap"]


def test_a_flap_between_two_reads_is_seen_by_the_counter_alone():
    reader, w, fired = watcher()
    reader.set("ACTIVE", hw_downed=0, netdev="eth2")
    w.run_once(1.0)
    reader.set("ACTIVE", hw_downed=2, netdev="eth2")
    w.run_once(2.0)
    assert fired == [("link_flap", dict(device="mlx5_0", port=1, netdev="eth2", from_state="ACTIVE",
                                        to_state="ACTIVE", phys_state="LinkUp",
                                        link_downed_increase=2))]
    w.run_once(3.0)
    reader.set("DOWN", hw_downed=3)        # and it is still armed for a real going-down
    w.run_once(4.0)
    assert [(k, d["to_state"], d["netdev"]) for k, d in fired] == \
        [("link_flap", "ACTIVE", "eth2"), ("link_flap", "DOWN", "eth2")]


def test_pma_and_driver_link_downed_growth_add_up():
    reader, w, fired = watcher()
    reader.set("ACTIVE", downed=1, hw_downed=10)
    w.run_once(1.0)
    reader.set("DOWN", downed=2, hw_downed=11)
    w.run_once(2.0)
    assert fired[0][1]["link_downed_increase"] == 2


def test_a_counter_reset_or_a_port_first_seen_down_is_no_flap():
    reader, w, fired = watcher()
    reader.set("ACTIVE", downed=50)
    reader.set("DOWN", device="mlx5_1")
    w.run_once(1.0)
    reader.set("ACTIVE", downed=0)          # perfquery -R, a driver reload
    reader.set("ACTIVE", device="mlx5_1")   # first came up: nothing was reported down
    w.run_once(2.0)
    assert fired == []
    reader.set("DOWN", device="mlx5_1")
    w.run_once(3.0)
    assert [(k, d["device"]) for k, d in fired] == [("link_flap", "mlx5_1")]


def test_an_unreadable_state_is_not_a_change():
    reader, w, fired = watcher()
    reader.set("ACTIVE")
    w.run_once(1.0)
    reader.set("")
    w.run_once(2.0)
    reader.set("ACTIVE")
    w.run_once(3.0)
    assert fired == []


def test_a_port_that_vanishes_and_returns_not_active_is_a_flap_until_forgotten():
    reader, w, fired = watcher(forget_after_s=10.0)
    reader.set("ACTIVE", downed=3)
    w.run_once(1.0)
    reader.drop()
    w.run_once(2.0)
    reader.set("INIT", downed=0, phys="LinkUp")  # device reset: counters start over
    w.run_once(3.0)
    assert [(k, d["from_state"], d["to_state"], d["link_downed_increase"]) for k, d in fired] == \
        [("link_flap", "ACTIVE", "INIT", 0)]
    reader.set("ACTIVE")
    w.run_once(4.0)
    reader.drop()
    w.run_once(5.0)
    w.run_once(20.0)                              # gone long enough to be forgotten
    reader.set("DOWN")
    w.run_once(21.0)
    assert [k for k, _ in fired] == ["link_flap", "link_restored"]


def test_the_watcher_on_a_sysfs_tree(root):
    p = add_port(root, "rxe0", link_layer="Ethernet", hw=RXE_HW, netdev="thveth0")
    fired = []
    w = PortWatcher(rp.PortReader(str(root)), lambda kind, **d: fired.append((kind, d)))
    assert (w.name, w.interval) == ("rdma_ports", 0.5)
    w.run_once(1.0)
    write(p / "state", "1: DOWN")
    write(p / "phys_state", "3: Disabled")
    write(p / "hw_counters" / "link_downed", 1)
    w.run_once(1.5)
    w.run_once(2.0)
    write(p / "state", "4: ACTIVE")
    w.run_once(2.5)
    assert fired == [
        ("link_flap", dict(device="rxe0", port=1, netdev="thveth0", from_state="ACTIVE",
                           to_state="DOWN", phys_state="Disabled", link_downed_increase=1)),
        ("link_restored", dict(device="rxe0", port=1, netdev="thveth0", from_state="DOWN",
                               to_state="ACTIVE", phys_state="Disabled", link_downed_increase=0,
                               down_for_s=1.0))]
