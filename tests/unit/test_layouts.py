"""Python's view of the probes' map keys, values and enums must match the
BTF of the built objects; and check() itself must catch what it claims to."""
import json
import os
import shutil
import subprocess

import pytest

from tracehound.bpf.layout import EnumLayout, Layout, check, read_btf
from tracehound.probes import cgroup_names as names_mod
from tracehound.probes import exits as exits_mod
from tracehound.probes import io_maps as io_mod
from tracehound.probes import net as net_mod
from tracehound.probes import object_path
from tracehound.probes import rdma_maps as rdma_mod


IO_STATS = io_mod.IO_STATS
# each probe module declares its object and the layouts it reads and writes
PROBES = [(m.OBJECT, m.LAYOUTS) for m in (io_mod, rdma_mod, net_mod, exits_mod, names_mod)]

OBJECTS = ("io", "rdma", "hookprobe", "netfault", "net", "exits", "cgroup_names")


def built(name):
    """The probe object's path; scripts/install builds every object, so one
    that is missing is a broken install."""
    path = object_path(name)
    if not os.path.exists(path):
        pytest.fail(f"{name}.bpf.o is not built ({path}): run scripts/install --dev "
                    "(or make -C src/tracehound/probes)")
    return path


_BTF = {}


def btf(name):
    if name not in _BTF:
        _BTF[name] = read_btf(built(name))
    return _BTF[name]


# --- the declared layouts against the objects ------------------------------

CASES = [pytest.param(obj, lay, id=f"{obj}-{lay.c_name}")
         for obj, layouts in PROBES for lay in layouts]


@pytest.mark.parametrize("obj, layout", CASES)
def test_layout_matches_the_object_btf(obj, layout):
    if isinstance(layout, EnumLayout):
        # btf_keep.h's BTF_KEEP names every enum of the contract in the object
        assert layout.c_name in btf(obj).enums, f"enum {layout.c_name} is not in {obj}.bpf.o's BTF"
    assert check(built(obj), [layout]) == []


def test_io_stats_is_the_flat_array_python_reads():
    # probes/io_maps.py reads io_stats as its owner key and one flat array of
    # N_FIELDS u64
    assert IO_STATS.fields[0].name == "owner" and IO_STATS.fields[0].size == io_mod.COUNTERS_AT
    assert IO_STATS.size == io_mod.COUNTERS_AT + 8 * io_mod.N_FIELDS


# --- check() must fail where it should -------------------------------------

IO_KEY_SWAPPED = Layout("io_key", [("cgroup_id", "Q"), ("flags", "I"), ("mnt", "I")])


def test_check_reports_a_wrong_offset():
    assert check(built("io"), [IO_KEY_SWAPPED]) == [
        "struct io_key: field flags at offset 12, Python says 8",
        "struct io_key: field mnt at offset 8, Python says 12",
    ]


def test_check_reports_a_wrong_size_and_a_missing_field():
    short = Layout("io_key", [("cgroup_id", "Q"), ("mnt", "I")])
    assert check(built("io"), [short]) == [
        "struct io_key: size 16, Python says 12",
        "struct io_key: C field flags (offset 12, 4 bytes) missing in Python",
    ]
    fewer_ops = Layout("io_stats", [(f.name, f.fmt) if f.count is None else
                                    (f.name, f.fmt, f.count - (f.name == "errors"))
                                    for f in IO_STATS.fields])
    problems = check(built("io"), [fewer_ops])
    assert problems[0] == f"struct io_stats: size {IO_STATS.size}, Python says {IO_STATS.size - 8}"
    assert "struct io_stats: field errors is 72 bytes, Python says 64" in problems
    assert "struct io_stats: field not_found at offset 176, Python says 168" in problems


def test_check_reports_element_size_and_signedness():
    wrong = Layout("io_key", [("cgroup_id", "q"), ("mnt", "H", 2), ("flags", "I")])
    assert check(built("io"), [wrong]) == [
        "struct io_key: field cgroup_id is unsigned in C, Python says 'q'",
        "struct io_key: field mnt has 4-byte elements, Python says 2",
    ]


def test_check_reports_unknown_structs_and_enums():
    assert check(built("io"), [
        Layout("no_such_struct", [("x", "I")]),
        EnumLayout("no_such_enum", ("a",), "X_"),
    ]) == [
        "struct no_such_struct not in the object's BTF (no map or program uses it)",
        "enum no_such_enum not in the object's BTF (used only as constants?)",
    ]


RESTRACK = ("pd", "cq", "qp", "cm_id", "mr", "ctx", "counter", "srq")


