"""What makes a node unfit, in one place.

The agent's GPU health detector (gpu/health.py) raises the GPU conditions as
tracehound_gpu_health{condition=<gauge>}; `tracehound health` drains a node
on them and on its RDMA ports (health/rules.py); `tracehound explain` names
each one that held on a job's node within its window, with the same phrase
and what to do (explain/rules.py, the node_unfit rule). A new condition is
added here, and each of them learns of it.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Condition:
    name: str           # health's name for it (--conditions, the drain's bookkeeping)
    gauge: str          # tracehound_gpu_health's condition label; "" for the RDMA ports'
    phrase: str         # what a drain reason and an explain finding say
    action: str         # what to do about it
    drains: bool = True     # `tracehound health` drains on it by default


CONDITIONS: tuple[Condition, ...] = (
    Condition("gpu_lost", "lost", "GPU lost (fallen off the bus or not answering NVML)",
              "drain the node and reset the GPU (or reboot); one that falls off again needs "
              "service"),
    Condition("uncorrectable_ecc_pending", "uncorrectable_ecc_pending",
              "uncorrectable ECC error, reset pending",
              "drain the node and reset the GPU, which retires the page or remaps the row"),
    Condition("row_remap_failure", "row_remap_failure", "GPU memory row remap failed",
              "the GPU needs service: it has no spare rows left"),
    Condition("thermal_slowdown", "thermal_slowdown", "GPU thermal slowdown",
              "check the node's cooling (fans, airflow, inlet temperature): the clocks are "
              "held down and the job runs slower", drains=False),
    Condition("nvlink_down", "nvlink_down", "NVLink down",
              "reset the GPU and check its NVLink and NVSwitch fabric (nvidia-smi nvlink -s)"),
    Condition("recent_fatal_xid", "recent_fatal_xid", "fatal XID within the agent's window",
              "see the XID's own finding for what to do; the node stays unfit until the "
              "window passes"),
    Condition("rdma_port_down", "", "RDMA port down",
              "check the cable, the switch port and the subnet manager"),
    Condition("rdma_port_flapping", "", "RDMA port flapping",
              "check the cable and the switch port: a link that keeps going down breaks "
              "every collective across it"),
)
BY_NAME = {c.name: c for c in CONDITIONS}
GPU = tuple(c for c in CONDITIONS if c.gauge)
BY_GAUGE = {c.gauge: c for c in GPU}
