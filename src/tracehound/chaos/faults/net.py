"""Network faults on one interface: packet loss, corruption, delay.

With sch_netem in the kernel they are a netem root qdisc. Without it, loss
and corruption come from a tc BPF classifier (netfault.bpf.c) on a clsact
qdisc; delay has no safe substitute (earliest-departure-time pacing needs
the fq qdisc, which such kernels usually lack too) and says so.
"""
from __future__ import annotations

import json
import os
import platform

from . import (Arg, Availability, Detection, Fault, FaultError, Prepared, interface_args,
               names, refuse_host_netns)
from .targets import netns_path, netns_prefix, run_cmd

BPF_PRIORITY_BASE = 49100
# Rollback finds the filter by priority alone, so one fixed handle serves.
BPF_HANDLE = 1
_live: dict[str, object] = {}      # fault id -> loaded NetfaultProgram, while applied
_counters: dict[str, dict] = {}


def netem_available() -> bool:
    if os.path.exists("/sys/module/sch_netem"):
        return True
    release = platform.release()
    for name in ("modules.builtin", "modules.dep"):
        try:
            with open(f"/lib/modules/{release}/{name}") as f:
                if "sch_netem" in f.read():
                    return True
        except OSError:
            continue
    return False


def _tc(netns: str | None, *args: str):
    return run_cmd(netns_prefix(netns) + ["tc", *args])


def _tc_json(netns: str | None, *args: str) -> list:
    out = _tc(netns, "-j", *args).stdout.strip()
    return json.loads(out) if out else []


def _link_exists(netns: str | None, ifname: str) -> bool:
    if netns and not os.path.exists(netns_path(netns)):
        return False
    try:
        run_cmd(netns_prefix(netns) + ["ip", "link", "show", "dev", ifname])
        return True
    except FaultError:
        return False


def _net_args(extra: dict) -> dict:
    return {
        **interface_args("network interface"),
        "method": Arg(str, "netem qdisc, tc BPF classifier, or auto (netem if the kernel "
                           "has it)", default="auto", choices=("auto", "netem", "bpf")),
        "cgroup": Arg(str, "cgroup v2 path of the workload whose TCP traffic crosses the "
                           "interface: detection looks at its sockets (default: every cgroup's)",
                      grammar=names.cgroup_path),
        **extra,
    }


