"""GPU health: NVML samples and events, the kernel log's GPU errors, with
their detectors.

Optional: no driver, no GPU or no nvidia-ml-py is reported, not fatal. The
kernel log is read whatever NVML says (a broken driver is when it matters
most); an unreadable /dev/kmsg is reported, not fatal either."""
from __future__ import annotations

import os
import time

from ..collectors.gpu import GpuCollector, gpu_inventory, open_gpu_collector
from ..collectors.gpu_kmsg import GpuKernelLogCollector
from ..detect.gpu import GpuDetector, GpuWatcher
from ..detect.gpu_kmsg import GpuKernelLog
from ..gpu.kmsg import DEFAULT_PATH as KMSG_PATH
from ..gpu.bus_ids import served
from ..gpu.kmsg import KmsgWatcher
from .base import DoctorReport, Subsystem, check_line


# how long start-up waits for the kernel log's existing records to be read
KMSG_CATCH_UP_S = 10.0


class GpuBusy:
    """GPU busy seconds of each process holding a GPU context, for the stall
    detector: the process's own SM utilization where NVML gives it per
    process (else its GPUs' whole utilization, which a busy neighbour on a
    shared GPU would lend it) times the time between two of the GPU
    detector's looks. A process on a GPU whose utilization NVML does not give
    is `unmeasured`: the stall rule cannot judge its work."""

    def __init__(self, clock=time.monotonic):
        self.clock = clock
        self.seconds: dict[int, float] = {}
        self.unmeasured: frozenset[int] = frozenset()
        self._at: float | None = None

    def observe(self, observations: list[dict]) -> list[dict]:
        now = self.clock()
        dt = 0.0 if self._at is None else now - self._at
        self._at = now
        seconds: dict[int, float] = {}
        unmeasured = set()
        for o in observations:
            per_pid = o.get("process_sm")
            for proc in o.get("processes", ()):
                pid = proc["pid"]
                ratio = o.get("utilization") if per_pid is None else per_pid.get(pid, 0.0)
                if ratio is None:
                    unmeasured.add(pid)
                else:
                    seconds[pid] = seconds.get(pid, self.seconds.get(pid, 0.0)) + ratio * dt
        self.seconds, self.unmeasured = seconds, frozenset(unmeasured)
        return observations


class GpuSubsystem(Subsystem):
    name = "gpu"
    needs_bpf = False

    def __init__(self, ctx):
        super().__init__(ctx)
        self.detector = GpuDetector()
        self.collector: GpuCollector | None = None
        self._watcher: GpuWatcher | None = None
        self.summary = ""
        self.busy = GpuBusy()
        config = ctx.config
        self.kmsg = GpuKernelLog(self.detector, workload_labels=ctx.owners.of_pid,
                                 fatal_window_s=config.gpu_fatal_xid_window_s)
        self.kmsg_state = os.path.join(config.state_dir, "kmsg-seq")
        self._kmsg_watcher: KmsgWatcher | None = None

    def start(self) -> None:
        self.collector, self.summary = open_gpu_collector(
            workload_labels=self.ctx.owners.of_pid, detector=self.detector,
            xid_sink=self.kmsg.nvml_xid, bus_ids=self.ctx.config.gpu_bus_ids)
        if self.collector is not None:
            # identities first: an XID must find its GPU from the first event
            self.kmsg.set_gpus(self.collector.gpus)
            self.collector.start()
            self._watcher = GpuWatcher(lambda: self.kmsg.observe(
                self.busy.observe(self.collector.observations())), self.detector)
            self.ctx.progress.add(self.name, lambda: self._per_cgroup(self.busy.seconds))
            self.ctx.progress.add_blind(self.name, lambda: self._per_cgroup(
                dict.fromkeys(self.busy.unmeasured, 0.0)))
        # after NVML: the replay of the ring maps bus ids to enumerated GPUs
        self._kmsg_watcher = KmsgWatcher(KMSG_PATH, self.kmsg_state,
                                         on_event=self._kernel_event).start()
        # What the ring held at start is read before the agent says it serves,
        # so a line logged after that is news, never taken for the ring's past
        # (a few thousand records take well under a second).
        self._kmsg_watcher.wait_caught_up(KMSG_CATCH_UP_S)

    def _kernel_event(self, event) -> None:
        if served(self.ctx.config.gpu_bus_ids, event.pci):
            self.kmsg.kernel_event(event)

    def _per_cgroup(self, per_pid: dict[int, float]) -> dict[int, float]:
        out: dict[int, float] = {}
        for pid, value in per_pid.items():
            path = self.ctx.owners.path_of_pid(pid)
            if path is None:
                continue
            try:
                cgid = os.stat(os.path.join(self.ctx.owners.root, path.lstrip("/"))).st_ino
            except OSError:
                continue
            out[cgid] = out.get(cgid, 0.0) + value
        return out

    def close(self) -> None:
        self.ctx.progress.remove(self.name)
        if self._kmsg_watcher is not None:
            self._kmsg_watcher.stop()       # saves the position for the next start
        if self.collector is not None:
            self.collector.close()

    def collectors(self) -> list:
        kmsg = GpuKernelLogCollector(self.kmsg, self._kmsg_watcher)
        return [c for c in (self.collector, self.detector, kmsg) if c is not None]

    def detectors(self) -> list:
        return [d for d in (self._watcher, self.kmsg) if d is not None]

    def health_families(self) -> list:
        return GpuKernelLogCollector(self.kmsg, self._kmsg_watcher).health_families()

    def status_lines(self) -> list[str]:
        w = self._kmsg_watcher
        if w is not None and w.error:
            kmsg = f"not available ({w.error})"
        elif w is not None and w.state_error:
            kmsg = f"reading {KMSG_PATH}, position not kept ({w.state_error})"
        else:
            kmsg = f"reading {KMSG_PATH}, position kept in {self.kmsg_state}"
        return [f"gpu: {self.summary}", f"gpu kernel log: {kmsg}"]

    @classmethod
    def doctor(cls, hook_mode: str, nvml=None) -> DoctorReport:
        """GPU health is optional: its absence is reported, never a problem."""
        found, reason = gpu_inventory(nvml)
        lines = ["gpu:"]
        if not found:
            lines.append(check_line(False, "nvml", f"{reason} (GPU health metrics off)", mark="--"))
        for g in found:
            detail = "not answering (GPU lost)" if g["lost"] else f"{g['model']}  {g['uuid']}"
            lines.append(check_line(not g["lost"], f"gpu {g['index']}",
                                    f"{detail}  driver {g['driver_version']}"))
        try:
            os.close(os.open(KMSG_PATH, os.O_RDONLY | os.O_NONBLOCK))
            lines.append(check_line(True, "kernel log", f"{KMSG_PATH} readable (XID, SXid, "
                                                        "fallen off the bus)"))
        except OSError as exc:
            lines.append(check_line(False, "kernel log", f"cannot read {KMSG_PATH}: "
                                    f"{exc.strerror} (GPU errors from the kernel log off)",
                                    mark="--"))
        return DoctorReport(lines)
