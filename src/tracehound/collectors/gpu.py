"""GPU health from NVML -> Prometheus metric families, read at scrape time.

Interface for the agent (subsystems/gpu.py)::

    hub = GpuKernelLog(detector)                     # detect/gpu_kmsg.py
    collector, reason = open_gpu_collector(workload_labels=resolve, detector=detector,
                                           xid_sink=hub.nvml_xid)
    if collector is None:
        log.info("GPU health off: %s", reason)       # no driver, no GPU, no pynvml
    else:
        hub.set_gpus(collector.gpus)                 # before the first XID can arrive
        collector.start()                            # the event thread
        registry.register(collector)
        ...
        collector.close()                            # joins the event thread, nvmlShutdown

XIDs are not counted here: each NVML XID event goes to
`xid_sink(gpu, xid, processes)`, the kernel-log hub's nvml_xid, which merges
it with the kernel log's report of the same XID and exports the count
(collectors/gpu_kmsg.py). The other NVML events are counted here.

`workload_labels(pid) -> dict[str, str]` names the workload owning a GPU
process; its keys become extra labels of the per-process families and are
copied into anomaly events. The default gives {"cgroup": <cgroup v2 path>}.
It is called from scrapes and from the event thread (to name the processes
on a GPU that raised an XID), so it must be thread-safe; keys that are not
valid label names or clash with gpu/uuid/model/pid are dropped.

Every per-GPU family carries gpu (NVML index), uuid and model. A GPU that
vanishes (NVML_ERROR_GPU_IS_LOST) exports tracehound_gpu_lost = 1 and its
event counters, nothing read half-way; other GPUs export as usual. A field a
GPU does not support is left out, not exported as 0.
"""
from __future__ import annotations

import logging
import re
import threading
from typing import Callable

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    InfoMetricFamily,
)

from ..gpu import nvml as nv
from ..gpu.bus_ids import served
from ..gpu.device import Gpu, GpuSample, enumerate_gpus, read_sample, running_processes
from ..gpu.events import EventWatcher
from ..gpu.health import gpu_key, pending_reset
from ..host.topology import Topology
from .gpu_links import link_families, process_families

log = logging.getLogger(__name__)

GPU_LABELS = ["gpu", "uuid", "model"]
UNKNOWN_GPU = {"gpu": "unknown", "uuid": "unknown", "model": "unknown"}
_LABEL_NAME = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")
_RESERVED = {"gpu", "uuid", "model", "pid", "__name__"}

WorkloadLabels = Callable[[int], dict]
# (gpu, xid, processes on that GPU): gpu is None for a handle not enumerated
XidSink = Callable[[Gpu, int, list], None]


def cgroup_workload_labels(topo: Topology) -> WorkloadLabels:
    def labels(pid: int) -> dict:
        return {"cgroup": topo.process_cgroup(pid) or "unknown"}
    return labels


