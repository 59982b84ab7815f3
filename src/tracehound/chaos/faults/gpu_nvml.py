"""GPU faults made through NVML itself: a lower power limit, locked clocks.

Both change real device settings (root, or a driver that lets the user set
them), and both run in the chaos process: an NVML call takes effect at once
and stays after the process is gone, so there is no child to keep alive.
prepare() reads what rollback needs (the limit in force, the GPU's UUID)
and refuses an out-of-range value before anything changes; the runner
journals that state before apply(); rollback(), in the same run or in
`tracehound chaos recover` after a crash, finds the GPU again by UUID (an
index can move across a reboot) and puts it back.

NVML has no call that reads locked clocks, so gpu.clock_lock cannot save a
lock someone set before; rollback resets to the driver's default (no lock)
and says so in the report.
"""
from __future__ import annotations

from contextlib import contextmanager

from ...gpu import nvml as nv
from . import Arg, Availability, Detection, Fault, FaultError, Prepared


def load_nvml():
    """(module, reason): the real binding; unit tests put a test double here."""
    return nv.load_nvml()


@contextmanager
def _session():
    nvml, reason = load_nvml()
    if nvml is None:
        raise FaultError(f"not available here: {reason}")
    reason = nv.init(nvml)
    if reason:
        raise FaultError(f"not available here: {reason}")
    try:
        yield nvml
    finally:
        nv.shutdown(nvml)


def _call(nvml, what: str, func: str, *args):
    """An NVML call whose failure is the fault's failure, said plainly."""
    try:
        return getattr(nvml, func)(*args)
    except nvml.NVMLError as exc:
        hint = " (needs root)" if nv.is_error(nvml, exc, "NVML_ERROR_NO_PERMISSION") else ""
        raise FaultError(f"{what}: {func} failed: {exc}{hint}") from None


def _by_index(nvml, index: int):
    """(handle, uuid) of the GPU at NVML index `index`."""
    count = _call(nvml, "listing GPUs", "nvmlDeviceGetCount")
    if not 0 <= index < count:
        raise FaultError(f"no GPU {index}: NVML sees {count} GPU(s)")
    handle = _call(nvml, f"GPU {index}", "nvmlDeviceGetHandleByIndex", index)
    return handle, nv.text(_call(nvml, f"GPU {index}", "nvmlDeviceGetUUID", handle))


def _by_uuid(nvml, uuid: str):
    return _call(nvml, f"GPU {uuid}", "nvmlDeviceGetHandleByUUID", uuid)


class _NvmlFault(Fault):
    where = "gpu"

    def availability(self):
        nvml, reason = load_nvml()
        if nvml is None:
            return Availability(False, reason)
        reason = nv.init(nvml)
        if reason:
            return Availability(False, reason)
        try:
            if not nv.read(nvml, "nvmlDeviceGetCount"):
                return Availability(False, "NVML sees no GPU")
        finally:
            nv.shutdown(nvml)
        return Availability(True, "NVML with a GPU")


class GpuPowerCap(_NvmlFault):
    name = "gpu.power_cap"
    summary = "lower a GPU's power limit (nvmlDeviceSetPowerManagementLimit), restored after"
    args = {"device": Arg(int, "NVML GPU index", default=0, minimum=0),
            "watts": Arg(float, "power limit to set, within the GPU's own min..max limits",
                         required=True, minimum=1, maximum=100000)}

    def prepare(self, args, fault_id):
        with _session() as nvml:
            h, uuid = _by_index(nvml, args["device"])
            what = f"GPU {args['device']}"
            low, high = _call(nvml, what, "nvmlDeviceGetPowerManagementLimitConstraints", h)
            target = int(round(args["watts"] * 1000))
            if not low <= target <= high:
                raise FaultError(f"{args['watts']} W is outside {what}'s power limit range "
                                 f"{low / 1000:g}..{high / 1000:g} W")
            prior = _call(nvml, what, "nvmlDeviceGetPowerManagementLimit", h)
        return Prepared([f"{what} ({uuid})"],
                        {"uuid": uuid, "prior_mw": int(prior), "target_mw": target},
                        notes=[f"power limit {prior / 1000:g} W -> {target / 1000:g} W"])

    def _set(self, state, mw):
        with _session() as nvml:
            _call(nvml, f"GPU {state['uuid']}", "nvmlDeviceSetPowerManagementLimit",
                  _by_uuid(nvml, state["uuid"]), mw)

    def apply(self, state):
        self._set(state, state["target_mw"])
        return None

    def rollback(self, state):
        self._set(state, state["prior_mw"])
        return None

    def observe(self, state):
        with _session() as nvml:
            mw = nv.read(nvml, "nvmlDeviceGetPowerManagementLimit", _by_uuid(nvml, state["uuid"]))
        return {} if mw is None else {"power_limit_watts": mw / 1000}

    def detection(self, args, state=None):
        q = f'tracehound_gpu_power_limit_watts{{gpu="{args.get("device", 0)}"}}'
        return Detection(query=q, signal="value", predicate=f"<= {args['watts']}", promql=q,
                         note="the enforced power limit drops to the cap; under load, "
                              "tracehound_gpu_clock_event_active{reason=\"sw_power_cap\"} "
                              "shows the clocks it holds down")


