"""RDMA faults: a tiny RLIMIT_MEMLOCK (ibv_reg_mr -> ENOMEM), the rdma
cgroup's rdma.max (object creation -> EAGAIN), and a link taken down (port
error events). They are only observable where an RDMA device exists (a
soft-RoCE device in the VM tier); the state changes themselves (rlimits,
link state, cgroup files) work on any host.
"""
from __future__ import annotations

import json
import os
import resource

from ...host.procs import cgroup_v2_path
from ...clients import prometheus
from . import (Arg, Availability, Detection, Fault, FaultError, Prepared, cgroupctl,
               interface_args, names, refuse_host_netns, target_args)
from .targets import (cgroup2_root, cgroup_dir, check_target_args,
                      enforce_blast_radius, netns_path, netns_prefix, resolve_processes, run_cmd,
                      same_process)

CAP_IPC_LOCK = 14


def rdma_devices() -> list[str]:
    try:
        return sorted(os.listdir("/sys/class/infiniband"))
    except OSError:
        return []


def _rdma_availability() -> Availability:
    devices = rdma_devices()
    if devices:
        return Availability(True, "RDMA devices: " + ", ".join(devices))
    return Availability(True, "no RDMA device here: the fault applies, but nothing uses it "
                              "(exercise it in the VM tier with soft-RoCE)")


