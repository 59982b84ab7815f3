"""RDMA probe snapshots -> Prometheus metric families, at scrape time."""
from __future__ import annotations

import threading

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from ..attribution.owners import Owners
from ..attribution.workload import WORKLOAD_LABELS
from ..probes.rdma_maps import HEALTH, QP_STATES, MirrorObject, errno_name

KERNEL_OWNER = "kernel"                 # cgroup label of objects a kernel module owns


class RdmaCollector:
    """prometheus_client collector over a started RdmaProbe."""

    name = "rdma"

    def __init__(self, probe, owners: Owners):
        self.probe = probe
        self.owners = owners
        # removed cgroups' last verb counters, keyed as exported, until a
        # scrape exports them: (op, errno, *labels) and (op, errno, device, *labels)
        self._final_verbs: dict[tuple, int] = {}
        self._final_app: dict[tuple, int] = {}
        self._lock = threading.Lock()

    def retire_removed(self) -> int:
        """Removed cgroups' verb counters leave the kernel maps on the
        agent's schedule (subsystems/rdma.py), whether or not anyone scrapes;
        their last values wait, named, for the next scrape. Returns how many
        cgroups went."""
        snap = self.probe.snapshot(objects=False)
        self.owners.new_scrape()
        counted = {k[2] for k in snap.verbs} | {k[2] for k in snap.app_verbs}
        gone = {cgid for cgid in counted if self.owners.removed(cgid)}
        with self._lock:
            for (op, err, cgid), n in snap.verbs.items():
                if cgid in gone:
                    self._hold(self._final_verbs, cgid, (op, err), n)
            for (op, err, cgid, dev), n in snap.app_verbs.items():
                if cgid in gone:
                    self._hold(self._final_app, cgid, (op, err, dev), n)
        if gone:
            self.probe.retire_counters(gone)
        # QP events are not retired: their owners keep their names
        self.owners.retain(self.name, (counted - gone) | {k[4] for k in snap.qp_events}, gone)
        return len(gone)

    def _hold(self, into: dict, cgid: int, key: tuple, n: int) -> None:
        labels = self.owners.labels(cgid)     # before this turn's pruning forgets it
        if self.owners.in_scope(labels[0]):
            k = (*key, *labels)
            into[k] = into.get(k, 0) + n

    def _labels(self, cgid: int) -> tuple[str, ...] | None:
        """A live cgroup's labels; None for one this scrape does not export
        (removed: its counters are exported once retired; another node's)."""
        if not self.owners.alive(cgid):
            return None
        labels = self.owners.labels(cgid)
        return labels if self.owners.in_scope(labels[0]) else None

    def owner_label(self, obj: MirrorObject) -> str:
        return self.owners.path(obj.cgroup_id) if obj.user else KERNEL_OWNER

    def collect(self):
        """Reads a snapshot and exports it; changes nothing."""
        snap = self.probe.snapshot()
        self.owners.new_scrape()
        with self._lock:
            final_verbs, self._final_verbs = self._final_verbs, {}
            final_app, self._final_app = self._final_app, {}
        objects = GaugeMetricFamily(
            "tracehound_rdma_objects",
            "Live RDMA objects in the kernel's resource tracker, mirrored in BPF "
            f"(cgroup '{KERNEL_OWNER}': owned by a kernel module).",
            labels=["device", "type", "cgroup", *WORKLOAD_LABELS])
        # Objects far outnumber owners: labels are resolved once per owner,
        # in the order the objects first name them.
        per_owner: dict[tuple[int, str, bool, int], tuple[MirrorObject, int]] = {}
        for o in snap.objects:
            owner_key = (o.device, o.type, o.user, o.cgroup_id if o.user else 0)
            first, n = per_owner.get(owner_key, (o, 0))
            per_owner[owner_key] = (first, n + 1)
        counts: dict[tuple[str, ...], int] = {}
        for o, n in per_owner.values():
            owner = self.owner_label(o)
            if o.user and not self.owners.in_scope(owner):   # another node's (--cgroup-scope)
                continue
            workload = self.owners.workload(owner) if o.user else ("",) * len(WORKLOAD_LABELS)
            key = (snap.device_name(o.device), o.type, owner, *workload)
            counts[key] = counts.get(key, 0) + n
        for labels, n in sorted(counts.items()):
            objects.add_metric(list(labels), n)
        yield objects

        owner = ["cgroup", *WORKLOAD_LABELS]
        calls = CounterMetricFamily("tracehound_rdma_verb_calls",
                                    "User verbs that reached the kernel, successful or not.",
                                    labels=["op", *owner])
        errors = CounterMetricFamily("tracehound_rdma_verb_errors",
                                     "User verbs that returned an error, by errno.",
                                     labels=["op", "errno", *owner])
        # (op, errno, *labels) -> calls: live cgroups' and the retired ones' last
        rows = dict(final_verbs)
        for (op, err, cgid), n in snap.verbs.items():
            labels = self._labels(cgid)
            if labels is not None:
                rows[(op, err, *labels)] = rows.get((op, err, *labels), 0) + n
        per_call: dict[tuple, int] = {}
        for (op, _err, *labels), n in rows.items():
            per_call[(op, *labels)] = per_call.get((op, *labels), 0) + n
        for key, n in sorted(per_call.items()):
            calls.add_metric(list(key), n)
        for (op, err, *labels), n in sorted(rows.items()):
            if err:
                errors.add_metric([op, errno_name(err), *labels], n)
        yield calls
        yield errors
        yield from self._app_view(snap, owner, final_app)
        # objects keep their owners' names while they exist
        self.owners.retain(self.name + "_objects", {o.cgroup_id for o in snap.objects if o.user}
                           | {o.cgroup_id for o in snap.app_objects})

        events = CounterMetricFamily("tracehound_rdma_async_events",
                                     "Asynchronous events the RDMA core dispatched.",
                                     labels=["device", "port", "event"])
        summed = dict(snap.events)
        for (dev, port, event, _tgid, _cgid), n in snap.qp_events.items():
            summed[(dev, port, event)] = summed.get((dev, port, event), 0) + n
        for (dev, port, event), n in sorted(summed.items()):
            events.add_metric([snap.device_name(dev), str(port), event], n)
        yield events
        owned = CounterMetricFamily("tracehound_rdma_qp_events",
                                    "Asynchronous QP events, by the QP's owner.",
                                    labels=["device", "port", "event", *owner])
        per_owner: dict[tuple, int] = {}
        for (dev, port, event, _tgid, cgid), n in snap.qp_events.items():
            labels = self.owners.labels(cgid)
            if not self.owners.in_scope(labels[0]):
                continue
            key = (snap.device_name(dev), str(port), event, *labels)
            per_owner[key] = per_owner.get(key, 0) + n
        for key, n in sorted(per_owner.items()):
            owned.add_metric(list(key), n)
        yield owned

        states = CounterMetricFamily("tracehound_rdma_qp_transitions",
                                     "Successful QP state changes, by target state.",
                                     labels=["to_state"])
        for state in QP_STATES:
            states.add_metric([state], snap.qp_states.get(state, 0))
        yield states

        health = CounterMetricFamily("tracehound_rdma_mirror_drops",
                                     "Tracker updates the BPF mirror could not apply.",
                                     labels=["reason"])
        for name in HEALTH:
            health.add_metric([name], snap.health.get(name, 0))
        yield health

    def _app_view(self, snap, owner: list, final: dict[tuple, int]):
        """What libibverbs handed processes, and its calls (uprobes)."""
        libraries = GaugeMetricFamily(
            "tracehound_rdma_app_libraries",
            "libibverbs files the application view is attached to (a container's copy is "
            "named through /proc/PID/root).", labels=["path"])
        for path in self.probe.app_libraries():
            libraries.add_metric([path], 1)
        yield libraries
        yield CounterMetricFamily(
            "tracehound_rdma_app_libraries_refused",
            "libibverbs files the application view refused (not a regular file in the "
            "process's root, not the file it maps, unreadable or malformed ELF, over a bound; "
            "each reason is in the log).", value=self.probe.app_refusals())
        objects = GaugeMetricFamily(
            "tracehound_rdma_app_objects",
            "RDMA objects processes hold as libibverbs handed them (the application's view).",
            labels=["device", "type", *owner])
        counts: dict[tuple, int] = {}
        for o in snap.app_objects:
            labels = self.owners.labels(o.cgroup_id)
            if not self.owners.in_scope(labels[0]):
                continue
            key = (o.device, o.type, *labels)
            counts[key] = counts.get(key, 0) + 1
        for key, n in sorted(counts.items()):
            objects.add_metric(list(key), n)
        yield objects
        calls = CounterMetricFamily("tracehound_rdma_app_verb_calls",
                                    "libibverbs create, destroy and modify calls, successful "
                                    "or not.", labels=["op", "device", *owner])
        errors = CounterMetricFamily(
            "tracehound_rdma_app_verb_errors",
            "libibverbs calls that failed, by errno ('userspace': a create refused before any "
            "kernel call failed, whose errno is not seen).", labels=["op", "errno", "device", *owner])
        rows = dict(final)            # (op, errno, device, *labels) -> calls
        for (op, err, cgid, dev), n in snap.app_verbs.items():
            labels = self._labels(cgid)
            if labels is not None:
                rows[(op, err, dev, *labels)] = rows.get((op, err, dev, *labels), 0) + n
        per_call: dict[tuple, int] = {}
        for (op, err, dev, *labels), n in sorted(rows.items()):
            key = (op, dev, *labels)
            per_call[key] = per_call.get(key, 0) + n
            if err:
                errors.add_metric([op, errno_name(err), dev, *labels], n)
        for key, n in sorted(per_call.items()):
            calls.add_metric(list(key), n)
        yield calls
        yield errors
