"""The RDMA probe object, its hook tables, and how it reports a host without
RDMA (this one: no ib_core, no fentry, no kprobes)."""
import re
from pathlib import Path

import pytest

from tracehound.bpf import features
from tracehound.bpf.loader import BpfObject
from tracehound.attribution.cgroups import CgroupResolver
from tracehound.attribution.owners import Owners
from tracehound.attribution.resolver import WorkloadResolver
from tracehound.config import AgentConfig
from tracehound.host import rdma as host_rdma
from tracehound.host.mounts import MountTable
from tracehound.probes import io as io_probe
from tracehound.probes import object_path
from tracehound.probes import rdma as probe_mod
from tracehound.probes import rdma_maps as layout
from tracehound.subsystems.base import Context
from tracehound.subsystems.rdma import RdmaSubsystem

PROBES = Path(probe_mod.__file__).parent


def context() -> Context:
    owners = Owners(CgroupResolver("/sys/fs/cgroup"),
                    WorkloadResolver(job_id_source=None, pod_source=None))
    return Context(AgentConfig(), MountTable(), owners)


def test_every_planned_program_exists_and_nothing_is_orphaned():
    with BpfObject(object_path("rdma")) as obj:
        names = set(obj.programs)
    planned = set()
    for group in probe_mod.rdma_groups(present=set(probe_mod.OPTIONAL)):
        for mode in probe_mod.MODES:
            progs = group.programs(mode)
            assert progs, (group.name, mode)
            planned.update(progs)
    planned |= probe_mod.APP_PROGRAMS
    assert planned - names == set(), "planned but not in rdma.bpf.o"
    assert names - planned == set(), "in rdma.bpf.o but never loaded"


def test_optional_functions_are_left_out_where_the_kernel_lacks_them():
    restrack = probe_mod.rdma_groups(present=set())[0]
    assert restrack.mode("fentry").summary == "rdma_restrack_add, rdma_restrack_del"
    assert "fe_rdma_restrack_commit_del" not in restrack.programs("fentry")


def test_rdma_groups_never_plan_a_tracepoint_mode():
    for group in probe_mod.rdma_groups(present=set()):
        assert "tracepoint" not in dict(group.modes)
    # the I/O groups keep all three modes, but those hooked by trace events whatever the mode
    assert all(tuple(m for m, _ in g.modes) == features.MODES
               for g in io_probe.GROUPS if not g.any_mode)
    assert all(tuple(m for m, _ in g.modes) == ("tracepoint",)
               for g in io_probe.GROUPS if g.any_mode)


def _c_enum(source: str, name: str) -> list[str]:
    body = re.search(rf"enum {name} \{{(.*?)\}};", source, re.DOTALL).group(1)
    return [m.split("=")[0].strip() for m in body.replace("\n", " ").split(",") if m.strip()]


def test_python_tables_follow_the_c_enums():
    src = (PROBES / "rdma.h").read_text()
    ops = [m for m in _c_enum(src, "rdma_op") if m != "OP_NONE"]
    assert [m.removeprefix("OP_").lower() for m in ops] == list(layout.OPS)
    types = [m for m in _c_enum(src, "obj_type") if m != "OBJ_OTHER"]
    assert [m.removeprefix("OBJ_").lower() for m in types] == list(host_rdma.TYPES)
    health = [m for m in _c_enum(src, "rdma_health") if m != "H_MAX"]
    assert [m.removeprefix("H_").lower() for m in health] == list(layout.HEALTH)


def test_struct_sizes_match_the_decoders():
    src = (PROBES / "rdma.h").read_text()
    assert "__u32 dev;\n\t__u32 type;\n\t__u32 id;\n\t__u32 pad;" in src
    assert layout.OBJ_KEY.size == 16
    # u64 cgroup, u64 created, u32 tgid, u32 flags, comm[16], u32 lkey, u32 pad
    assert layout.OBJ_VALUE.size == 48


def test_probe_on_a_host_without_rdma_says_why(monkeypatch):
    monkeypatch.setattr(probe_mod, "subsystem_absent", lambda: "no RDMA subsystem: test")
    probe = probe_mod.RdmaProbe().start()
    assert not probe.available
    assert probe.modes() == {} and probe.missing() == {}
    rdma = RdmaSubsystem(context())
    rdma.start()
    assert rdma.status_lines() == ["rdma: not available (no RDMA subsystem: test)"]
    assert rdma.collectors() == [] and rdma.detectors() == []
    rdma.close()


@pytest.mark.skipif(probe_mod.subsystem_absent() is None, reason="this host has an RDMA subsystem")
def test_this_host_reports_rdma_not_available():
    probe = probe_mod.RdmaProbe().start()
    assert not probe.available
    assert "ib_core" in probe.reason
    assert probe_mod.doctor_line().startswith("rdma         -> not available (no RDMA subsystem")
    rdma = RdmaSubsystem(context())
    rdma.start()
    assert rdma.status_lines()[0].startswith("rdma: not available (")
    rdma.close()


def test_a_forced_tracepoint_mode_has_no_rdma_hooks(monkeypatch):
    monkeypatch.setattr(probe_mod, "subsystem_absent", lambda: None)
    probe = probe_mod.RdmaProbe(probe_mod.RdmaProbeConfig(hook_mode="tracepoint")).start()
    assert not probe.available
    assert probe.reason == "hook mode tracepoint has no RDMA hooks (use auto, fentry or kprobe)"


def test_plan_reports_forced_mode_a_group_lacks():
    group = probe_mod.rdma_groups(present=set())[0]
    plan = features.plan([group], "tracepoint")[0]
    assert plan.mode is None
    assert plan.checks["tracepoint"].reason == "no tracepoint hooks exist for this group"


def test_kernel_functions_reads_kallsyms(tmp_path, monkeypatch):
    fake = tmp_path / "kallsyms"
    fake.write_text("ffffffffc0000000 T rdma_restrack_commit_del\t[ib_core]\n"
                    "ffffffffc0000010 r __ksymtab_rdma_restrack_add\t[ib_core]\n"
                    "ffffffff81000000 t rdma_restrack_parent_name\n")
    real_open = open
    monkeypatch.setattr("builtins.open",
                        lambda p, *a, **k: real_open(fake if p == "/proc/kallsyms" else p, *a, **k))
    features.kallsyms_table.cache_clear()   # read the fake, and leave no fake behind
    try:
        # a module's and the kernel's own; a name only some other symbol's
        # part of, or not text, is not a function
        assert probe_mod.kernel_functions(["rdma_restrack_commit_del", "rdma_restrack_add",
                                           "rdma_restrack_parent_name", "restrack_commit_del",
                                           "rdma_restrack_parent"]) == \
            {"rdma_restrack_commit_del", "rdma_restrack_parent_name"}
    finally:
        features.kallsyms_table.cache_clear()
