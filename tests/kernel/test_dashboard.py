"""Every metric the Grafana dashboard and the alerting rules query, and
every one the README and docs/ name, exists.

I/O, probe and agent-health names are checked against the real agent's
/metrics after real I/O. GPU and RDMA names cannot appear on a host without a
GPU or an RDMA device: they are checked against what their collectors emit,
the GPU collector over the fake NVML, the RDMA collector over a snapshot of
the probe's maps (the kernel's and the applications' views) and the RDMA port
collector over a fake sysfs tree."""
import glob
import os
import re
from types import SimpleNamespace

from prometheus_client.parser import text_string_to_metric_families

from tests.conftest import ROOT
from tests.kernel.conftest import run_in_cgroup
from tests.unit.fake_nvml import FakeNvml
from tests.unit.gpu_helpers import make_collector, make_host
from tests.unit.test_deploy_dashboard import dashboard_queries, metric_names, rule_queries
from tests.unit.test_gpu_collector import full_gpu, second_gpu
from tests.unit.test_rdma_ports import PMA, RXE_HW, add_port
from tracehound.attribution.owners import Owners
from tracehound.attribution.resolver import WorkloadResolver
from tracehound.collectors.rdma import RdmaCollector
from tracehound.commands.health import write_textfile
from tracehound.collectors.rdma_ports import RdmaPortCollector
from tracehound.detect.rdma import RdmaDetector
from tracehound.exporter.failures import FamilyFailures
from tracehound.host.rdma_ports import PortReader
from tracehound.probes.rdma_maps import AppObject, MirrorObject, RdmaSnapshot

# a histogram's bare name is what queries use once it is scraped as a native one
SUFFIXES = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count", ""),
            "summary": ("", "_sum", "_count"), "info": ("_info",)}
# a metric name in prose: not part of a recording rule's name (level:metric:ops)
DOC_NAME = re.compile(r"(?<![\w:])tracehound_[a-z0-9_]*[a-z0-9](?![\w:]|\.prom)")
# names only NVML (GPU) or the RDMA probe produce
DEVICE_PREFIXES = {"gpu": ("tracehound_gpu_", "tracehound_nic_"), "rdma": ("tracehound_rdma_",),
                   # not the agent's: `tracehound health --textfile` writes them
                   "health": ("tracehound_health_",)}


def sample_names(families) -> set[str]:
    """Names a query may use: a family's sample names by its type, so an empty
    family counts and a histogram's `_count` is not mistaken for a gauge."""
    out = set()
    for fam in families:
        out.update(fam.name + suffix for suffix in SUFFIXES.get(fam.type, ("",)))
        out.update(s.name for s in fam.samples)
    return out


def gpu_families(tmp_path):
    host = make_host(tmp_path, nodes={0: "0-3", 1: "4-7"},
                     pci={"0000:3b:00.0": 0, "0000:86:00.0": 1},
                     nics={("net", "eth0"): 0, ("infiniband", "mlx5_0"): 1},
                     procs={1234: ("/slurm/job_42", "0-3", "0"),
                            5678: ("/kubepods/pod1", "4-7", "1")})
    collector = make_collector(FakeNvml([full_gpu(), second_gpu()]), host)
    # the agent serves the detector's counters beside the collector's families,
    # and on its local channel the health families
    from tracehound.collectors.gpu_kmsg import GpuKernelLogCollector
    from tracehound.detect.gpu_kmsg import GpuKernelLog
    local = GpuKernelLogCollector(GpuKernelLog(collector.detector)).health_families()
    return list(collector.collect()) + list(collector.detector.collect()) + local


class SnapshotProbe:
    def __init__(self, snapshot):
        self._snapshot = snapshot
        self.retired = []

    def snapshot(self):
        return self._snapshot

    def app_libraries(self):
        return ["/usr/lib/x86_64-linux-gnu/libibverbs.so.1"]

    def app_refusals(self):
        return 0

    def retire_counters(self, cgroup_ids):
        self.retired.append(cgroup_ids)


class Cgroups:
    def new_scrape(self):
        pass

    def alive(self, cgroup_id):
        return True

    def removed(self, cgroup_id):
        return False

    def forget(self, cgroup_id):
        pass

    def path(self, cgroup_id):
        return f"/job/{cgroup_id}"

    def retain(self, in_use):
        return []