class NetFault(Fault):
    def __init__(self, kind: str, summary: str, extra: dict):
        self.kind = kind
        self.name = f"net.{kind}"
        self.summary = summary
        self.args = _net_args(extra)

    def check(self, args):
        problems = []
        if self.kind == "delay" and args.get("method") == "bpf":
            problems.append("delay has no BPF implementation: use method netem or auto")
        if self.kind == "delay" and args.get("direction", "egress") != "egress":
            problems.append("netem delays egress only")
        return problems

    def availability(self):
        if netem_available():
            return Availability(True, "tc netem")
        if self.kind == "delay":
            return Availability(False, "needs sch_netem, which this kernel lacks (no BPF "
                                       "substitute: EDT pacing needs sch_fq)")
        return Availability(True, "tc BPF classifier (no sch_netem in this kernel)")

    def _method(self, args) -> str:
        method = args.get("method", "auto")
        if method == "auto":
            method = "netem" if netem_available() else "bpf"
        if method == "bpf" and self.kind == "delay":
            raise FaultError("not available here: delay needs sch_netem")
        return method

    def prepare(self, args, fault_id):
        netns, ifname = args.get("netns"), args["interface"]
        refuse_host_netns(args, f"degrade {ifname}")
        if not _link_exists(netns, ifname):
            raise FaultError(f"no interface {ifname}"
                             + (f" in network namespace {netns}" if netns else ""))
        method = self._method(args)
        where = f"{ifname}" + (f" (netns {netns})" if netns else "")
        state = {"method": method, "netns": netns, "interface": ifname, "fault_id": fault_id,
                 "kind": self.kind, "percent": args.get("percent", 0),
                 "delay_ms": args.get("delay_ms"), "jitter_ms": args.get("jitter_ms", 0)}
        if method == "netem":
            qdiscs = _tc_json(netns, "qdisc", "show", "dev", ifname, "root")
            root = next((q for q in qdiscs if q.get("root")), None)
            if root and root.get("handle") not in ("0:", None) and root.get("kind") != "noqueue":
                raise FaultError(f"{ifname} has a configured root qdisc ({root.get('kind')}); "
                                 "refusing to replace it")
            return Prepared([where], state)
        direction = args.get("direction", "egress")
        filters = _tc_json(netns, "filter", "show", "dev", ifname, direction)
        used = {f.get("pref") for f in filters}
        priority = next(p for p in range(BPF_PRIORITY_BASE, BPF_PRIORITY_BASE + 1000)
                        if p not in used)
        qdiscs = _tc_json(netns, "qdisc", "show", "dev", ifname)
        state.update(direction=direction, priority=priority,
                     clsact_existed=any(q.get("kind") == "clsact" for q in qdiscs))
        return Prepared([f"{where} {direction}"], state)

    def apply(self, state):
        if state["method"] == "netem":
            spec = (["loss", f"{state['percent']}%"] if self.kind == "loss" else
                    ["corrupt", f"{state['percent']}%"] if self.kind == "corrupt" else
                    ["delay", f"{state['delay_ms']}ms", f"{state['jitter_ms']}ms"])
            _tc(state["netns"], "qdisc", "add", "dev", state["interface"], "root", "netem", *spec)
            return None
        from .tcbpf import NetfaultProgram
        prog = NetfaultProgram()
        try:
            pct = state["percent"]
            prog.configure(pct if self.kind == "loss" else 0, pct if self.kind == "corrupt" else 0)
            prog.attach(state["netns"], state["interface"], state["direction"],
                        state["priority"], BPF_HANDLE)
        except BaseException:
            prog.close()
            raise
        _live[state["fault_id"]] = prog
        return None

    def observe(self, state):
        prog = _live.get(state["fault_id"])
        if prog is not None:
            _counters[state["fault_id"]] = prog.counters()
        return _counters.get(state["fault_id"], {})

    def rollback(self, state):
        netns, ifname = state["netns"], state["interface"]
        prog = _live.pop(state["fault_id"], None)
        try:
            if not _link_exists(netns, ifname):
                return "the interface is gone; nothing left to undo"
            if state["method"] == "netem":
                qdiscs = _tc_json(netns, "qdisc", "show", "dev", ifname, "root")
                if any(q.get("kind") == "netem" for q in qdiscs):
                    _tc(netns, "qdisc", "del", "dev", ifname, "root")
                return None
            filters = _tc_json(netns, "filter", "show", "dev", ifname, state["direction"])
            if any(f.get("pref") == state["priority"] for f in filters):
                _tc(netns, "filter", "del", "dev", ifname, state["direction"], "pref",
                    str(state["priority"]))
            if not state["clsact_existed"]:
                qdiscs = _tc_json(netns, "qdisc", "show", "dev", ifname)
                if any(q.get("kind") == "clsact" for q in qdiscs):
                    _tc(netns, "qdisc", "del", "dev", ifname, "clsact")
            return None
        finally:
            if prog is not None:
                prog.close()

    def detection(self, args, state=None):
        cgroup = args.get("cgroup")
        whose = f"the sockets of {cgroup}" if cgroup else "every cgroup's sockets"
        if self.kind == "delay":
            # the smoothed RTT moves an eighth of the way per sample: half the
            # added delay is reached within a few round trips
            sel = f'{{cgroup="{cgroup}",stat="max"}}' if cgroup else '{stat="max"}'
            delay = args["delay_ms"]
            # `chaos list` asks before any argument is known ("<delay_ms>")
            threshold = (f"{delay / 2000:g}" if isinstance(delay, (int, float))
                         else f"{delay}/2000")
            q = "tracehound_net_tcp_rtt_seconds" + sel
            return Detection(query=q, signal="value", predicate=f"> {threshold}",
                             promql=f"max({q})",
                             note=f"smoothed TCP RTT of {whose} rises past half the added delay")
        if not cgroup and not args.get("netns"):
            # the interface is in the agent's own namespace (the node's): the
            # node's count holds every socket, those of no cgroup v2 too
            return Detection.counter_grows(
                "tracehound_net_node_tcp_retransmitted_segments_total",
                f"the node's TCP retransmissions grow ({self.kind} on its own interface makes "
                "segments go missing)")
        sel = f'{{cgroup="{cgroup}"}}' if cgroup else ""
        return Detection.counter_grows(
            "tracehound_net_tcp_retransmits_total" + sel,
            f"TCP retransmissions of {whose} grow ({self.kind} makes segments go missing)")


_PERCENT = Arg(float, "percent of packets", required=True, minimum=0.01, maximum=100)
_DIRECTION = Arg(str, "egress or ingress (BPF method)", default="egress",
                 choices=("egress", "ingress"))
FAULTS = [
    NetFault("loss", "drop a percentage of packets on an interface",
             {"percent": _PERCENT, "direction": _DIRECTION}),
    NetFault("corrupt", "flip one bit in a percentage of packets on an interface",
             {"percent": _PERCENT, "direction": _DIRECTION}),
    NetFault("delay", "delay packets on an interface (netem only)",
             {"delay_ms": Arg(int, "added delay", required=True, minimum=1, maximum=60000),
              "jitter_ms": Arg(int, "random variation", default=0, minimum=0,
                               maximum=60000),
              "direction": _DIRECTION}),
]
