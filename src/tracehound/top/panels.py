"""RDMA and GPU panel rows from plain series lists: [(labels, value)].

Both sources reduce their data to such lists (a scrape's samples, a PromQL
instant vector), so the panels are built the same way from either.
"""
from __future__ import annotations

from typing import Optional

from .model import GpuRow, RdmaErrorRow, RdmaObjectRow

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
