"""Every default the agent, its commands and its subsystems share, in one place.

The command line, AgentConfig, the probes' own configurations and the help
texts all read these, so a changed default changes everywhere at once.
"""
from __future__ import annotations

LISTEN = "127.0.0.1:9560"
HOOK_MODE = "auto"
MOUNTINFO = "/proc/self/mountinfo"

# capacity of the I/O probe's (cgroup, mount) table in the kernel
IO_MAX_ENTRIES = 8192
# the share of that table kept for cgroups root made on mounts no user owns:
# keys a tenant can mint at will (their own cgroups, mounts in a user
# namespace) never fill the last of it, so a job started later is counted
IO_RESERVED_SHARE = 0.25
# label sets per metric family before the rest fold into __overflow__ (0: no cap)
MAX_SERIES = 10000
# which labels the I/O latency histograms keep: per (cgroup, mount) they are
# three quarters of every scrape
# per workload (a Slurm job, pod, VM or unit, over all its cgroups) and mount:
# a busy node's thousands of small cgroups would otherwise make most of a
# scrape (docs/metrics.md, "Sizing a busy node")
LATENCY_HISTOGRAMS = "workload-mount"
LATENCY_HISTOGRAM_CHOICES = ("workload-mount", "cgroup-mount", "cgroup", "mount", "off")
# how often the agent's schedule retires removed cgroups' entries (I/O, exits)
# and then forgets the names nobody refers to: one interval for all, so each
# turn runs them together, in that order. The churn between two turns waits
# in the maps (sized for far more) and is exported as one batch.
HOUSEKEEPING_S = 2.0
# probes whose calls the kernel can time (--latency); timing is the dearer
# half of their per-call cost in syscall mode
LATENCY_PROBES = ("io.read", "io.write", "io.fsync")
# sampled timing (--latency on): when calls of a kind come faster on a CPU,
# about one per this many ns is timed and stands for the calls between; rarer
# calls are all timed. Two clock reads cost ~120 ns on a host: timing at most
# ~50,000 calls a second per CPU and kind keeps that under 1 % of a CPU.
LATENCY_SAMPLE_GAP_NS = 20_000
# ... where the kernel's clock source is a device (HPET, ACPI PM timer;
# host/clocksource.py), a read costs hundreds of ns to microseconds, and 20 us
# would spend several % of a CPU on clock reads; 100 us keeps it near 1 %, and
# still times ten thousand calls a second per CPU and kind
LATENCY_SAMPLE_GAP_SLOW_CLOCK_NS = 100_000
# capacity of the RDMA probe's mirror of the kernel's resource tracker
RDMA_MAX_OBJECTS = 16384
# how long RDMA objects may outlive their process, or the mirror disagree
# with the kernel, before it is an anomaly
RDMA_GRACE_S = 10.0
# capacity of the net probe's per-cgroup TCP counters in the kernel
NET_MAX_CGROUPS = 4096
# established TCP sockets one sock_diag scan reads before it stops
NET_MAX_SOCKETS = 20000

# how long a job may move nothing (or stay stopped) before it is stalled:
# longer than a checkpoint's quiet compute phase, shorter than NCCL's timeout
STALL_AFTER_S = 300.0

POD_LOGS_DIR = "/var/log/pods"
CONTAINER_LOGS_DIR = "/var/log/containers"

# how often each subsystem's detector looks, independent of scrapes
RDMA_DETECT_INTERVAL_S = 0.25
GPU_DETECT_INTERVAL_S = 5.0
# how often GPU health changes become events (the inputs arrive on their own)
GPU_HEALTH_INTERVAL_S = 1.0
# how long a fatal-severity XID keeps tracehound_gpu_health{condition="recent_fatal_xid"} at 1
GPU_FATAL_XID_WINDOW_S = 600.0

# what the agent keeps across restarts (the kernel log position); instances
# other than the default keep theirs under STATE_DIR/instances/<name>
STATE_DIR = "/var/lib/tracehound"

# several agents share one host as named instances (`run --instance`): each
# holds a lock under RUN_DIR and pins its maps under PIN_ROOT/<instance>
INSTANCE = "default"
# the agent's subsystems by name (`run --subsystems`), as subsystems/ lists them
SUBSYSTEM_NAMES = ("io", "rdma", "gpu", "net", "exits", "pressure", "stall")
RUN_DIR = "/run/tracehound"
PIN_ROOT = "/sys/fs/bpf/tracehound"

# cgroup directories the pressure collector reads per scrape
PRESSURE_MAX_CGROUPS = 4096
