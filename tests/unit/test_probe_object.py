"""The compiled probe objects and the hook tables must agree."""
import pytest

from tracehound.bpf import features
from tracehound.bpf.loader import BpfObject
from tracehound.probes import io, io_maps, object_path


@pytest.mark.parametrize("name", ["io", io.COMPAT_OBJECT])
def test_every_planned_program_exists_and_nothing_is_orphaned(name):
    # Opening an object parses it; no privileges or kernel support needed.
    with BpfObject(object_path(name)) as obj:
        names = set(obj.programs)
    # attached with any timed call in syscall or fentry mode
    planned = {io.CLOCK_MOVER}
    for group in io.GROUPS:
        # a group hooked by its own trace events whatever the mode has one mode
        for mode in (dict(group.modes) if group.any_mode else features.MODES):
            progs = group.programs(mode)
            assert progs, (group.name, mode)
            planned.update(progs)
    assert planned - names == set(), f"planned but not in {name}.bpf.o"
    assert names - planned == set(), f"in {name}.bpf.o but never loaded"


def test_op_masks_partition_the_operations():
    masks = [io_maps.op_mask(g.name) for g in io.GROUPS]
    # every operation has one group; the syscall-exit groups have a bit of their own
    assert sum(masks) == (1 << len(io_maps.OPS)) - 1 + sum(io_maps.TP_BITS.values())
    assert all(io_maps.op_mask(g) for g in io_maps.TP_BITS)
    for i, a in enumerate(masks):
        for b in masks[i + 1:]:
            assert a & b == 0


def test_a_usable_mode_says_what_it_hooks():
    checks = (lambda: features.ModeCheck(True, "tp_btf sys_enter/sys_exit: read, pread64"),)
    group = features.HookGroup("g", (("tracepoint", features.HookMode(("p",), checks)),))
    plan = features.plan([group], "tracepoint")[0]
    assert plan.mode == "tracepoint"
    assert plan.checks["tracepoint"].reason == "tp_btf sys_enter/sys_exit: read, pread64"
