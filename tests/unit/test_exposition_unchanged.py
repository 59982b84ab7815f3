"""Every metric the agent exports is unchanged for the same kernel-map contents.

fixtures/exposition/maps.json holds fixed contents of every map the agent
exports (raw key/value bytes in the probes' layouts); golden.prom is what the
agent served for them, two scrapes in a row, before its subsystems were
restructured and before its exposition was written directly as bytes. The
maps are read through the probes' own read paths and the exposition is the
agent's own rendering of its registry, so a changed name, label, value,
layout decoding or lifecycle (a removed cgroup exported once more, then gone)
fails here. Families added since are left out of the comparison.
"""
import json
import os
import struct

from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

from tracehound.attribution.owners import Owners
from tracehound.attribution.resolver import WorkloadResolver
from tracehound.attribution.workload import WORKLOAD_LABELS
from tracehound.collectors.io import IoCollector
from tracehound.collectors.rdma import RdmaCollector
from tracehound.config import AgentConfig
from tracehound.exporter.exposition import TEXT, render
from tracehound.exporter.registry import register_all
from tracehound.exporter.scrape import Scraper
from tracehound.host.mounts import MountTable
from tracehound.probes.io_maps import COUNTERS_AT, HEALTH, IO_STATS, LOOKUP_OPS
from tracehound.probes.rdma_maps import MAPS as RDMA_MAPS
from tracehound.subsystems.base import Context
from tracehound.subsystems.io import IoSubsystem
from tracehound.subsystems.rdma import RdmaSubsystem

# families whose series are born on their first increment
BORN_ON_FIRST_INCREMENT = "tracehound_io_"
HERE = os.path.join(os.path.dirname(__file__), "fixtures", "exposition")
PATHS = {1: "/", 100: "/system.slice/slurmstepd.scope/job_42/step_0/user/task_0",
         101: "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod0b1c2d3e_4f50_6172"
              "_8394_a5b6c7d8e9f0.slice/cri-containerd-0123456789abcdef0123456789abcdef0123456789"
              "abcdef0123456789abcdef.scope",
         102: "/system.slice/nginx.service", 103: "/machine.slice/machine-qemu\\x2d1\\x2dvm1.scope"}
DEAD = {103}
# families the agent exports today that the reference scrape did not have
NEW_FAMILIES = ("tracehound_collector_", "tracehound_io_pagecache_fill_bytes",
                *(f"tracehound_io_{op}_not_found" for op in LOOKUP_OPS),
                "tracehound_rdma_app_", "tracehound_rdma_qp_events", "tracehound_map_evictions")
LEFT_OUT = ("tracehound_agent_allocated_blocks", "tracehound_build")
# labels families gained since: compared summed over them, series of 0 left out
# (the reference wrote every verb, called or not; they are now per caller)
ADDED_LABELS = {f: ("cgroup", *WORKLOAD_LABELS)
                for f in ("tracehound_rdma_verb_calls", "tracehound_rdma_verb_errors")}
# label values added since (new reasons of an existing family)
ADDED_VALUES = {"tracehound_rdma_mirror_drops": ("reason", ("app_full", "counters_full")),
                "tracehound_rdma_anomalies": ("kind", ("app_only_objects", "kernel_only_objects",
                                                       "link_flap", "link_restored"))}


class FixedMap:
    """A kernel map's fixed contents with the operations the probes use."""

    def __init__(self, raw):
        if isinstance(raw, dict):      # per-CPU array: index -> one value per CPU
            self.rows = {struct.pack("=I", int(k)): [bytes.fromhex(x) for x in v]
                         for k, v in raw.items()}
        else:
            self.rows = {bytes.fromhex(k): bytes.fromhex(v) for k, v in raw}

    def items(self):
        return list(self.rows.items())

    def iter_items(self):
        return iter(self.items())

    def lookup(self, key):
        return self.rows.get(key)

    def delete(self, key):
        return self.rows.pop(key, None) is not None

    def lookup_percpu_u64(self, key):
        return [struct.unpack("=Q", x)[0] for x in self.rows[key]]


class FixedCgroups:
    root = "/sys/fs/cgroup"

    def new_scrape(self):
        pass

    def alive(self, cgid):
        return cgid not in DEAD

    def removed(self, cgid):
        return not self.alive(cgid)

    def forget(self, cgid):
        pass

    def retain(self, in_use):
        return []

    def path(self, cgid):
        return PATHS.get(cgid, f"unknown:{cgid}")


