"""Part 2 of scripts/gpu-check (bench/gpu): the GPU faults of the
chaos catalog, end to end against a running agent, each with its detection
and MTTD (examples/gpu-*.yaml through bench/detection/chaos.py's run_once), with
values chosen for the GPU at hand; then whether the rollbacks left the GPU
as they found it."""
from __future__ import annotations

import math
import os
import re
import threading
import time

from bench.gpu.agent import metric_samples
from bench.gpu.report import MIB, Part, fmt, new_part, one_line, table

# examples run in part 2, in this order (the burn first: its clocks under
# load tell whether the clock lock below means anything)
EXAMPLES = ("gpu-burn", "gpu-memory", "gpu-power-cap", "gpu-clock-lock", "gpu-xid")
FAULTS = ("gpu.burn", "gpu.memory", "gpu.power_cap", "gpu.clock_lock", "gpu.xid")
FAULT_OF = dict(zip(EXAMPLES, FAULTS))
# XID 14: the number NVIDIA keeps for an injected test error (severity info):
# a real GPU's bus id gets a line no drain automation acts on
TEST_XID = 14
# memory in use after the faults that still counts as freed (other users,
# the driver's own allocations)
MEMORY_SLACK = 1024 * MIB


# --------------------------------------------------------------------------
# choices for the faults on the GPU at hand

def pick_power_cap(current_mw: int, low_mw: int, high_mw: int) -> tuple[int, str]:
    """(watts, note): a whole number of watts about 20% under the limit in
    force, inside the GPU's own range (the example's variable takes integers)."""
    want = max(low_mw, int(current_mw * 0.8))
    watts = math.ceil(want / 1000)
    if watts * 1000 > high_mw:
        watts = high_mw // 1000
    note = f"power limit {current_mw / 1000:g} W, range {low_mw / 1000:g}..{high_mw / 1000:g} W"
    if watts * 1000 >= current_mw:
        note += ": already at its floor, the cap cannot lower it (detection is trivially true)"
    return watts, note


def pick_clock_lock(supported_mhz) -> tuple[int, int] | None:
    """(min, max) MHz: from the lowest supported graphics clock up to the
    supported clock nearest 55% of the highest, so a loaded GPU must clock
    down to honour it. None without a list."""
    clocks = sorted({int(c) for c in supported_mhz or () if c})
    if not clocks:
        return None
    target = 0.55 * clocks[-1]
    top = min(clocks, key=lambda c: (abs(c - target), c))
    return clocks[0], max(top, clocks[0])


def gpu_settings(device: int) -> dict:
    """What the faults need from NVML about GPU `device`: bus id, power
    limits, supported clocks, processes and memory in use."""
    import pynvml as nv
    from tracehound.host.topology import normalize_pci_bus_id

    nv.nvmlInit()
    try:
        h = nv.nvmlDeviceGetHandleByIndex(device)
        out = {"bus_id": normalize_pci_bus_id(nv.nvmlDeviceGetPciInfo(h).busId)}
        try:
            low, high = nv.nvmlDeviceGetPowerManagementLimitConstraints(h)
            out["power"] = (int(nv.nvmlDeviceGetPowerManagementLimit(h)), int(low), int(high))
        except nv.NVMLError as exc:
            out["power_error"] = str(exc)
        try:
            clocks = set()
            for m in nv.nvmlDeviceGetSupportedMemoryClocks(h):
                clocks.update(nv.nvmlDeviceGetSupportedGraphicsClocks(h, m))
            out["graphics_clocks"] = sorted(clocks)
        except nv.NVMLError as exc:
            out["clock_error"] = str(exc)
        out["memory_used"] = int(nv.nvmlDeviceGetMemoryInfo(h).used)
        try:
            out["processes"] = len(nv.nvmlDeviceGetComputeRunningProcesses(h))
        except nv.NVMLError:
            out["processes"] = None
        return out
    finally:
        nv.nvmlShutdown()


def fault_env(device: int, settings: dict, notes: list) -> dict:
    """The examples' variables for GPU `device`; what was chosen, and why,
    goes to `notes`."""
    env = {"CHAOS_GPU": str(device), "CHAOS_GPU_PCI": settings["bus_id"],
           "CHAOS_XID": str(TEST_XID), "CHAOS_BURN_SECONDS": "45",
           "CHAOS_GPU_MEMORY_FRACTION": "0.9", "CHAOS_GPU_MEMORY_SECONDS": "60"}
    notes.append(f"GPU {device}, bus id {settings['bus_id']} (NVML): gpu.xid writes XID "
                 f"{TEST_XID} (NVIDIA's injected test error, severity info) for it")
    if "power" in settings:
        watts, note = pick_power_cap(*settings["power"])
        env["CHAOS_GPU_WATTS"] = str(watts)
        notes.append(f"gpu.power_cap to {watts} W ({note})")
    else:
        notes.append(f"power limits unreadable ({settings.get('power_error')}): gpu.power_cap "
                     "runs with the example's default")
    lock = pick_clock_lock(settings.get("graphics_clocks"))
    if lock:
        env["CHAOS_GPU_MIN_MHZ"], env["CHAOS_GPU_MAX_MHZ"] = str(lock[0]), str(lock[1])
        notes.append(f"gpu.clock_lock to {lock[0]}..{lock[1]} MHz (supported graphics clocks "
                     f"{settings['graphics_clocks'][0]}..{settings['graphics_clocks'][-1]} MHz)")
    else:
        notes.append(f"supported clocks unreadable ({settings.get('clock_error')}): "
                     "gpu.clock_lock runs with the example's default")
    return env