def test_check_reports_wrong_enum_values():
    # rdma_restrack_type is the one enum of rdma.bpf.o that its BTF carries
    path = built("rdma")
    assert check(path, [EnumLayout("rdma_restrack_type", RESTRACK, "RDMA_RESTRACK_")]) == []
    without_counter = tuple(n for n in RESTRACK if n != "counter")
    assert check(path, [EnumLayout("rdma_restrack_type", without_counter, "RDMA_RESTRACK_",
                                   stop="RDMA_RESTRACK_MAX")]) == [
        "enum rdma_restrack_type: RDMA_RESTRACK_SRQ = 7, Python says 6",
        "enum rdma_restrack_type: no enumerator RDMA_RESTRACK_MAX in C, Python says 7",
        "enum rdma_restrack_type: RDMA_RESTRACK_COUNTER = 6 has no Python name",
    ]


def test_implicit_padding_must_be_declared_as_a_pad_field():
    # struct ib_qp: a pointer, a u32, 4 bytes of padding, then a nested struct
    path = built("rdma")
    fields = [("device", "Q"), ("port", "I"), ("pad", "I"), ("res", "40s")]
    assert check(path, [Layout("ib_qp", fields)]) == []
    unpadded = [f for f in fields if f[0] != "pad"]
    assert check(path, [Layout("ib_qp", unpadded)]) == [
        "struct ib_qp: size 56, Python says 52",
        "struct ib_qp: field res at offset 16, Python says 12",
    ]
    # a pad field over a real member is no padding
    misplaced = [("device", "Q"), ("pad", "I"), ("port", "I"), ("res", "40s")]
    problems = check(path, [Layout("ib_qp", misplaced)])
    assert "struct ib_qp: field pad (offset 8) not in C" in problems


# --- the BTF reader agrees with bpftool ------------------------------------

@pytest.mark.parametrize("obj", OBJECTS)
def test_btf_reader_agrees_with_bpftool(obj):
    bpftool = shutil.which("bpftool") or shutil.which("/usr/sbin/bpftool")
    assert bpftool, "bpftool is missing: scripts/install --dev installs it (Debian: bpftool)"
    out = subprocess.run([bpftool, "-j", "btf", "dump", "file", built(obj)],
                         check=True, capture_output=True, text=True).stdout
    structs, enums = {}, {}
    for t in json.loads(out)["types"]:
        if t["kind"] == "STRUCT" and t["name"] != "(anon)":
            structs.setdefault(t["name"], (t["size"], [
                (m["name"], m["bits_offset"] // 8, m.get("bitfield_size", 0))
                for m in t["members"]]))
        elif t["kind"] in ("ENUM", "ENUM64") and t["name"] != "(anon)":
            # bpftool's JSON sign-extends a negative enumerator of an old
            # (pre-signedness) BTF to 64 bits: compare values modulo the size
            mask = (1 << 8 * t["size"]) - 1
            enums.setdefault(t["name"], (mask, {v["name"]: v["val"] & mask
                                                for v in t["values"]}))
    ours = btf(obj)
    assert {n: (s.size, [(m.name or "(anon)", m.offset, m.bitfield) for m in s.members])
            for n, s in ours.structs.items()} == structs
    assert {n: {k: v & enums[n][0] for k, v in e.items()} if n in enums else e
            for n, e in ours.enums.items()} == {n: e for n, (_, e) in enums.items()}


# --- Layout on its own -----------------------------------------------------

def test_layout_packs_and_unpacks_arrays_as_tuples():
    lay = Layout("t", [("a", "Q"), ("b", "I", 3), ("name", "4s"), ("c", "h")])
    assert lay.size == 8 + 12 + 4 + 2
    assert lay.offsets() == {"a": (0, 8), "b": (8, 12), "name": (20, 4), "c": (24, 2)}
    raw = lay.pack(1, [2, 3, 4], b"ab", -5)
    assert lay.unpack(raw + b"trailing") == (1, (2, 3, 4), b"ab\0\0", -5)
    assert lay.unpack_flat(raw) == (1, 2, 3, 4, b"ab\0\0", -5)
    with pytest.raises(ValueError):
        lay.pack(1, [2, 3], b"ab", 0)
    with pytest.raises(TypeError):
        lay.pack(1, [2, 3, 4], b"ab")


@pytest.mark.parametrize("fields", [[("a", "d")], [("a", "2I")], [("a", "I"), ("a", "Q")],
                                    [("a", "I", 0)], [("a",)]])
def test_layout_rejects_what_it_cannot_check(fields):
    with pytest.raises(ValueError):
        Layout("t", fields)


def test_enum_layout_expects_index_values():
    lay = EnumLayout("io_hist", ("read", "write"), "HIST_", stop="HIST_MAX")
    assert lay.expected() == {"HIST_READ": 0, "HIST_WRITE": 1, "HIST_MAX": 2}
