"""Shared pieces of the GPU unit tests: a sysfs/procfs tree and sample lookup."""
from __future__ import annotations

import os

from tracehound.collectors.gpu import GpuCollector, open_gpu_collector
from tracehound.collectors.gpu_kmsg import GpuKernelLogCollector
from tracehound.detect.gpu import GpuDetector, GpuWatcher
from tracehound.detect.gpu_kmsg import GpuKernelLog
from tracehound.gpu.device import enumerate_gpus
from tracehound.host.topology import Topology

from .fake_nvml import FakeNvml


def write(root, rel: str, text: str) -> None:
    path = os.path.join(str(root), rel)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        f.write(text)


def make_host(root, *, nodes=None, pci=None, nics=None, procs=None) -> str:
    """A fake /sys and /proc under root.

    nodes: {node: "cpulist"}; pci: {"0000:3b:00.0": numa node};
    nics: {(subsystem, name): numa node or None for a virtual device};
    procs: {pid: (cgroup path, "Cpus_allowed_list", "Mems_allowed_list")}.
    """
    for node, cpus in (nodes or {}).items():
        write(root, f"sys/devices/system/node/node{node}/cpulist", cpus + "\n")
    for bus, node in (pci or {}).items():
        write(root, f"sys/bus/pci/devices/{bus}/numa_node", f"{node}\n")
    for (subsystem, name), node in (nics or {}).items():
        if node is None:
            os.makedirs(os.path.join(str(root), "sys/class", subsystem, name), exist_ok=True)
        else:
            write(root, f"sys/class/{subsystem}/{name}/device/numa_node", f"{node}\n")
    for pid, (cgroup, cpus, mems) in (procs or {}).items():
        write(root, f"proc/{pid}/cgroup", f"12:cpu,cpuacct:/old\n0::{cgroup}\n")
        write(root, f"proc/{pid}/status",
              f"Name:\tpython\nPid:\t{pid}\nCpus_allowed_list:\t{cpus}\n"
              f"Mems_allowed_list:\t{mems}\n")
    return str(root)


class Events:
    """Collects emitted anomaly events in place of the JSON log."""

    def __init__(self):
        self.items: list[dict] = []

    def __call__(self, event: dict) -> None:
        self.items.append(event)

    def kinds(self) -> list[str]:
        return [e["kind"] for e in self.items]


def make_collector(nvml: FakeNvml, root, workload_labels=None, events: Events | None = None,
                   start=False) -> GpuCollector:
    """The collector wired as the gpu subsystem wires it: its XIDs go to the
    kernel-log hub (kmsg_hub(collector)), which knows the GPUs before the
    event thread starts."""
    nvml.nvmlInit()
    topo = Topology(str(root))
    gpus, lost = enumerate_gpus(nvml, topo)
    detector = GpuDetector(emit=events or Events())
    hub = GpuKernelLog(detector, workload_labels=workload_labels)
    col = GpuCollector(nvml, gpus, lost, workload_labels=workload_labels, topology=topo,
                       xid_sink=hub.nvml_xid, detector=detector, driver_version=nvml.driver,
                       event_wait_ms=20)
    hub.set_gpus(col.gpus)
    return col.start() if start else col


def open_collector(events: Events | None = None, start=True, **kw):
    """open_gpu_collector as the gpu subsystem calls it, the hub given the
    GPUs before the event thread starts: (collector, summary) or (None, why not)."""
    detector = GpuDetector(emit=events or Events())
    hub = GpuKernelLog(detector, workload_labels=kw.get("workload_labels"))
    col, summary = open_gpu_collector(detector=detector, xid_sink=hub.nvml_xid, **kw)
    if col is not None:
        hub.set_gpus(col.gpus)
        if start:
            col.start()
    return col, summary


def kmsg_hub(collector: GpuCollector) -> GpuKernelLog:
    """The hub a collector's XIDs go to (its xid_sink is the hub's nvml_xid)."""
    return collector.xid_sink.__self__


def scrape(collector) -> dict:
    """One detection pass (as the agent's detector schedule runs it), then a
    scrape of what the gpu subsystem serves: the collector, its detector's
    counters and the kernel-log hub's (the XID counts):
    {family name: [(sample name, labels dict, value)]}"""
    hub = kmsg_hub(collector)
    families = []
    if collector.detector is not None:
        GpuWatcher(lambda: hub.observe(collector.observations()), collector.detector).run_once(0.0)
        families += list(collector.detector.collect())
    families = list(collector.collect()) + families + list(GpuKernelLogCollector(hub).collect())
    return {f.name: [(s.name, s.labels, s.value) for s in f.samples] for f in families}


def value(fams: dict, family: str, sample: str | None = None, **labels):
    """The value of the one sample of `family` whose labels include `labels`."""
    hits = [v for name, lbl, v in fams[family]
            if (sample is None or name == sample)
            and all(lbl.get(k) == str(want) for k, want in labels.items())]
    assert len(hits) <= 1, (family, labels, hits)
    return hits[0] if hits else None


def label_sets(fams: dict, family: str) -> list[dict]:
    return [lbl for _, lbl, _ in fams[family]]