# --------------------------------------------------------------------------
# what the agent showed while the faults ran

class Sampler:
    """Reads the agent every second while the faults run: what it showed
    for one GPU (utilization, SM clock, memory used, power limit)."""
    KEYS = {"tracehound_gpu_utilization_ratio": ("util", {"engine": "gpu"}),
            "tracehound_gpu_clock_hertz": ("sm", {"clock": "sm"}),
            "tracehound_gpu_memory_used_bytes": ("mem", {}),
            "tracehound_gpu_power_limit_watts": ("limit", {}),
            "tracehound_gpu_power_watts": ("power", {})}

    def __init__(self, agent, device: int):
        self.agent, self.device = agent, str(device)
        self.points: list[tuple[float, dict]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self):
        self._thread.start()
        return self

    def stop(self):
        self._stop.set()
        self._thread.join(10)

    def _run(self):
        while not self._stop.is_set():
            try:
                got = {}
                for name, labels, value in metric_samples(self.agent.scrape()):
                    key = self.KEYS.get(name)
                    if key and labels.get("gpu") == self.device and all(
                            labels.get(k) == v for k, v in key[1].items()):
                        got[key[0]] = value
                self.points.append((time.monotonic(), got))
            except (OSError, ValueError):
                pass
            self._stop.wait(1.0)

    def span(self, t0: float, t1: float, key: str) -> tuple[float, float] | None:
        vals = [p[key] for t, p in self.points if t0 <= t <= t1 and key in p]
        return (min(vals), max(vals)) if vals else None


def _span_text(span, unit: str, scale: float = 1.0) -> str:
    """A (low, high) span divided by `scale`, as "low..high unit"."""
    if span is None:
        return "-"
    lo, hi = (v / scale for v in span)
    f = (lambda v: f"{v:.0f}") if scale != 1.0 or unit == "%" else (lambda v: f"{v:g}")
    return f"{f(lo)} {unit}" if f(lo) == f(hi) else f"{f(lo)}..{f(hi)} {unit}"


def _what_the_agent_showed(sampler: Sampler, windows: list, device: int) -> list[str]:
    rows = [(f"{name}.yaml",
             _span_text(sampler.span(t0, t1, "util"), "%", 0.01),    # a ratio, in percent
             _span_text(sampler.span(t0, t1, "sm"), "MHz", 1e6),
             _span_text(sampler.span(t0, t1, "mem"), "MiB", MIB),
             _span_text(sampler.span(t0, t1, "limit"), "W"),
             _span_text(sampler.span(t0, t1, "power"), "W")) for name, t0, t1 in windows]
    return ([f"What the agent showed for GPU {device} while each example ran (read every "
             "second):", ""]
            + table(("example", "utilization", "SM clock", "memory used", "power limit",
                     "power"), rows))


# --------------------------------------------------------------------------
# the part

def _mttd(row: dict) -> float | None:
    """The MTTD of a detection row whose probe saw its fault."""
    return row["mttd_s"] if row["detected"] else None


def _run_example(agent, name: str, interval: float, work: str, env: dict) -> tuple[list, str]:
    """(detection rows, error) of one run of examples/<name>.yaml."""
    from bench.detection import chaos     # imports yaml, so only when faults run

    try:
        return chaos.run_once(agent.url, name, interval, work,
                              tag=f"gpucheck-{os.getpid()}", env=env), ""
    except Exception as exc:    # noqa: BLE001 - a failed run is a failed check
        return [], str(exc)


def _record(part: Part, logs: dict, name: str, rows: list, error: str, work: str) -> None:
    """One example's rows into the part; its output into `logs` where a
    probe missed its fault or none ran."""
    for r in rows:
        mttd = _mttd(r)
        part.rows.append((r["fault"], f"{name}.yaml", r["probe"],
                          "yes" if r["detected"] else "NO",
                          "-" if mttd is None else f"{mttd:.2f} s", f"`{r['signal']}`",
                          "pass" if r["detected"] else "fail"))
    if error or not rows or not all(r["detected"] for r in rows):
        text = error
        log = os.path.join(work, f"{name}.log")
        if os.path.exists(log):
            with open(log) as f:
                text = f.read()
        logs[f"chaos run {name}.yaml"] = text
        if not rows:
            part.rows.append((FAULT_OF[name], f"{name}.yaml", "-", "NO", "-", "-",
                              "fail: " + why_not_run(text)))


