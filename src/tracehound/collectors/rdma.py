"""RDMA probe snapshots -> Prometheus metric families, at scrape time."""
from __future__ import annotations

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

    def owner_label(self, obj: MirrorObject) -> str:
        return self.owners.path(obj.cgroup_id) if obj.user else KERNEL_OWNER

    def collect(self):
        snap = self.probe.snapshot()
        self.owners.new_scrape()
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
        per_call: dict[tuple, int] = {}
        for (op, err, cgid), n in snap.verbs.items():
            labels = self.owners.labels(cgid)
            if self.owners.in_scope(labels[0]):
                key = (op, *labels)
                per_call[key] = per_call.get(key, 0) + n
        for key, n in sorted(per_call.items()):
            calls.add_metric(list(key), n)
        for (op, err, cgid), n in sorted(snap.errors().items()):
            labels = self.owners.labels(cgid)
            if self.owners.in_scope(labels[0]):
                errors.add_metric([op, errno_name(err), *labels], n)
        yield calls
        yield errors
        yield from self._app_view(snap, owner)
        # counters of removed cgroups were exported above for the last time
        counted = {k[2] for k in snap.verbs} | {k[2] for k in snap.app_verbs} | \
            {k[4] for k in snap.qp_events}
        gone = {cgid for cgid in counted if not self.owners.alive(cgid)}
        if gone:
            self.probe.retire_counters(gone)
        self.owners.retain(self.name, {o.cgroup_id for o in snap.objects if o.user}
                           | {o.cgroup_id for o in snap.app_objects} | (counted - gone), gone)

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

    def _app_view(self, snap, owner: list):
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
        per_call: dict[tuple, int] = {}
        for (op, err, cgid, dev), n in sorted(snap.app_verbs.items()):
            labels = self.owners.labels(cgid)
            if not self.owners.in_scope(labels[0]):
                continue
            key = (op, dev, *labels)
            per_call[key] = per_call.get(key, 0) + n
            if err:
                errors.add_metric([op, errno_name(err), dev, *labels], n)
        for key, n in sorted(per_call.items()):
            calls.add_metric(list(key), n)
        yield calls
        yield errors
