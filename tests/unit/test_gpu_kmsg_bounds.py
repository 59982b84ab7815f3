"""Distinct bus ids, XIDs, SXids and device names in the kernel log make a
bounded number of series: a noisy log, or root writing lines for thousands
of bus ids, folds the excess into "other" and counts it, and never touches
the health of a GPU NVML enumerated.

Before, 40,000 bus ids made 40,000 XID series and 80,000 health gauges (and
as many keys kept for the agent's life)."""
from tracehound.gpu.device import Gpu
from tracehound.gpu.kmsg_labels import (BUS_IDS_BESIDE_NVML, BUS_IDS_WITHOUT_NVML, OTHER,
                                        UNCATALOGUED_XIDS, FoldedLabels)
from tracehound.gpu.xid_catalog import CATALOG

from .gpu_helpers import value
from .test_gpu_kmsg_merge import hub_only, line, scrape

PCI = "0000:3b:00.0"
XID = "tracehound_gpu_xid_errors"
HEALTH = "tracehound_gpu_health"
FOLDED = "tracehound_gpu_kmsg_folded"
LINES = 2000


def bus(n: int) -> str:
    return f"PCI:{0x1000 + n // 256:04x}:{n % 256:02x}:00"


def buses_in(fams, family) -> set[str]:
    return {lbl["pci_bus_id"] for _, lbl, _ in fams[family]}


def test_without_nvml_a_fixed_number_of_bus_ids_keep_their_label():
    hub, events, col = hub_only()
    for n in range(LINES):
        hub.kernel_event(line(f"NVRM: Xid ({bus(n)}): 79, pid=1, name=x, fallen off"))
    f = scrape(col)
    assert len(f[XID]) == BUS_IDS_WITHOUT_NVML + 1
    assert value(f, XID, pci_bus_id=OTHER, xid=79) == LINES - BUS_IDS_WITHOUT_NVML
    assert sum(v for _, _, v in f[XID]) == LINES        # every line counted, none lost
    assert value(f, FOLDED, label="pci_bus_id") == LINES - BUS_IDS_WITHOUT_NVML
    # health: two gauges per kept bus id, none for "other" (it is no one GPU)
    assert len(f[HEALTH]) == 2 * BUS_IDS_WITHOUT_NVML and OTHER not in buses_in(f, HEALTH)
    assert len(events.items) == LINES        # events keep each line's own bus id
    assert len({e["pci_bus_id"] for e in events.items}) == LINES


def test_beside_nvml_other_bus_ids_cannot_make_the_gpu_lost_nor_grow_health():
    hub, _, col = hub_only()
    hub.set_gpus([Gpu(0, None, "GPU-aaaa", "H100", pci_bus_id=PCI)])
    for n in range(LINES):
        hub.kernel_event(line(f"NVRM: Xid ({bus(n)}): 79, pid=1, name=x, fallen off"))
        hub.kernel_event(line(f"NVRM: GPU {bus(n)[4:]}.0: GPU has fallen off the bus."))
    hub.kernel_event(line("NVRM: Xid (PCI:0000:3b:00): 13, pid=1, name=x, after them"))
    f = scrape(col)
    assert value(f, HEALTH, pci_bus_id=PCI, condition="lost") == 0
    assert value(f, HEALTH, pci_bus_id=PCI, condition="recent_fatal_xid") == 0
    assert len(buses_in(f, HEALTH)) == 1 + BUS_IDS_BESIDE_NVML
    # the enumerated GPU keeps its own label after the flood
    assert value(f, XID, gpu=0, uuid="GPU-aaaa", pci_bus_id=PCI, xid=13) == 1
    assert len(f[XID]) == BUS_IDS_BESIDE_NVML + 2
    assert len(f["tracehound_gpu_fallen_off_bus"]) == BUS_IDS_BESIDE_NVML + 1
    assert value(f, FOLDED, label="pci_bus_id") == 2 * (LINES - BUS_IDS_BESIDE_NVML)


def test_xids_outside_the_catalog_are_bounded_and_catalogued_ones_never_folded():
    hub, _, col = hub_only()
    hub.set_gpus([Gpu(0, None, "GPU-aaaa", "H100", pci_bus_id=PCI)])
    unknown = [n for n in range(1000, 100000) if n not in CATALOG][:LINES]
    for n in unknown:
        hub.kernel_event(line(f"NVRM: Xid (PCI:0000:3b:00): {n}, pid=1, name=x, new"))
    hub.kernel_event(line("NVRM: Xid (PCI:0000:3b:00): 48, pid=1, name=x, double bit"))
    f = scrape(col)
    assert len(f[XID]) == UNCATALOGUED_XIDS + 2
    assert value(f, XID, pci_bus_id=PCI, xid=OTHER) == LINES - UNCATALOGUED_XIDS
    assert value(f, XID, pci_bus_id=PCI, xid=48) == 1
    assert value(f, HEALTH, pci_bus_id=PCI, condition="recent_fatal_xid") == 1
    assert value(f, FOLDED, label="xid") == LINES - UNCATALOGUED_XIDS
    assert len(f["tracehound_gpu_xid"]) == len(CATALOG) + UNCATALOGUED_XIDS


def test_switch_names_sxids_and_device_minors_are_bounded():
    hub, _, col = hub_only()
    for n in range(LINES):
        hub.kernel_event(line(f"nvidia-nvswitch{n}: SXid (PCI:0000:c8:00.0): {n}, Fatal, x"))
        hub.kernel_event(line(f"NVRM: RmInitAdapter failed! device minor number {n}"))
    f = scrape(col)
    assert len(f["tracehound_gpu_nvswitch_sxid_errors"]) <= 64 + 1
    assert len(f["tracehound_gpu_init_failures"]) <= 32 + 1
    assert sum(v for _, _, v in f["tracehound_gpu_nvswitch_sxid_errors"]) == LINES


def test_folded_labels_keep_the_known_and_the_first_others():
    labels = FoldedLabels(2, keep={"a"})
    assert [labels.label(v) for v in ("x", "a", "y", "z", "x", "a", None)] == [
        "x", "a", "y", OTHER, "x", "a", None]
    assert labels.folded == 1
    labels.keep({"z"}, cap=0)
    assert labels.label("z") == "z" and labels.label("w") == OTHER
