"""Job, RDMA and GPU panel rows from plain series lists: [(labels, value)].

Both sources reduce their data to such lists (a scrape's samples, a PromQL
instant vector), so the panels are built the same way from either.
"""
from __future__ import annotations

from typing import Optional

from .model import GpuRow, JobRow, RdmaErrorRow, RdmaObjectRow, job_identity

Series = list  # [(labels: dict, value: float)]


def rdma_object_rows(objects: Optional[Series]) -> Optional[list]:
    if objects is None:
        return None
    counts: dict[tuple[str, str, str], float] = {}
    for labels, value in objects:
        key = (labels.get("cgroup", ""), labels.get("device", ""), labels.get("type", ""))
        counts[key] = counts.get(key, 0.0) + value
    return [RdmaObjectRow(c, d, t, n) for (c, d, t), n in sorted(counts.items())]


def rdma_error_rows(totals: Optional[Series], rates: Series) -> Optional[list]:
    """One row per (op, errno); summed over nodes when a fleet is queried."""
    if totals is None:
        return None
    rows: dict[tuple[str, str], RdmaErrorRow] = {}

    def row(labels):
        key = (labels.get("op", ""), labels.get("errno", ""))
        if key not in rows:
            rows[key] = RdmaErrorRow(key[0], key[1], 0.0, 0.0)
        return rows[key]

    for labels, value in totals:
        row(labels).errors_total += value
    for labels, value in rates:
        row(labels).errors_per_second += value
    return [rows[k] for k in sorted(rows)]


def gpu_rows(temperatures: Optional[Series], clock_events: Optional[Series],
             xid_totals: Optional[Series], xid_rates: Series,
             node_label: str = "") -> Optional[list]:
    """One row per GPU (per node and GPU when node_label names the target)."""
    if temperatures is None and clock_events is None and xid_totals is None:
        return None
    rows: dict[tuple[str, str], GpuRow] = {}

    def row(labels) -> GpuRow:
        node = labels.get(node_label, "") if node_label else ""
        # a GPU only the kernel log knows (no NVML) is named by its bus id
        key = (node, labels.get("gpu") or labels.get("pci_bus_id", ""))
        r = rows.get(key)
        if r is None:
            r = rows[key] = GpuRow(key[1], node=node)
        r.model = r.model or labels.get("model", "")
        r.uuid = r.uuid or labels.get("uuid", "")
        return r

    for labels, value in temperatures or []:
        if labels.get("sensor") == "memory":
            row(labels).memory_temperature_celsius = value
        else:
            row(labels).temperature_celsius = value
    for labels, value in clock_events or []:
        r = row(labels)
        if value >= 1 and labels.get("reason") not in r.throttle_reasons:
            r.throttle_reasons.append(labels.get("reason", ""))
    for labels, value in xid_totals or []:
        r = row(labels)
        r.xid_errors_total += value
        xid = labels.get("xid", "")
        r.xids[xid] = r.xids.get(xid, 0.0) + value
    for labels, value in xid_rates:
        row(labels).xid_errors_per_second += value
    for r in rows.values():
        r.throttle_reasons.sort()
    return [rows[k] for k in sorted(rows, key=_gpu_order)]


def _gpu_order(key: tuple[str, str]):
    node, gpu = key
    return (node, int(gpu) if gpu.isdigit() else 1 << 30, gpu)


def _ancestors(path: str):
    while "/" in path.strip("/"):
        path = path.rsplit("/", 1)[0]
        yield path


def job_rows(io_rows: list, cpu: Series, rss: Series, processes: Series,
             node_label: str = "") -> list:
    """One row per job, pod, VM or unit, busiest CPU first. `cpu` is in
    cores per cgroup; a node's cgroups of one job below another of its
    cgroups are left out of the CPU sum (their time is in their ancestor's
    already). `node_label` names the node where a fleet's series mix."""
    rows: dict[tuple, JobRow] = {}
    seen: dict[tuple, set] = {}

    def row(labels: dict, node: str = "") -> JobRow | None:
        ident = job_identity(labels)
        if ident is None:
            return None
        r = rows.get(ident)
        if r is None:
            r = rows[ident] = JobRow(*ident)
        if node and node not in r.nodes:
            r.nodes.append(node)
        if labels.get("cgroup"):
            seen.setdefault(ident, set()).add((node, labels["cgroup"]))
        return r

    def node_of(labels: dict) -> str:
        return labels.get(node_label, "") if node_label else ""

    cpu_of: dict[tuple, list] = {}
    for labels, cores in cpu:
        r = row(labels, node_of(labels))
        if r is not None and cores == cores:            # not NaN
            cpu_of.setdefault((r.kind, r.name), []).append(
                (node_of(labels), labels.get("cgroup", ""), cores))
    for key, items in cpu_of.items():
        there = {(node, cg) for node, cg, _ in items}
        rows[key].cpu_cores = sum(cores for node, cg, cores in items
                                  if not any((node, up) in there for up in _ancestors(cg)))
    for labels, value in rss:
        r = row(labels, node_of(labels))
        if r is not None:
            r.memory_rss_bytes = (r.memory_rss_bytes or 0.0) + value
    for labels, value in processes:
        r = row(labels, node_of(labels))
        if r is not None:
            r.processes = (r.processes or 0.0) + value
            if labels.get("state") == "stopped":
                r.stopped_processes += value
    for io in io_rows:
        r = row(io.workload)
        if r is None:
            continue
        for cg in io.cgroups:
            seen.setdefault((r.kind, r.name), set()).add(("", cg))
        r.read_bytes_per_second += io.read_bytes_per_second
        r.write_bytes_per_second += io.write_bytes_per_second
        r.io_errors_per_second += io.errors_per_second
    for key, r in rows.items():
        r.cgroups = len({cg for _node, cg in seen.get(key, ())})
        r.nodes.sort()
    return sorted(rows.values(), key=lambda r: (-(r.cpu_cores or 0.0), r.kind, r.name))
