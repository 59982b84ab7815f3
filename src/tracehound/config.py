"""The agent's configuration, as `tracehound run` fills it from its flags."""
from __future__ import annotations

from dataclasses import dataclass

from . import defaults
from .host.mounts import DEFAULT_SKIP_FSTYPES


@dataclass
class AgentConfig:
    listen: str = defaults.LISTEN
    hook_mode: str = defaults.HOOK_MODE
    skip_fstypes: tuple[str, ...] = DEFAULT_SKIP_FSTYPES
    max_entries: int = defaults.IO_MAX_ENTRIES
    max_series: int = defaults.MAX_SERIES
    pod_logs_dir: str = defaults.POD_LOGS_DIR
    kubelet_url: str | None = None
    mountinfo: str = defaults.MOUNTINFO
    rdma_grace_s: float = defaults.RDMA_GRACE_S
    rdma_max_objects: int = defaults.RDMA_MAX_OBJECTS
    rdma_app_view: bool = True
    net_max_cgroups: int = defaults.NET_MAX_CGROUPS
    net_max_sockets: int = defaults.NET_MAX_SOCKETS
    # sock_diag in every network namespace a process is in, not only the agent's
    net_all_netns: bool = True
    latency_histograms: str = defaults.LATENCY_HISTOGRAMS
    # probes (of defaults.LATENCY_PROBES) whose calls are timed, unless
    # latency_histograms is off
    latency: frozenset[str] = frozenset(defaults.LATENCY_PROBES)
    # time a sample of the calls when they come fast (io_sample.bpf.h), or
    # every one (--latency every)
    latency_sampled: bool = True
    # --latency audit: sampled as on, and every call also timed into a
    # histogram of its own in the kernel (io_audit), for measuring the sampler
    latency_audit: bool = False
    # about one timed call of a kind per CPU per this many ns while calls come
    # faster; None: by the kernel's clock source (host/clocksource.py)
    latency_sample_gap_ns: int | None = None
    # a workload idle (or all stopped) this long is stalled; 0: detector off
    stall_after_s: float = defaults.STALL_AFTER_S
    stall_cgroups: str | None = None
    pressure_max_cgroups: int = defaults.PRESSURE_MAX_CGROUPS
    # what the agent keeps across restarts: the kernel log position (kmsg-seq);
    # `run` gives each instance its own (instance.state_dir)
    state_dir: str = defaults.STATE_DIR
    # which of the host's agents this is: its lock, pins and state are its own
    instance: str = defaults.INSTANCE
    # a fatal XID keeps the GPU's recent_fatal_xid health condition this long
    gpu_fatal_xid_window_s: float = defaults.GPU_FATAL_XID_WINDOW_S
    # the GPUs (PCI bus ids) this agent serves; None: every GPU of the host
    gpu_bus_ids: frozenset[str] | None = None
    # exporter TLS, authentication and headers (exporter.webconfig.WebConfig)
    web_config: object | None = None
    # the hierarchy the probes count by: auto, v2, freezer, cpuset or memory
    # (attribution/cgroup_layout.py)
    cgroup_key: str = "auto"
    # only cgroups at or under this path of that hierarchy are exported
    cgroup_scope: str | None = None
    # the root-only Unix socket local consumers read (exporter/local.py);
    # None: RUN_DIR/<instance>.sock, "": none
    local_socket: str | None = None
    # the subsystems to run, by name; None: all (defaults.SUBSYSTEM_NAMES)
    subsystems: frozenset[str] | None = None