class GpuCollector:
    """prometheus_client collector over NVML; owns NVML init and the event thread."""

    def __init__(self, nvml, gpus: list[Gpu], lost_at_start: list[Gpu] = (), *,
                 workload_labels: WorkloadLabels | None = None, topology: Topology | None = None,
                 xid_sink: XidSink, detector=None, driver_version: str = "",
                 event_wait_ms: int = 500):
        self.nvml = nvml
        self.topology = topology or Topology()
        self.workload_labels = workload_labels or cgroup_workload_labels(self.topology)
        self.detector = detector      # a detect.gpu.GpuDetector: every GPU's kinds from the start
        self.xid_sink = xid_sink      # (gpu, xid, processes): merged, counted and exported there
        self.driver_version = driver_version
        self.gpus = sorted([*gpus, *lost_at_start], key=lambda g: g.index)
        self._by_index = {g.index: g for g in self.gpus}
        # the bits are constants of the loaded binding, not of a GPU's state
        self._reasons = nv.clock_event_reasons(nvml)
        self._lock = threading.Lock()           # counters shared with the event thread
        self._scrape_lock = threading.Lock()    # concurrent scrapes would race on detector state
        self._events: dict[tuple[int | None, str], int] = {}
        self._bad_workload_fn = False
        self.events = EventWatcher(nvml, gpus, self._on_event, event_wait_ms)
        self._closed = False
        if detector is not None:
            for g in self.gpus:
                detector.add_gpu(g.labels)

    # -- event thread ------------------------------------------------------

    def start(self) -> GpuCollector:
        self.events.start()
        with self._lock:
            for index, labels in self.events.registered.items():
                for label in labels:
                    if label != "xid":
                        self._events.setdefault((index, label), 0)
        return self

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self.events.stop():
            # a thread still blocked in NVML would crash on a shut-down library
            nv.shutdown(self.nvml)

    def _on_event(self, gpu: Gpu | None, label: str, data: int) -> None:
        if label != "xid":
            index = gpu.index if gpu else None
            with self._lock:
                self._events[(index, label)] = self._events.get((index, label), 0) + 1
            return
        procs = []
        if gpu is not None and gpu.handle is not None:
            try:
                procs = self._process_records(running_processes(self.nvml, gpu.handle), {})
            except nv.GpuLost:
                pass
        self.xid_sink(gpu, data, procs)

    # -- workload attribution ------------------------------------------------

    def _workload(self, pid: int, cache: dict) -> dict[str, str]:
        if pid in cache:
            return cache[pid]
        try:
            raw = self.workload_labels(pid) or {}
        except Exception:
            if not self._bad_workload_fn:
                self._bad_workload_fn = True
                log.exception("workload_labels(%d) failed; GPU processes exported without them", pid)
            raw = {}
        labels = {str(k): str(v) for k, v in raw.items()
                  if _LABEL_NAME.match(str(k)) and str(k) not in _RESERVED}
        cache[pid] = labels
        return labels

    def _process_records(self, processes, cache: dict) -> list[dict]:
        return [{"pid": pid, **self._workload(pid, cache)} for pid in sorted(processes)]

    # -- scrape ------------------------------------------------------------

    def collect(self):
        with self._scrape_lock:
            families = self._collect()
        yield from families

    def _read_all(self) -> dict[int, GpuSample]:
        """Samples of the GPUs that answer; a lost GPU is left out."""
        samples = {}
        for gpu in self.gpus:
            try:
                samples[gpu.index] = read_sample(self.nvml, gpu)
            except nv.GpuLost:
                continue
        return samples

    def _collect(self) -> list:
        samples = self._read_all()
        wl_cache: dict[int, dict] = {}
        fams = [*self._identity_families(samples), *self._event_families()]
        fams += _sample_families(samples, self._by_index, self._reasons)
        rows, _ = self._process_rows(samples, wl_cache)
        fams += [*process_families(rows, samples, self.topology),
                 *link_families(samples, self._by_index)]
        return fams

    def observations(self) -> list[dict]:
        """What the GPU detector needs of every GPU, read now (its own
        schedule, not a scrape's): lost or not, ECC, remap, clock reasons,
        processes and NUMA misplacements."""
        with self._scrape_lock:
            samples = self._read_all()
            wl_cache: dict[int, dict] = {}
            _, misplaced = self._process_rows(samples, wl_cache)
            out = []
            for gpu in self.gpus:
                s = samples.get(gpu.index)
                if s is None:
                    out.append({"labels": gpu.labels, "lost": True, "key": gpu_key(gpu)})
                    continue
                active = {label for label, bit in self._reasons
                          if s.clock_reasons is not None and s.clock_reasons & bit}
                out.append({"labels": gpu.labels, "lost": False,
                            "utilization": s.utilization.get("gpu"),
                            "uncorrected_ecc": s.uncorrected_ecc(),
                            "row_remap_failure": s.row_remap_failure, "clock_reasons": active,
                            "key": gpu_key(gpu), "ecc_pending": pending_reset(s),
                            "nvlink_up": s.nvlink_up, "process_sm": s.process_sm,
                            "processes": self._process_records(s.processes, wl_cache),
                            "misplaced": misplaced.get(gpu.index, {})})
        return out

    def _identity_families(self, samples: dict[int, GpuSample]):
        info = InfoMetricFamily("tracehound_gpu", "GPUs NVML enumerates.",
                                labels=[*GPU_LABELS, "pci_bus_id", "driver_version"])
        lost = GaugeMetricFamily("tracehound_gpu_lost",
                                 "1 while the GPU does not answer NVML (NVML_ERROR_GPU_IS_LOST).",
                                 labels=["gpu", "uuid"])
        numa = GaugeMetricFamily("tracehound_gpu_numa_node",
                                 "NUMA node the GPU is attached to (-1: unknown).",
                                 labels=[*GPU_LABELS, "pci_bus_id"])
        for g in self.gpus:
            lv = _lv(g)
            info.add_metric(lv, {"pci_bus_id": g.pci_bus_id, "driver_version": self.driver_version})
            # _read_all leaves out exactly the GPUs that answered GpuLost
            lost.add_metric([str(g.index), g.uuid], int(g.index not in samples))
            numa.add_metric([*lv, g.pci_bus_id], -1 if g.numa_node is None else g.numa_node)
        nic = GaugeMetricFamily("tracehound_nic_numa_node",
                                "NUMA node of each network / RDMA device (-1: unknown).",
                                labels=["device", "subsystem"])
        for n in self.topology.nics():
            nic.add_metric([n.device, n.subsystem], n.numa_node)
        return [info, lost, numa, nic]

    def _gpu_lv(self, index: int | None) -> list[str]:
        gpu = self._by_index.get(index)
        return _lv(gpu) if gpu is not None else [UNKNOWN_GPU[k] for k in GPU_LABELS]

    def _event_families(self):
        ev = CounterMetricFamily("tracehound_gpu_events",
                                 "Other NVML events: single/double-bit ECC, PState and clock changes.",
                                 labels=[*GPU_LABELS, "type"])
        with self._lock:
            events = dict(self._events)
        for (index, label), n in sorted(events.items(), key=lambda kv: (str(kv[0][0]), kv[0][1])):
            ev.add_metric([*self._gpu_lv(index), label], n)
        return [ev]

    def _process_rows(self, samples, wl_cache):
        """Rows (gpu, pid, used bytes, workload labels, misplaced or None),
        and per GPU index the misplaced processes: pid -> (record, detail)."""
        rows = []
        misplaced_by_gpu: dict[int, dict[int, tuple[dict, dict]]] = {}
        for index, s in samples.items():
            gpu = self._by_index[index]
            misplaced = misplaced_by_gpu.setdefault(index, {})
            for pid, used in sorted(s.processes.items()):
                wl = self._workload(pid, wl_cache)
                verdict = None
                placement = (self.topology.process_placement(pid)
                             if gpu.numa_node is not None else None)
                if placement is not None:
                    verdict = self.topology.misplaced(placement, gpu.numa_node)
                    if verdict:
                        misplaced[pid] = ({"pid": pid, **wl}, {
                            "gpu_numa_node": gpu.numa_node,
                            "cpu_numa_nodes": sorted(self.topology.numa_nodes_of_cpus(placement.cpus)),
                            "mem_numa_nodes": sorted(placement.mems)})
                rows.append((gpu, pid, used, wl, verdict))
        return rows, misplaced_by_gpu


