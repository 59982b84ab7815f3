"""Link flaps of RDMA ports, from sysfs state and link_downed counters.

  link_flap      a port left ACTIVE (or ACTIVE_DEFER), or its link_downed
                 counter grew. to_state ACTIVE means the link went down and
                 came back between two reads: only the counter saw it.
  link_restored  a port that link_flap reported down is ACTIVE again.

Details: device, port, netdev (RoCE; "" for IB), from_state, to_state,
phys_state, link_downed_increase (the PMA counter's and the driver's
hw_counter's growth added together; a driver with neither reports 0), and for
link_restored down_for_s plus the link_downed growth while it was down.

A port is judged against its previous read, so the first read is only a
baseline: a port that is down when watching begins, or that appears down,
raises nothing until it has been ACTIVE. One link_flap per going down, none
while the port stays down however often the link retrains; the next one
after it came back. A counter that went backwards was reset (driver reload,
`perfquery -R`) and is a new baseline, not a flap. A port that disappears
(device reset, driver unbind) keeps its last state for `forget_after_s`: if it
comes back not ACTIVE within that time, that is a flap.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from ..host.rdma_ports import UP_STATES, PortSample

KINDS = ("link_flap", "link_restored")
LINK_DOWNED = "link_downed"
INTERVAL_S = 0.5
FORGET_AFTER_S = 600.0

Fire = Callable[..., None]      # fire(kind, **detail)


@dataclass
class _Port:
    state: str
    downed: dict[str, int]           # "counters"/"hw_counters" -> last link_downed
    netdev: str
    seen: float
    down_since: float | None = None  # set while a reported link_flap is not yet restored
    downed_while_down: int = 0


def _link_downed(p: PortSample) -> dict[str, int]:
    out = {}
    if LINK_DOWNED in p.counters:
        out["counters"] = p.counters[LINK_DOWNED]
    if LINK_DOWNED in p.hw_counters:
        out["hw_counters"] = p.hw_counters[LINK_DOWNED]
    return out


def _growth(before: dict[str, int], after: dict[str, int]) -> int:
    return sum(max(0, v - before[src]) for src, v in after.items() if src in before)


class PortWatcher:
    """A detector for the agent's schedule: `name`, `interval`, `run_once(now)`.
    `reader` is a host.rdma_ports.PortReader (its light read is used);
    `fire(kind, **detail)` is called once per anomaly."""

    name = "rdma_ports"

    def __init__(self, reader, fire: Fire, interval: float = INTERVAL_S,
                 forget_after_s: float = FORGET_AFTER_S):
        self.reader = reader
        self.fire = fire
        self.interval = interval
        self.forget_after_s = forget_after_s
        self._ports: dict[tuple[str, int], _Port] = {}

    def run_once(self, now: float) -> None:
        for p in self.reader.read(full=False).ports:
            self._check(p, now)
        for key in [k for k, v in self._ports.items() if now - v.seen > self.forget_after_s]:
            del self._ports[key]

    def _check(self, p: PortSample, now: float) -> None:
        key = (p.device, p.port)
        downed = _link_downed(p)
        last = self._ports.get(key)
        if last is None:
            self._ports[key] = _Port(p.state, downed, p.netdev, now)
            return
        grew = _growth(last.downed, downed)
        # an unreadable state keeps the last one rather than count as a change
        state = p.state or last.state
        from_state = last.state
        last.state, last.downed, last.seen = state, downed, now
        if p.netdev:
            # the netdev outlives a read where the GID table was being rebuilt
            last.netdev = p.netdev
        up = state in UP_STATES
        detail = dict(device=p.device, port=p.port, netdev=last.netdev, from_state=from_state,
                      to_state=state, phys_state=p.phys_state)
        if last.down_since is None:
            if (from_state in UP_STATES and not up) or grew:
                if not up:
                    last.down_since, last.downed_while_down = now, 0
                self.fire("link_flap", **detail, link_downed_increase=grew)
        elif up:
            down_for = now - last.down_since
            during = last.downed_while_down + grew
            last.down_since = None
            self.fire("link_restored", **detail, link_downed_increase=during,
                      down_for_s=round(down_for, 3))
        else:
            last.downed_while_down += grew