def rdma_families(tmp_path):
    """Every RDMA family with samples: the probe's kernel and application views
    (a failed reg_mr in both, a create refused in libibverbs), the detector's
    anomalies, and the port collector over IB and soft-RoCE ports in sysfs."""
    snap = RdmaSnapshot(
        objects=[MirrorObject(0, "qp", 17, 4242, 99, 1, 1, "ib_write_bw")],
        verbs={("reg_mr", 0, 99): 5, ("reg_mr", 12, 99): 2},
        app_objects=[AppObject(4242, "qp", 0x20, 0x10, "rxe0", 17, 99, 1, "ib_write_bw")],
        app_verbs={("create_qp", 0, 99, "rxe0"): 1, ("reg_mr", 12, 99, "rxe0"): 2,
                   ("create_cq", 0xFFFFFFFF, 99, "rxe0"): 1},
        events={(0, 1, "PORT_ERR"): 1}, qp_events={(0, 1, "QP_FATAL", 4242, 99): 1},
        qp_states={"RTS": 1}, health={"objects_full": 0}, devices={0: "rxe0"})
    owners = Owners(Cgroups(), WorkloadResolver(job_id_source=None, pod_source=None))
    root = tmp_path / "rdma-sysfs" / "class" / "infiniband"    # gpu_families has tmp_path/sys
    add_port(root, "mlx5_0", 1, counters=PMA, hw={"out_of_sequence": 5, "local_ack_timeout_err": 1})
    add_port(root, "rxe0", 1, rate="10 Gb/sec (1X FDR10)", link_layer="Ethernet", hw=RXE_HW,
             netdev="eth0")
    ports = RdmaPortCollector(PortReader(root=str(root)))
    return (list(RdmaCollector(SnapshotProbe(snap), owners).collect())
            + list(RdmaDetector().collect()) + list(ports.collect()))


def used_names() -> dict[str, list[str]]:
    used: dict[str, list[str]] = {}
    for where, text in dashboard_queries() + rule_queries():
        for name in metric_names(text):
            used.setdefault(name, []).append(where)
    return used


def health_families(tmp_path):
    """What `tracehound health --textfile` writes for a drained, unfit node."""
    path = tmp_path / "tracehound_health.prom"
    verdict = SimpleNamespace(findings=[SimpleNamespace(condition="gpu_lost")], refusal=None,
                              action="drain", common_mode={}, pending="")
    write_textfile(str(path), verdict, 0.1)
    return list(text_string_to_metric_families(path.read_text()))


def doc_names() -> dict[str, list[str]]:
    """Metric names the README and docs/ name (not recording rules' names)."""
    used: dict[str, list[str]] = {}
    for path in [os.path.join(ROOT, "README.md"),
                 *sorted(glob.glob(os.path.join(ROOT, "docs", "*.md")))]:
        with open(path) as f:
            for name in set(DOC_NAME.findall(f.read())):
                used.setdefault(name, []).append(os.path.relpath(path, ROOT))
    return used


def test_dashboard_and_alert_metrics_exist(agent, cgroup_root, cgroup, tmpfs, tmp_path):
    d = os.path.join(tmpfs, "dash-" + cgroup.rsplit("/", 1)[1])
    # every operation, so every I/O family has samples for this cgroup
    run_in_cgroup(cgroup_root, cgroup, [
        ["mkdir", d], ["write", d + "/f", 100_000, 4096], ["read", d + "/f", 4096],
        ["fsync", d + "/f"], ["create", d + "/g"], ["open", d + "/missing"],
        ["rename", d + "/g", d + "/h"], ["unlink", d + "/h"], ["unlink", d + "/f"],
        ["rmdir", d],
    ])
    text = agent.scrape_text()
    assert f'cgroup="{cgroup}"' in text
    # the agent's counter of families it failed to render has a series only
    # once one failed: one failure, in a registry of its own
    failed = FamilyFailures()
    failed.record("tracehound_x", ValueError("x"))
    exported = {"agent": sample_names(text_string_to_metric_families(text))
                | sample_names([failed.family()]),
                "gpu": sample_names(gpu_families(tmp_path)),
                "rdma": sample_names(rdma_families(tmp_path)),
                "health": sample_names(health_families(tmp_path))}
    used = used_names()
    assert len(used) > 40
    for name, where in doc_names().items():
        used.setdefault(name, []).extend(where)
    missing = []
    for name, where in sorted(used.items()):
        source = next((dev for dev, prefixes in DEVICE_PREFIXES.items()
                       if name.startswith(prefixes)), "agent")
        # a device metric may also come from the agent, if this host has the device
        if name not in exported[source] and name not in exported["agent"]:
            missing.append(f"{name} ({source}; used by {', '.join(where)})")
    assert missing == [], "queried but never exported:\n" + "\n".join(missing)


def test_every_rdma_family_has_samples(tmp_path):
    """The fakes above reach every RDMA family with data, not just its name."""
    empty = [fam.name for fam in rdma_families(tmp_path) if not fam.samples]
    assert empty == []


def test_sample_names_follow_family_types():
    fams = list(text_string_to_metric_families(
        "# TYPE a_seconds histogram\n"
        'a_seconds_bucket{le="+Inf"} 1\na_seconds_sum 0.5\na_seconds_count 1\n'
        "# TYPE b counter\nb_total 3\n# TYPE c_count gauge\nc_count 1\n"))
    assert sample_names(fams) == {"a_seconds", "a_seconds_bucket", "a_seconds_sum",
                                  "a_seconds_count", "b_total", "c_count"}