def _lv(gpu: Gpu) -> list[str]:
    return [gpu.labels[k] for k in GPU_LABELS]


def _sample_families(samples: dict[int, GpuSample], by_index: dict[int, Gpu], reasons):
    def gauge(name, doc, *extra):
        return GaugeMetricFamily(f"tracehound_gpu_{name}", doc, labels=[*GPU_LABELS, *extra])

    def counter(name, doc, *extra):
        return CounterMetricFamily(f"tracehound_gpu_{name}", doc, labels=[*GPU_LABELS, *extra])

    temp = gauge("temperature_celsius", "GPU die and memory temperature.", "sensor")
    power = gauge("power_watts", "Power draw.")
    limit = gauge("power_limit_watts", "Enforced power limit.")
    clock = gauge("clock_hertz", "Current clock frequency.", "clock")
    events = gauge("clock_event_active",
                   "1 while a clock-event (throttle) reason holds the clocks down.", "reason")
    util = gauge("utilization_ratio",
                 "Fraction of the last sample period the engine was busy.", "engine")
    mem_used = gauge("memory_used_bytes", "Frame-buffer memory in use.")
    mem_total = gauge("memory_total_bytes", "Frame-buffer memory size.")
    ecc = counter("ecc_errors", "ECC errors (volatile: since driver load; aggregate: lifetime).",
                  "type", "scope")
    retired = gauge("retired_pages", "Memory pages retired, by cause.", "cause")
    retired_pend = gauge("retired_pages_pending", "1 while a page retirement waits for a reset.")
    remapped = gauge("remapped_rows", "Memory rows remapped, by error type.", "type")
    remap_pend = gauge("row_remap_pending", "1 while a row remap waits for a reset.")
    remap_fail = gauge("row_remap_failure", "1 when a row remap failed (the GPU needs service).")
    replay = counter("pcie_replays", "PCIe replay counter.")
    nvlink = counter("nvlink_errors", "NVLink data-link error counters per link.", "link", "type")

    for index, s in sorted(samples.items()):
        lv = _lv(by_index[index])
        for sensor, c in sorted(s.temperature_c.items()):
            temp.add_metric([*lv, sensor], c)
        if s.power_w is not None:
            power.add_metric(lv, s.power_w)
        if s.power_limit_w is not None:
            limit.add_metric(lv, s.power_limit_w)
        for name, hz in sorted(s.clocks_hz.items()):
            clock.add_metric([*lv, name], hz)
        if s.clock_reasons is not None:
            for reason, bit in reasons:
                events.add_metric([*lv, reason], int(bool(s.clock_reasons & bit)))
        for engine, ratio in sorted(s.utilization.items()):
            util.add_metric([*lv, engine], ratio)
        if s.memory_used_bytes is not None:
            mem_used.add_metric(lv, s.memory_used_bytes)
            mem_total.add_metric(lv, s.memory_total_bytes)
        for (etype, scope), n in sorted(s.ecc.items()):
            ecc.add_metric([*lv, etype, scope], n)
        for cause, n in sorted(s.retired_pages.items()):
            retired.add_metric([*lv, cause], n)
        if s.retired_pages_pending is not None:
            retired_pend.add_metric(lv, s.retired_pages_pending)
        for rtype, n in sorted(s.remapped_rows.items()):
            remapped.add_metric([*lv, rtype], n)
        if s.row_remap_pending is not None:
            remap_pend.add_metric(lv, s.row_remap_pending)
            remap_fail.add_metric(lv, s.row_remap_failure)
        if s.pcie_replays is not None:
            replay.add_metric(lv, s.pcie_replays)
        for (link, etype), n in sorted(s.nvlink_errors.items()):
            nvlink.add_metric([*lv, str(link), etype], n)
    return [temp, power, limit, clock, events, util, mem_used, mem_total, ecc, retired,
            retired_pend, remapped, remap_pend, remap_fail, replay, nvlink]