def _has_cap_ipc_lock(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("CapEff:"):
                    return bool(int(line.split()[1], 16) >> CAP_IPC_LOCK & 1)
    except OSError:
        pass
    return False


def _fmt_limit(v: int) -> str:
    return "unlimited" if v == resource.RLIM_INFINITY else str(v)


class RdmaMemlock(Fault):
    name = "rdma.memlock"
    summary = "shrink RLIMIT_MEMLOCK of running processes (memory registration fails)"
    where = "vm"
    args = {**target_args(1),
            "bytes": Arg(int, "new soft limit in bytes", default=4096, minimum=0)}

    def check(self, args):
        return check_target_args(args)

    def availability(self):
        return _rdma_availability()

    def prepare(self, args, fault_id):
        procs = resolve_processes(args)
        enforce_blast_radius("processes", procs, args["max_targets"])
        rows, notes = [], []
        for p in procs:
            soft, hard = resource.prlimit(p.pid, resource.RLIMIT_MEMLOCK)
            rows.append([p.pid, p.start, p.comm, [soft, hard]])
            if _has_cap_ipc_lock(p.pid):
                notes.append(f"{p.label()} has CAP_IPC_LOCK: the kernel ignores "
                             "RLIMIT_MEMLOCK for it, so registrations will not fail")
        targets = [f"{p.label()} memlock {_fmt_limit(r[3][0])} -> {args['bytes']}"
                   for p, r in zip(procs, rows)]
        cgroups = sorted({cg for cg in (cgroup_v2_path(p.pid) for p in procs) if cg})
        return Prepared(targets, {"procs": rows, "bytes": args["bytes"], "cgroups": cgroups},
                        notes)

    def apply(self, state):
        for pid, start, _comm, (_soft, hard) in state["procs"]:
            if same_process(pid, start):
                new = state["bytes"] if hard == resource.RLIM_INFINITY else min(state["bytes"],
                                                                                 hard)
                resource.prlimit(pid, resource.RLIMIT_MEMLOCK, (new, hard))
        return None

    def rollback(self, state):
        for pid, start, _comm, (soft, hard) in state["procs"]:
            if same_process(pid, start):
                try:
                    resource.prlimit(pid, resource.RLIMIT_MEMLOCK, (soft, hard))
                except ProcessLookupError:
                    pass
        return None

    def detection(self, args, state=None):
        # the targets' own cgroups once known: another job's ENOMEM is not this fault
        cgroups = (state or {}).get("cgroups") or []
        where = f",cgroup=~{prometheus.regex_literal(*cgroups)}" if cgroups else ""
        q = f'tracehound_rdma_verb_errors_total{{op=~"reg_mr|umem_get",errno="ENOMEM"{where}}}'
        return Detection.counter_grows(
            q, "memory registrations fail with ENOMEM"
            + (f" in {', '.join(cgroups)}" if cgroups else ""))


class RdmaCgroup(Fault):
    name = "rdma.cgroup"
    summary = "cap a cgroup's RDMA handles/objects with rdma.max (creation fails EAGAIN)"
    where = "vm"
    args = {
        "cgroup": Arg(str, "cgroup v2 path", required=True, grammar=names.cgroup_path),
        "device": Arg(str, "RDMA device name, e.g. rxe0", required=True,
                      grammar=names.rdma_device),
        "hca_handle": Arg(int, "most contexts", default=1, minimum=0),
        "hca_object": Arg(int, "most objects (PD, CQ, QP, MR...)", default=1, minimum=0),
    }

    def check(self, args):
        return []

    def availability(self):
        try:
            root = cgroup2_root()
        except FaultError as exc:
            return Availability(False, str(exc))
        if "rdma" not in cgroupctl.controllers(root):
            return Availability(False, "the rdma controller is not available in the cgroup "
                                       "v2 hierarchy here")
        return _rdma_availability()

    def prepare(self, args, fault_id):
        root = cgroup2_root()
        directory = cgroup_dir(args["cgroup"], root)
        if args["device"] not in rdma_devices():
            raise FaultError(f"no RDMA device {args['device']} (have: "
                             f"{', '.join(rdma_devices()) or 'none'})")
        enable = cgroupctl.ancestors_to_enable(root, directory, "rdma")
        previous = cgroupctl.read_keyed(os.path.join(directory, "rdma.max")).get(args["device"])
        line = (f"{args['device']} hca_handle={args['hca_handle']} "
                f"hca_object={args['hca_object']}")
        return Prepared([f"cgroup {args['cgroup']} on {args['device']}"],
                        {"dir": directory, "device": args["device"], "line": line,
                         "enable": enable, "previous": previous})

    def apply(self, state):
        cgroupctl.enable(state["enable"], "rdma")
        cgroupctl.write_line(os.path.join(state["dir"], "rdma.max"), state["line"])
        return None

    def rollback(self, state):
        dev = state["device"]
        cgroupctl.restore_keyed(os.path.join(state["dir"], "rdma.max"), dev, state["previous"],
                                f"{dev} hca_handle=max hca_object=max", state["enable"], "rdma")
        return None

    def detection(self, args, state=None):
        # the target cgroup's own errors: another job's EAGAIN is not this fault
        cgroup = "/" + args["cgroup"].strip("/")
        q = f'tracehound_rdma_verb_errors_total{{errno="EAGAIN",cgroup="{cgroup}"}}'
        return Detection.counter_grows(q, f"object creation in {cgroup} fails with EAGAIN")


def link_is_up(netns: str | None, ifname: str) -> bool:
    out = run_cmd(netns_prefix(netns) + ["ip", "-j", "link", "show", "dev", ifname]).stdout
    links = json.loads(out or "[]")
    if not links:
        raise FaultError(f"no interface {ifname}")
    return "UP" in links[0].get("flags", [])


class RdmaLinkDown(Fault):
    name = "rdma.link_down"
    summary = "take the network interface under an RDMA port down (port error events)"
    where = "vm"
    args = interface_args("netdev of the RDMA port (e.g. the veth under rxe0)")

    def availability(self):
        return _rdma_availability()

    def prepare(self, args, fault_id):
        netns, ifname = args.get("netns"), args["interface"]
        refuse_host_netns(args, f"take {ifname} down")
        was_up = link_is_up(netns, ifname)
        notes = [] if was_up else [f"{ifname} is already down"]
        where = ifname + (f" (netns {netns})" if netns else "")
        return Prepared([where], {"netns": netns, "interface": ifname, "was_up": was_up},
                        notes)

    def apply(self, state):
        run_cmd(netns_prefix(state["netns"]) + ["ip", "link", "set", "dev",
                                                state["interface"], "down"])
        return None

    def rollback(self, state):
        netns = state["netns"]
        if netns and not os.path.exists(netns_path(netns)):
            return "the network namespace is gone; nothing left to undo"
        if state["was_up"]:
            try:
                up = link_is_up(netns, state["interface"])
            except FaultError:
                return "the interface is gone; nothing left to undo"
            if not up:
                run_cmd(netns_prefix(netns) + ["ip", "link", "set", "dev",
                                               state["interface"], "up"])
        return None

    def detection(self, args, state=None):
        q = 'tracehound_rdma_async_events_total{event="PORT_ERR"}'
        return Detection.counter_grows(q, "the RDMA core dispatches a port error event")


FAULTS = [RdmaMemlock(), RdmaCgroup(), RdmaLinkDown()]