def started_subsystems(maps):
    ctx = Context(AgentConfig(), MountTable(os.path.join(HERE, "mountinfo")),
                  Owners(FixedCgroups(), WorkloadResolver(job_id_source=None, pod_source=None)))
    io, rdma = IoSubsystem(ctx), RdmaSubsystem(ctx)
    # the probes as start() leaves them, over fixed maps instead of loaded ones
    io.probe._maps = {n: FixedMap(maps[n]) for n in ("io_stats", "io_health")}
    # entries as the kernel lays them out: the key in front of the counters;
    # counters appended to struct io_stats since the recording are 0
    fixed = io.probe._maps["io_stats"]
    fixed.rows = {k: v.ljust(IO_STATS.size - COUNTERS_AT, b"\0") for k, v in fixed.rows.items()}
    io.probe._entries = lambda: ((k, k + v) for k, v in fixed.iter_items())
    # and io_health entries added since (io_stats_reserve) are 0 on every CPU
    health = io.probe._maps["io_health"].rows
    for i in range(len(HEALTH)):
        health.setdefault(struct.pack("=I", i), [bytes(8)] * len(health[struct.pack("=I", 0)]))

    def retire(key):
        v = fixed.lookup(key)
        fixed.delete(key)
        return None if v is None else key + v
    io.probe._retire = retire
    io.probe.sync_mounts = lambda force=False: None
    io.probe.modes = lambda: {"io.read": "tracepoint", "io.write": "tracepoint",
                              "io.fsync": "tracepoint"}
    # golden.prom was recorded with a histogram per label set
    io.collector = IoCollector(io.probe, ctx.mounts, ctx.owners, ctx.config.max_series,
                               "cgroup-mount")
    rdma.probe._maps = {n: FixedMap(maps[n]) for n in RDMA_MAPS}
    rdma.probe.obj = object()       # available
    rdma.probe.modes = lambda: {"rdma.restrack": "fentry", "rdma.events": "fentry",
                                "rdma.verbs": "kprobe"}
    rdma._collector = RdmaCollector(rdma.probe, ctx.owners)
    return [io, rdma]


def retire_removed(subsystems) -> None:
    """What the agent's schedule does between scrapes: removed cgroups'
    entries leave the maps (and are exported once more by the next scrape)."""
    for s in subsystems:
        for job in s.detectors():
            if job.name.endswith("_retirement"):
                job.run_once(0.0)


def comparable(family: str, samples) -> dict:
    """(sample name, labels) -> value of one family's (name, labels, value)
    samples, with what changed on purpose since the reference taken out:
    label values added to the family, and labels added to it (summed over;
    series of 0 left out), I/O series at 0. Labels with an empty value are
    left out."""
    added = ADDED_LABELS.get(family, ())
    label, values = ADDED_VALUES.get(family, ("", ()))
    summed: dict = {}
    for name, labels, value in samples:
        if label and labels.get(label) in values:
            continue
        key = (name, tuple(sorted((k, v) for k, v in labels.items() if v and k not in added)))
        summed[key] = summed.get(key, 0) + value
    if family.startswith(BORN_ON_FIRST_INCREMENT):
        # an I/O counter at 0 and a histogram of no timed call are no longer
        # exported: a series is born on its counter's first increment
        untimed = {labels for (name, labels), v in summed.items()
                   if name.endswith("_count") and v == 0}
        summed = {(name, labels): v for (name, labels), v in summed.items()
                  if v and tuple(kv for kv in labels if kv[0] != "le") not in untimed}
    return {k: v for k, v in summed.items() if v or not added}


def samples(text: str) -> dict[str, tuple]:
    """Family name -> (type, help, sorted samples). Labels with an empty
    value are left out (the agent no longer writes them; Prometheus treats
    them as absent), and neither the order collectors are registered in nor
    the order of samples within a family (some come from sets) means
    anything to a scraper."""
    out = {}
    for fam in text_string_to_metric_families(text):
        if fam.name.startswith(NEW_FAMILIES) or fam.name.startswith(LEFT_OUT):
            continue
        rows = sorted((*key, v) for key, v in comparable(
            fam.name, ((s.name, s.labels, s.value) for s in fam.samples)).items())
        out[fam.name] = (fam.type, fam.documentation, rows)
    return out


def test_exposition_is_unchanged_for_the_same_map_contents():
    with open(os.path.join(HERE, "maps.json")) as f:
        maps = json.load(f)
    with open(os.path.join(HERE, "golden.prom")) as f:
        golden = f.read().split("# scrape ")[1:]
    subsystems = started_subsystems(maps)
    registry = register_all(CollectorRegistry(auto_describe=False), subsystems)
    scraper = Scraper(registry)
    for n, reference in enumerate(golden, 1):
        retire_removed(subsystems)
        # the agent's own rendering, as /metrics serves it
        now = b"".join(render(scraper.families()[0], TEXT)).decode()
        want, got = samples(reference.split("\n", 1)[1]), samples(now)
        assert sorted(got) == sorted(want), f"scrape {n}: families differ"
        for name in want:
            assert got[name] == want[name], f"scrape {n}: {name} differs"
        assert '=""' not in now
        # the verbs' callers: the Slurm job and the systemd unit of the fixture
        assert 'tracehound_rdma_verb_errors_total{cgroup="/system.slice/slurmstepd.scope/' \
               'job_42/step_0/user/task_0",errno="ENOMEM",job_id="42",op="reg_mr",step="0",' \
               'task="0",workload="slurm"} 2.0' in now
    # and the agent reported its collectors healthy
    health = [l for l in now.splitlines() if l.startswith("tracehound_collector_success")]
    assert len(health) == 4 and all(l.endswith(" 1.0") for l in health), health