def _discover(nvml, topo: Topology):
    """((nvml, gpus, lost, driver version), "") with NVML initialised, or
    (None, why not) with it shut down again."""
    if nvml is None:
        nvml, reason = nv.load_nvml()
        if nvml is None:
            return None, reason
    reason = nv.init(nvml)
    if reason:
        return None, reason
    try:
        gpus, lost = enumerate_gpus(nvml, topo)
        driver = nv.text(nv.read(nvml, "nvmlSystemGetDriverVersion") or "")
    except nvml.NVMLError as exc:
        nv.shutdown(nvml)
        return None, f"NVML could not list GPUs: {exc}"
    return (nvml, gpus, lost, driver), ""


def open_gpu_collector(workload_labels: WorkloadLabels | None = None, *, xid_sink: XidSink,
                       nvml=None, root: str = "/", event_wait_ms: int = 500, detector=None,
                       bus_ids: frozenset[str] | None = None):
    """(GpuCollector, one-line summary) or (None, one-line reason it cannot run).

    The event thread is not started: the caller gives the GPUs to whatever
    receives the XIDs, then calls start(); it owns close().
    """
    topo = Topology(root)
    found, reason = _discover(nvml, topo)
    if found is None:
        return None, reason
    nvml, gpus, lost, driver = found
    if bus_ids is not None:     # an agent serving a share of the host's GPUs
        gpus = [g for g in gpus if served(bus_ids, g.pci_bus_id)]
        lost = [g for g in lost if served(bus_ids, g.pci_bus_id)]
    if not gpus and not lost:
        nv.shutdown(nvml)
        return None, "no NVIDIA GPU found"
    col = GpuCollector(nvml, gpus, lost, workload_labels=workload_labels, topology=topo,
                       xid_sink=xid_sink, detector=detector, driver_version=driver,
                       event_wait_ms=event_wait_ms)
    summary = f"{len(gpus) + len(lost)} GPU(s), driver {driver or 'unknown'}"
    if lost:
        summary += f", lost: {', '.join(str(g.index) for g in lost)}"
    return col, summary


def gpu_inventory(nvml=None) -> tuple[list[dict], str]:
    """([{index, model, uuid, driver_version}], "") or ([], reason): for `tracehound doctor`."""
    found, reason = _discover(nvml, Topology())
    if found is None:
        return [], reason
    nvml, gpus, lost, driver = found
    nv.shutdown(nvml)
    rows = [{"index": g.index, "model": g.model, "uuid": g.uuid,
             "driver_version": driver or "unknown", "lost": g in lost}
            for g in sorted([*gpus, *lost], key=lambda g: g.index)]
    return rows, "" if rows else "no NVIDIA GPU found"