def _progress(name: str, rows: list, t0: float) -> str:
    seen = ", ".join(f"{r['probe']} {'yes' if r['detected'] else 'NO'}"
                     + ("" if _mttd(r) is None else f" {_mttd(r):.2f}s") for r in rows)
    return f"gpu-check: {name}: {seen or 'failed'} ({time.monotonic() - t0:.0f} s)"


def _rollback_checks(device: int, before: dict) -> list[tuple]:
    """(check, before, after, agree): the GPU as part 2 found it (NVML)."""
    checks = []
    try:
        # a killed process's context goes a moment after it does
        deadline = time.monotonic() + 15
        while True:
            after = gpu_settings(device)
            if time.monotonic() > deadline or (
                    after["memory_used"] <= before["memory_used"] + MEMORY_SLACK
                    and (after.get("processes") or 0) <= (before.get("processes") or 0)):
                break
            time.sleep(1)
        if "power" in before and "power" in after:
            b, a = before["power"][0], after["power"][0]
            checks.append(("power limit back after gpu.power_cap", f"{b / 1000:g} W",
                           f"{a / 1000:g} W", "yes" if abs(a - b) <= 1000 else "no"))
        b, a = before["memory_used"], after["memory_used"]
        checks.append(("memory freed after gpu.memory and gpu.burn", fmt(b, "MiB"),
                       fmt(a, "MiB"), "yes" if a <= b + MEMORY_SLACK else "no"))
        if before.get("processes") is not None and after.get("processes") is not None:
            checks.append(("no fault process left on the GPU", str(before["processes"]),
                           str(after["processes"]),
                           "yes" if after["processes"] <= before["processes"] else "no"))
    except Exception as exc:    # noqa: BLE001
        checks.append(("NVML after the faults", "-", str(exc), "no"))
    return checks


def part_faults(agent, device: int, interval: float, work: str, logs: dict) -> Part:
    """Part 2 against `agent` (bench.gpu.agent.Agent); what failed goes to `logs`."""
    part = new_part("faults", header=("fault", "example", "detection probe", "detected",
                                      "MTTD", "signal", "outcome"))
    part.intro = (f"Each example of `examples/` runs once through `tracehound chaos run` against "
                  f"the agent ({agent.mode}); its detection probes read the agent every "
                  f"{interval:g} s. MTTD is from the moment the fault was applied to the first "
                  "reading that showed it. A fault passes when every tracehound detection "
                  "probe of its example saw it.")
    try:
        settings = gpu_settings(device)
    except Exception as exc:    # noqa: BLE001 - the report says it, the part fails
        return part.fail(f"NVML could not describe GPU {device}: {exc}")
    env = fault_env(device, settings, part.notes)
    sampler = Sampler(agent, device).start()
    windows, seen = [], set()
    try:
        for name in EXAMPLES:
            t0 = time.monotonic()
            rows, error = _run_example(agent, name, interval, work, env)
            windows.append((name, t0, time.monotonic()))
            seen.update(r["fault"] for r in rows)
            _record(part, logs, name, rows, error, work)
            print(_progress(name, rows, t0), flush=True)
    finally:
        sampler.stop()
    part.extra += _what_the_agent_showed(sampler, windows, device)
    burn = next(((t0, t1) for n, t0, t1 in windows if n == "gpu-burn"), None)
    if burn and env.get("CHAOS_GPU_MAX_MHZ"):
        loaded = sampler.span(*burn, "sm")
        if loaded is None or loaded[1] <= float(env["CHAOS_GPU_MAX_MHZ"]) * 1e6:
            part.notes.append("the SM clock under gpu.burn alone never rose above the clock "
                              "lock's maximum: the clock-lock detection says little here")
    checks = _rollback_checks(device, settings)
    part.extra += ["", "After the rollbacks (NVML, before and after part 2):", ""]
    part.extra += table(("check", "before", "after", "agree"), checks)
    missing = [f for f in FAULTS if f not in seen]
    for f in missing:
        part.notes.append(f"{f}: no detection row came back (see the output below)")
    failed = [r for r in part.rows if r[-1] != "pass"] + [c for c in checks if c[-1] != "yes"]
    part.outcome = "fail" if failed or missing else "pass"
    detected = sum(1 for r in part.rows if r[-1] == "pass")
    part.summary = (f"{detected}/{len(part.rows)} detection probes saw their fault, "
                    f"{len(FAULTS) - len(missing)}/{len(FAULTS)} faults ran; "
                    f"rollback checks {sum(c[-1] == 'yes' for c in checks)}/{len(checks)}")
    return part


def why_not_run(output: str) -> str:
    """The line of `tracehound chaos run`'s output that says why it stopped."""
    lines = [ln.strip() for ln in output.splitlines() if ln.strip()]
    useful = [ln for ln in lines if not ln.endswith("nothing was run")
              and not ln.startswith(("Traceback", "File "))]
    line = (useful or lines or ["no detection probe ran"])[-1]
    # "/tmp/.../gpu-burn.json: burn-the-gpu: gpu.burn is not available here: ..."
    line = re.sub(r"^/\S+\.json: ", "", line)
    return one_line(line)
