"""What makes a node unfit, from one scrape of its agent: the rules of
`tracehound health`.

Pure: `findings(text, rules, memory, now)` reads the agent's /health answer
(its local channel: the health families alone, in exposition text) and a
memory of earlier runs (RDMA ports seen active, link_downed samples) and
returns the conditions that hold, each with the phrase a drain reason
carries. Conditions:

  agent_down                 the agent did not answer (decided by the caller)
  gpu_lost                   tracehound_gpu_health{condition="lost"} == 1: it
                             holds until the GPU answers NVML again, never
                             expires with a window
  recent_fatal_xid           ...{condition="recent_fatal_xid"} == 1, named by
                             the fatal XIDs logged within the window
                             (tracehound_gpu_recent_fatal_xid_age_seconds)
  uncorrectable_ecc_pending  ...{condition="uncorrectable_ecc_pending"} == 1
  row_remap_failure          ...{condition="row_remap_failure"} == 1
  nvlink_down                ...{condition="nvlink_down"} == 1
  thermal_slowdown           ...{condition="thermal_slowdown"} == 1 (off by default)
  rdma_port_down             a port once seen ACTIVE (by an earlier run) is
                             not ACTIVE now
  rdma_port_flapping         a port's link_downed counter grew by at least
                             `flaps` within `flap_window_s`

Only the agent's own gauges and counters count: they rest on the kernel log
(written by the kernel and root alone) and NVML, nothing a user can forge.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from prometheus_client.parser import text_string_to_metric_families

from .. import conditions
from ..gpu.xid_catalog import lookup

# the conditions and their phrases are shared with the agent's detector and
# with explain (conditions.py); agent_down is the check's own
GPU_CONDITIONS = {c.gauge: c.name for c in conditions.GPU}
CONDITIONS = ("agent_down", *(c.name for c in conditions.CONDITIONS))
DEFAULT_CONDITIONS = frozenset({"agent_down", *(c.name for c in conditions.CONDITIONS
                                                if c.drains)})
PHRASES = {c.name: c.phrase for c in conditions.CONDITIONS}
ACTIVE_STATES = (4, 5)          # ACTIVE, ACTIVE_DEFER
# Only the series the rules read are parsed: an agent's /metrics may hold
# thousands of I/O series, and the check must stay well under a second.
RECENT_XIDS = "tracehound_gpu_recent_fatal_xid_age_seconds"
FALLEN_OFF_BUS_XID = 79
WANTED_NAMES = ("tracehound_gpu_health", RECENT_XIDS,
                "tracehound_rdma_port_state_id", "tracehound_rdma_port_counter_total")
WANTED = tuple(f"{name}{{" for name in WANTED_NAMES)


@dataclass(frozen=True)
class Rules:
    conditions: frozenset = DEFAULT_CONDITIONS
    flaps: int = 3
    flap_window_s: float = 600.0


@dataclass(frozen=True)
class Finding:
    condition: str
    phrase: str          # what the drain reason says, e.g. "XID 79 GPU fell off the bus (...)"


@dataclass
class Memory:
    """What the check keeps between runs (the caller stores it as JSON)."""
    active_ports: set = field(default_factory=set)            # "device/port"
    link_downed: dict = field(default_factory=dict)           # "device/port" -> [[t, value]]
    agent_failures: int = 0       # runs in a row the agent did not answer

    def to_json(self) -> dict:
        return {"active_ports": sorted(self.active_ports), "link_downed": self.link_downed,
                "agent_failures": self.agent_failures}

    @classmethod
    def from_json(cls, data) -> "Memory":
        if not isinstance(data, dict):
            return cls()
        ports = data.get("active_ports", [])
        downs = data.get("link_downed", {})
        failures = data.get("agent_failures", 0)
        return cls({p for p in ports if isinstance(p, str)} if isinstance(ports, list) else set(),
                   {k: [s for s in v if _sample(s)] for k, v in downs.items()
                    if isinstance(k, str) and isinstance(v, list)}
                   if isinstance(downs, dict) else {},
                   failures if isinstance(failures, int) and 0 <= failures < 1 << 30 else 0)


def _sample(s) -> bool:
    return (isinstance(s, list) and len(s) == 2
            and all(isinstance(x, (int, float)) for x in s))


def samples(text: str) -> list:
    """(name, labels, value) of the series the rules read."""
    lines = "\n".join(line for line in text.splitlines() if line.startswith(WANTED))
    out = []
    for family in text_string_to_metric_families(lines + "\n"):
        out.extend((s.name, s.labels, s.value) for s in family.samples)
    return out


def findings(text: str, rules: Rules, memory: Memory, now: float) -> list[Finding]:
    series = samples(text)
    found = _gpu_findings(series, rules) + _rdma_findings(series, rules, memory, now)
    return [f for f in found if f.condition in rules.conditions]


def _gpu_findings(series, rules: Rules) -> list[Finding]:
    # the fatal XIDs logged within the agent's window, newest first: a
    # reason names what holds now, never an XID the window has passed
    recent: dict[str, list[tuple[float, int]]] = {}
    for name, labels, value in series:
        if name == RECENT_XIDS:
            try:
                xid = int(labels.get("xid", ""))
            except ValueError:
                continue
            recent.setdefault(labels.get("pci_bus_id", ""), []).append((value, xid))
    out = []
    for name, labels, value in series:
        condition = GPU_CONDITIONS.get(labels.get("condition", ""))
        if name != "tracehound_gpu_health" or value != 1 or condition is None:
            continue
        gpu = labels.get("pci_bus_id") or labels.get("gpu") or "?"
        xids = [x for _, x in sorted(recent.get(labels.get("pci_bus_id", ""), []))]
        named = ", ".join(f"XID {x} {lookup(x).name}" for x in xids) or "fatal XID"
        if condition == "recent_fatal_xid":
            out.append(Finding(condition, f"{named} ({gpu})"))
        elif condition == "gpu_lost" and FALLEN_OFF_BUS_XID in xids:
            # the XID 79 phrase says it fell off the bus: one phrase for both
            out.append(Finding(condition, f"{named} ({gpu})"))
        else:
            # lost holds until the GPU answers again, whatever the window says
            out.append(Finding(condition, f"{PHRASES[condition]} ({gpu})"))
    # a GPU whose fatal XID also made it lost: the XID first, it says why
    return sorted(out, key=lambda f: f.condition != "recent_fatal_xid")


def _rdma_findings(series, rules: Rules, memory: Memory, now: float) -> list[Finding]:
    out = []
    for name, labels, value in series:
        port = f"{labels.get('device', '?')}/{labels.get('port', '?')}"
        if name == "tracehound_rdma_port_state_id":
            if int(value) in ACTIVE_STATES:
                memory.active_ports.add(port)
            elif port in memory.active_ports:
                out.append(Finding("rdma_port_down", f"RDMA port {port} down "
                                                     f"(state {int(value)})"))
        elif (name == "tracehound_rdma_port_counter_total"
              and labels.get("counter") == "link_downed"):
            history = [s for s in memory.link_downed.get(port, [])
                       if now - s[0] <= rules.flap_window_s and s[1] <= value]
            history.append([now, value])
            memory.link_downed[port] = history[-64:]
            grew = value - history[0][1]
            if grew >= rules.flaps:
                out.append(Finding("rdma_port_flapping",
                                   f"RDMA port {port} flapping (link down {int(grew)} times "
                                   f"in {rules.flap_window_s:g} s)"))
    return out