class GpuClockLock(_NvmlFault):
    name = "gpu.clock_lock"
    summary = ("lock a GPU's clocks to a range (nvmlDeviceSetGpuLockedClocks, memory clocks "
               "optional), reset after")
    args = {"device": Arg(int, "NVML GPU index", default=0, minimum=0),
            "min_mhz": Arg(int, "lowest graphics clock, MHz", required=True, minimum=1),
            "max_mhz": Arg(int, "highest graphics clock, MHz", required=True, minimum=1),
            "memory_min_mhz": Arg(int, "lowest memory clock, MHz (with memory_max_mhz)",
                                  minimum=1),
            "memory_max_mhz": Arg(int, "highest memory clock, MHz", minimum=1)}

    def check(self, args):
        problems = []
        if args["min_mhz"] > args["max_mhz"]:
            problems.append(f"min_mhz {args['min_mhz']} is above max_mhz {args['max_mhz']}")
        mem = (args.get("memory_min_mhz"), args.get("memory_max_mhz"))
        if (mem[0] is None) != (mem[1] is None):
            problems.append("give both memory_min_mhz and memory_max_mhz, or neither")
        elif mem[0] is not None and mem[0] > mem[1]:
            problems.append(f"memory_min_mhz {mem[0]} is above memory_max_mhz {mem[1]}")
        return problems

    def prepare(self, args, fault_id):
        problems = self.check(args)
        if problems:
            raise FaultError("; ".join(problems))
        with _session() as nvml:
            h, uuid = _by_index(nvml, args["device"])
            what = f"GPU {args['device']}"
            mem_clocks = _call(nvml, what, "nvmlDeviceGetSupportedMemoryClocks", h)
            graphics = {c for m in mem_clocks
                        for c in _call(nvml, what, "nvmlDeviceGetSupportedGraphicsClocks", h, m)}
            _within(what, "graphics", (args["min_mhz"], args["max_mhz"]), graphics)
            memory = None
            if args.get("memory_min_mhz") is not None:
                memory = [args["memory_min_mhz"], args["memory_max_mhz"]]
                _within(what, "memory", memory, mem_clocks)
        return Prepared([f"{what} ({uuid})"],
                        {"uuid": uuid, "graphics": [args["min_mhz"], args["max_mhz"]],
                         "memory": memory},
                        notes=["NVML cannot read a clock lock set before this fault: "
                               "rollback resets the clocks to the driver default"])

    def apply(self, state):
        with _session() as nvml:
            h = _by_uuid(nvml, state["uuid"])
            what = f"GPU {state['uuid']}"
            _call(nvml, what, "nvmlDeviceSetGpuLockedClocks", h, *state["graphics"])
            if state.get("memory"):
                _call(nvml, what, "nvmlDeviceSetMemoryLockedClocks", h, *state["memory"])
        return None

    def rollback(self, state):
        # a reset of a clock that is not locked is a no-op: safe to repeat,
        # and right for a fault journaled but never applied
        with _session() as nvml:
            h = _by_uuid(nvml, state["uuid"])
            what = f"GPU {state['uuid']}"
            if state.get("memory"):
                _call(nvml, what, "nvmlDeviceResetMemoryLockedClocks", h)
            _call(nvml, what, "nvmlDeviceResetGpuLockedClocks", h)
        return "clocks reset to the driver default (no lock)"

    def detection(self, args, state=None):
        q = f'tracehound_gpu_clock_hertz{{gpu="{args.get("device", 0)}",clock="sm"}}'
        return Detection(query=q, signal="value", predicate=f"<= {args['max_mhz']}e6",
                         promql=q,
                         note="the SM clock stays at or under the lock; an idle GPU clocks "
                              "down anyway, so run a load (gpu.burn) beside it for a lock "
                              "below the boost clock to mean something")


def _within(what: str, kind: str, pair, supported) -> None:
    if not supported:
        raise FaultError(f"{what} lists no supported {kind} clocks: it cannot be locked")
    low, high = min(supported), max(supported)
    for mhz in pair:
        if not low <= mhz <= high:
            raise FaultError(f"{mhz} MHz is outside {what}'s supported {kind} clocks "
                             f"{low}..{high} MHz")


FAULTS = [GpuPowerCap(), GpuClockLock()]
