"""Metric families of NVLink state and traffic, MIG devices and GPU
processes (memory, NUMA placement, SM utilization, RDMA NICs), built from
the samples collectors/gpu.py reads (kept apart so that module stays about
reading, identities, health fields and events)."""
from __future__ import annotations

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from ..gpu.affinity import Affinity
from ..gpu.device import Gpu, GpuSample
from ..host.topology import Topology

MIG_LABELS = ["gpu_instance", "compute_instance", "mig_uuid"]


def _names(gpu: Gpu) -> list[str]:
    return list(gpu.labels)


def _values(gpu: Gpu) -> list[str]:
    return list(gpu.labels.values())


def link_families(samples: dict[int, GpuSample], by_index: dict[int, Gpu]) -> list:
    names = _names(next(iter(by_index.values()))) if by_index else ["gpu", "uuid", "model"]
    up = GaugeMetricFamily("tracehound_gpu_nvlink_up",
                           "1 while the NVLink link is active, 0 while it is inactive.",
                           labels=[*names, "link"])
    traffic = CounterMetricFamily(
        "tracehound_gpu_nvlink_bytes",
        "NVLink bytes per link since driver load (data: payload; raw: with protocol overhead).",
        labels=[*names, "link", "direction", "traffic"])
    mode = GaugeMetricFamily("tracehound_gpu_mig_mode", "1 while MIG mode is on.",
                             labels=names)
    mig_used = GaugeMetricFamily("tracehound_gpu_mig_memory_used_bytes",
                                 "Memory in use in a MIG device.", labels=[*names, *MIG_LABELS])
    mig_total = GaugeMetricFamily("tracehound_gpu_mig_memory_total_bytes",
                                  "Memory of a MIG device.", labels=[*names, *MIG_LABELS])
    mig_util = GaugeMetricFamily("tracehound_gpu_mig_utilization_ratio",
                                 "Busy share of a MIG device, where the driver gives one "
                                 "(most do not).", labels=[*names, *MIG_LABELS])
    for index, s in sorted(samples.items()):
        lv = _values(by_index[index])
        for link, active in sorted((s.nvlink_up or {}).items()):
            up.add_metric([*lv, str(link)], int(active))
        for (link, direction, kind), n in sorted(s.nvlink_bytes.items()):
            traffic.add_metric([*lv, str(link), direction, kind], n)
        if s.mig_enabled is not None:
            mode.add_metric(lv, int(s.mig_enabled))
        for dev in s.mig_devices:
            mv = [*lv, *(dev.labels[k] for k in MIG_LABELS)]
            if dev.memory_total_bytes is not None:
                mig_used.add_metric(mv, dev.memory_used_bytes)
                mig_total.add_metric(mv, dev.memory_total_bytes)
            if dev.utilization is not None:
                mig_util.add_metric(mv, dev.utilization)
    return [up, traffic, mode, mig_used, mig_total, mig_util]


def process_families(rows, samples: dict[int, GpuSample], topology: Topology) -> list:
    """The per-process families, from collectors/gpu.py's _process_rows:
    (gpu, pid, used bytes, workload labels, NUMA-misplaced verdict or None).
    Every family carries the same labels: GPU, pid, then the workload's."""
    names = _names(rows[0][0]) if rows else ["gpu", "uuid", "model"]
    keys = sorted({k for row in rows for k in row[3]})
    labels = [*names, "pid", *keys]
    info = GaugeMetricFamily("tracehound_gpu_process_info",
                             "1 for each process holding a GPU context, with its workload.",
                             labels=labels)
    used_fam = GaugeMetricFamily("tracehound_gpu_process_memory_used_bytes",
                                 "GPU memory a process uses.", labels=labels)
    mis = GaugeMetricFamily("tracehound_gpu_numa_misplaced",
                            "1 when a GPU process may run or allocate only on NUMA nodes "
                            "other than its GPU's.", labels=labels)
    # a process that ran no kernel in NVML's window is 0; a GPU without
    # per-process utilization exports none
    sm = GaugeMetricFamily("tracehound_gpu_process_sm_utilization_ratio",
                           "Share of the GPU's SM time a process used, mean over NVML's "
                           "last 10 s of samples.", labels=labels)
    # tracehound_gpu_numa_misplaced judges the process's CPUs and memory
    # against its GPU; this judges the third party of a GPUDirect transfer
    nic = GaugeMetricFamily("tracehound_gpu_process_nic_misplaced",
                            "1 when an RDMA NIC a GPU process uses is on another NUMA node "
                            "than its GPU; relation: pcie_switch, host_bridge, numa_node, "
                            "cross_numa or unknown.", labels=[*labels, "nic", "relation"])
    affinity = Affinity(topology) if rows else None
    for gpu, pid, used, wl, verdict in rows:
        lv = [*_values(gpu), str(pid), *(wl.get(k, "") for k in keys)]
        info.add_metric(lv, 1)
        if used is not None:
            used_fam.add_metric(lv, used)
        if verdict is not None:
            mis.add_metric(lv, int(verdict))
        per_pid = samples[gpu.index].process_sm
        if per_pid is not None:
            sm.add_metric(lv, per_pid.get(pid, 0.0))
        for card in affinity.nics_of(pid):
            relation = affinity.relation(gpu.pci_bus_id, gpu.numa_node, card)
            nic.add_metric([*lv, card.name, relation], int(relation == "cross_numa"))
    return [info, used_fam, mis, sm, nic]
