"""GPU errors from the kernel log, merged XIDs and GPU health -> metric families.

Read-only: it copies what detect/gpu_kmsg.GpuKernelLog counted on the
sources' threads and what the kernel-log watcher (gpu/kmsg.py) counted of
its own work. Nothing here reads /dev/kmsg or NVML.

Every per-GPU family is labelled gpu, uuid, model (empty when NVML did not
enumerate the GPU: no driver, a broken one, or a synthetic bus id) and
pci_bus_id, the name the kernel log gives it; label values are bounded
(detect/gpu_kmsg.py): the rest count under "other".
"""
from __future__ import annotations

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, InfoMetricFamily

from ..gpu.xid_catalog import entries, lookup

IDENTITY = ["gpu", "uuid", "model", "pci_bus_id"]


def _by_text(item):
    """Sort key of a count: label values are numbers, text, "other" or None."""
    return tuple(str(v) for v in item[0])


class GpuKernelLogCollector:
    name = "gpu_kmsg"

    def __init__(self, hub, watcher=None):
        self.hub = hub            # detect.gpu_kmsg.GpuKernelLog
        self.watcher = watcher    # gpu.kmsg.KmsgWatcher, None when not started

    def _lv(self, key) -> list[str]:
        labels = self.hub.identity(key)
        return [labels[k] for k in IDENTITY]

    def collect(self):
        counts = self.hub.snapshot()
        yield from self._xid_families(counts)
        yield from self._kernel_families(counts)
        yield self._health_family()
        yield from self._watcher_families()

    def _xid_families(self, counts):
        xid = CounterMetricFamily(
            "tracehound_gpu_xid_errors",
            "XID errors, each counted once whether NVML or the kernel log reported it first.",
            labels=[*IDENTITY, "xid"])
        for (key, number), n in sorted(counts.xids.items(), key=_by_text):
            xid.add_metric([*self._lv(key), str(number)], n)
        dups = CounterMetricFamily(
            "tracehound_gpu_xid_duplicates",
            "XID reports folded into the same XID already reported by the other source.",
            labels=["source"])
        for source, n in sorted(counts.duplicates.items()):
            dups.add_metric([source], n)
        # The whole catalog (about 65 series, fixed) so a rule can join a
        # name and severity onto any XID, plus numbers seen outside it.
        info = InfoMetricFamily("tracehound_gpu_xid",
                                "What an XID number means: name and severity (fatal, error, "
                                "warning, info).", labels=["xid"])
        numbers = {e.xid for e in entries()} | set(counts.xid_numbers)
        for number in sorted(numbers):
            e = lookup(number)
            info.add_metric([str(number)], {"name": e.name, "severity": e.severity})
        return [xid, dups, info]

    def _kernel_families(self, counts):
        sxid = CounterMetricFamily(
            "tracehound_gpu_nvswitch_sxid_errors",
            "NVSwitch SXid errors in the kernel log, by switch and fatal or non-fatal.",
            labels=["device", "pci_bus_id", "sxid", "severity"])
        for (device, pci, number, severity), n in sorted(counts.sxids.items(), key=_by_text):
            sxid.add_metric([device, pci, str(number), severity], n)
        fallen = CounterMetricFamily(
            "tracehound_gpu_fallen_off_bus",
            "Kernel log lines saying a GPU has fallen off the bus.", labels=IDENTITY)
        for key, n in sorted(counts.fallen.items(), key=lambda kv: str(kv[0])):
            fallen.add_metric(self._lv(key), n)
        init = CounterMetricFamily(
            "tracehound_gpu_init_failures",
            "Kernel log lines saying the driver failed to initialise a GPU.",
            labels=["pci_bus_id", "device"])
        for (pci, device), n in sorted(counts.init_failed.items()):
            init.add_metric([pci, device], n)
        folded = CounterMetricFamily(
            "tracehound_gpu_kmsg_folded",
            "Kernel log GPU reports counted under the label value \"other\": a bus id NVML did "
            "not enumerate, an XID outside the catalog, an SXid or a device name beyond the few "
            "kept, by label.", labels=["label"])
        for label, n in sorted(counts.folded.items()):
            folded.add_metric([label], n)
        return [sxid, fallen, init, folded]

    def health_families(self):
        """What `tracehound health` decides on, for the agent's local channel
        (exporter/local.py): the health conditions and the fatal XIDs logged
        within the window, each with how long ago. From state the agent
        keeps: nothing is read and no other family is rendered."""
        recent = GaugeMetricFamily(
            "tracehound_gpu_recent_fatal_xid_age_seconds",
            "Seconds since a fatal XID was last logged for this GPU, for the XIDs logged "
            "within the fatal-XID window only.", labels=[*IDENTITY, "xid"])
        for key, xids in self.hub.health.recent_fatal_xids().items():
            lv = self._lv(key)
            for number, age in xids.items():
                recent.add_metric([*lv, str(number)], round(age, 3))
        return [self._health_family(), recent]

    def _health_family(self):
        fam = GaugeMetricFamily(
            "tracehound_gpu_health",
            "1 while a GPU health condition holds, 0 once it cleared: lost, "
            "uncorrectable_ecc_pending, row_remap_failure, thermal_slowdown, nvlink_down, "
            "recent_fatal_xid.", labels=[*IDENTITY, "condition"])
        for key, conditions in self.hub.health.conditions().items():
            lv = self._lv(key)
            for condition, value in sorted(conditions.items()):
                fam.add_metric([*lv, condition], value)
        return fam

    def _watcher_families(self):
        w = self.watcher
        up = GaugeMetricFamily("tracehound_gpu_kmsg_up",
                               "1 while the agent reads GPU errors from the kernel log (0 while "
                               "a failed reader waits to be reopened).")
        up.add_metric([], int(w is not None and w.running and w.up))
        out = [up]
        if w is None:
            return out
        for name, value, doc in (
                ("records_read", w.records_read, "Kernel log records read."),
                ("malformed", w.malformed,
                 "NVIDIA driver lines (Xid, SXid) skipped because they did not parse."),
                ("records_lost", w.records_lost,
                 "Kernel log records overwritten before the agent read them."),
                ("overruns", w.overruns, "Reads the kernel ring overtook (EPIPE)."),
                ("restarts", w.restarts,
                 "Times the kernel log reader failed and was reopened after a pause.")):
            fam = CounterMetricFamily(f"tracehound_gpu_kmsg_{name}", doc)
            fam.add_metric([], value)
            out.append(fam)
        return out
