"""Reading libibverbs files a user controls: the bounded ELF reader
(probes/elf_exports.py), the rooted open (host/rooted_open.py) and the
attachments that refuse one file and go on (probes/rdma_app.py). Real files
here: a copy of the system's libibverbs, crafted by patching its bytes, a
real FIFO and real symlinks. A real process in its own root is in
tests/kernel/test_rdma_app_scan.py."""
import errno
import os
import shutil
import struct
import threading

import pytest
from elftools.elf.elffile import ELFFile

from tests import crafted_elf
from tracehound.host import rooted_open
from tracehound.host.rooted_open import RootedOpenError, open_regular
from tracehound.probes import rdma_app
from tracehound.probes.elf_exports import (ElfLimits, ElfOverBudget, ElfRefused,
                                           default_function_offsets)
from tracehound.probes.rdma_app import VERBS, Attachments, Candidate

REAL = crafted_elf.REAL_LIBIBVERBS


def real_bytes() -> bytes:
    with open(REAL, "rb") as f:
        return f.read()


def reference_offsets(path: str) -> dict[str, int]:
    """The default versions' file offsets, through pyelftools' own API."""
    out = {}
    with open(path, "rb") as f:
        elf = ELFFile(f)
        dynsym, versym = elf.get_section_by_name(".dynsym"), elf.get_section_by_name(".gnu.version")
        for i, sym in enumerate(dynsym.iter_symbols()):
            ndx = versym.get_symbol(i).entry["ndx"]
            if sym.name in VERBS and sym["st_shndx"] != "SHN_UNDEF" and \
                    not (isinstance(ndx, int) and ndx & 0x8000):
                out[sym.name] = next(elf.address_offsets(sym["st_value"]))
    return out


def test_the_real_library_reads_as_pyelftools_reads_it():
    assert default_function_offsets(real_bytes(), VERBS) == reference_offsets(REAL)
    assert set(reference_offsets(REAL)) >= set(VERBS) - rdma_app.OPTIONAL_VERBS


def test_a_version_section_of_the_wrong_type_is_refused(tmp_path):
    data = open(crafted_elf.wrong_type_versions(tmp_path / "lib"), "rb").read()
    with pytest.raises(ElfRefused, match="no symbol version table"):
        default_function_offsets(data, VERBS)


def test_a_symbol_table_claiming_ten_million_entries_is_refused(tmp_path):
    data = open(crafted_elf.patched(tmp_path / "lib", ".dynsym", sh_size=10**7 * 24), "rb").read()
    with pytest.raises(ElfRefused, match="claims 10000000 entries"):
        default_function_offsets(data, VERBS)


@pytest.mark.parametrize("name, fields, why", [
    (".dynsym", {"sh_offset": 1 << 40}, "ends past the end of the file"),
    (".gnu.version", {"sh_size": 7}, "entries of 2 bytes"),
    (".gnu.version", {"sh_size": 4}, "differ in length"),
    (".dynstr", {"sh_size": 1 << 30}, "a string table of 1073741824 bytes"),
    (".dynstr", {"sh_type": 1}, "string table is missing"),
])
def test_claims_the_bytes_do_not_back_are_refused(tmp_path, name, fields, why):
    data = open(crafted_elf.patched(tmp_path / "lib", name, **fields), "rb").read()
    with pytest.raises(ElfRefused, match=why):
        default_function_offsets(data, VERBS)


@pytest.mark.parametrize("limits, why", [
    (ElfLimits(max_file_bytes=1000), "larger than 1000 bytes"),
    (ElfLimits(max_sections=10), r"sections \(at most 10\)"),
    (ElfLimits(max_segments=2), r"segments \(at most 2\)"),
    (ElfLimits(max_symbols=100), r"entries \(at most 100\)"),
    (ElfLimits(max_strings_bytes=100), r"\(at most 100\)"),
])
def test_each_limit_refuses(limits, why):
    with pytest.raises(ElfRefused, match=why):
        default_function_offsets(real_bytes(), VERBS, limits)


def test_the_time_budget_refuses():
    ticks = iter(range(10**6))
    with pytest.raises(ElfRefused, match="not parsed within 5 s"):
        default_function_offsets(real_bytes(), VERBS, ElfLimits(budget_s=5),
                                 clock=lambda: next(ticks))


@pytest.mark.parametrize("data", [b"", b"\x7fELF", b"\x7fELF" + b"\xff" * 60, b"#!/bin/sh\n",
                                  real_bytes()[:4096], real_bytes()[:-4096]])
def test_truncated_or_foreign_bytes_are_refused(data):
    with pytest.raises(ElfRefused):
        default_function_offsets(data, VERBS)


def test_a_section_header_table_past_the_end_is_refused():
    data = bytearray(real_bytes())
    data[0x28:0x30] = struct.pack("<Q", len(data) - 64)       # e_shoff
    with pytest.raises(ElfRefused, match="section header table is not where"):
        default_function_offsets(bytes(data), VERBS)


# -- the rooted open ---------------------------------------------------------

@pytest.fixture
def root(tmp_path):
    (tmp_path / "lib").mkdir()
    shutil.copyfile(REAL, tmp_path / "lib" / "libibverbs.so.1")
    return tmp_path


def test_a_regular_file_inside_the_root_opens(root):
    fd = open_regular(str(root), b"/lib/libibverbs.so.1")
    try:
        assert os.fstat(fd).st_ino == os.stat(root / "lib" / "libibverbs.so.1").st_ino
    finally:
        os.close(fd)


def test_dot_dot_and_absolute_links_stay_inside_the_root(root, tmp_path_factory):
    outside = tmp_path_factory.mktemp("host")
    shutil.copyfile(REAL, outside / "libibverbs.so.1")
    os.symlink(outside, root / "hostlib")                    # absolute: resolved in root
    with pytest.raises(RootedOpenError, match="No such file"):
        open_regular(str(root), b"/hostlib/libibverbs.so.1")
    with pytest.raises(RootedOpenError, match="No such file"):
        open_regular(str(root), os.fsencode(f"/../../../..{outside}/libibverbs.so.1"))


@pytest.mark.parametrize("make, why", [
    (lambda p: os.mkfifo(p), "a FIFO"),
    (lambda p: os.symlink("/lib/libibverbs.so.1", p), "a symbolic link, not followed"),
    (lambda p: os.mkdir(p), "a directory"),
])
def test_what_is_not_a_regular_file_is_refused_unopened(root, make, why):
    make(root / "lib" / "other.so.1")
    with pytest.raises(RootedOpenError, match=f"not a regular file \\({why}\\)"):
        open_regular(str(root), b"/lib/other.so.1")


def test_a_kernel_without_openat2_refuses_other_roots_only(root, monkeypatch):
    def enosys(*_):
        raise OSError(errno.ENOSYS, os.strerror(errno.ENOSYS))
    monkeypatch.setattr(rooted_open, "_openat2", enosys)
    with pytest.raises(RootedOpenError, match="no openat2"):
        open_regular(str(root), b"/lib/libibverbs.so.1")
    # the host's own library is still opened (its root is this process's), as a regular file only
    os.close(open_regular("/", os.fsencode(REAL)))
    os.mkfifo(root / "fifo")
    with pytest.raises(RootedOpenError, match="a FIFO"):
        open_regular("/", os.fsencode(root / "fifo"))


# -- attachments: one file refused, the others attached ----------------------

class Program:
    def __init__(self, obj):
        self.obj = obj

    def attach_uprobe(self, path, offset, retprobe=False):
        self.obj.attached.append(os.fstat(int(path.rsplit("/", 1)[1])).st_ino)
        return self

    def destroy(self):
        pass


class Obj:
    """Stands for the loaded BPF object; records the inodes attached to."""

    def __init__(self):
        self.links, self.attached = [], []
        self.programs = {f"{s}_{v}": Program(self) for v in VERBS for s in ("up", "ur")}


def candidate(root, inside: str, maps_file=None) -> Candidate:
    st = os.stat(maps_file or os.path.join(root, inside.lstrip("/")))
    return Candidate(str(root), inside.encode(), st.st_dev, st.st_ino)


def test_refused_files_are_counted_and_the_good_one_attached(root, tmp_path):
    os.mkfifo(root / "lib" / "fifo.so.1")
    crafted_elf.wrong_type_versions(root / "lib" / "crafted.so.1")
    good = candidate(root, "/lib/libibverbs.so.1")
    swapped = candidate(root, "/lib/crafted.so.1", maps_file=REAL)  # maps another inode
    fifo = Candidate(str(root), b"/lib/fifo.so.1", 1, 1)
    crafted = candidate(root, "/lib/crafted.so.1")
    app, obj = Attachments(), Obj()
    assert app.attach(obj, {good, swapped, fifo, crafted}) == [good.name]
    assert obj.attached == [good.ino] * 30
    assert app.refusals == 3
    assert sorted(app.refused.values()) == sorted([
        f"{crafted.name} is not the file the process maps (replaced since)",
        f"cannot open {fifo.name}: not a regular file (a FIFO)",
        f"cannot read {crafted.name}: no symbol version table (.gnu.version of type VERSYM) "
        "for the dynamic symbols"])
    assert app.attach(obj, {good, swapped, fifo, crafted}) == []      # each looked at once
    assert app.refusals == 3


def test_an_unexpected_error_is_a_refusal_too(root, monkeypatch):
    def boom(*_):
        raise RecursionError("deep")
    monkeypatch.setattr(rdma_app, "default_function_offsets", boom)
    app = Attachments()
    assert app.attach(Obj(), {candidate(root, "/lib/libibverbs.so.1")}) == []
    assert list(app.refused.values()) == ["deep"]


def test_the_scan_stops_at_its_budget(root):
    for i in range(3):
        shutil.copyfile(REAL, root / "lib" / f"libibverbs.so.{i}")
    found = {candidate(root, f"/lib/libibverbs.so.{i}") for i in range(3)}
    ticks = iter(range(10**6))
    app = Attachments()
    # two looks fit in the budget: the clock reads 0 (start), 1, 2, then 3 > 2
    added = app.attach(Obj(), found, budget_s=2, clock=lambda: next(ticks))
    assert len(added) == 2 and app.refusals == 0
    assert len(app.unsettled) == 1 and app.unsettled < found         # left for a later look
    assert len(app.attach(Obj(), found)) == 1                        # the next scan goes on
    assert app.unsettled == set()


def test_a_parse_over_its_budget_is_tried_again_with_twice_the_budget(root, monkeypatch):
    budgets, real_parse = [], rdma_app.default_function_offsets

    def slow_once(data, verbs, limits):
        budgets.append(limits.budget_s)
        if len(budgets) == 1:            # as on a CPU too busy for the first budget
            raise ElfOverBudget(f"not parsed within {limits.budget_s:g} s of CPU time")
        return real_parse(data, verbs, limits)

    monkeypatch.setattr(rdma_app, "default_function_offsets", slow_once)
    good = candidate(root, "/lib/libibverbs.so.1")
    app = Attachments()
    assert app.attach(Obj(), {good}) == [] and app.unsettled == {good} and app.refusals == 0
    assert app.attach(Obj(), {good}) == [good.name] and app.unsettled == set()
    assert budgets == [rdma_app.ELF_LIMITS.budget_s, 2 * rdma_app.ELF_LIMITS.budget_s]
    assert app.over_budget == {}


def test_a_parse_over_every_budget_is_refused_after_its_tries(root, monkeypatch):
    monkeypatch.setattr(rdma_app, "ELF_LIMITS", ElfLimits(budget_s=1e-9))   # no parse fits
    good = candidate(root, "/lib/libibverbs.so.1")
    app = Attachments()
    for _ in range(rdma_app.PARSE_TRIES - 1):
        assert app.attach(Obj(), {good}) == [] and app.unsettled == {good}
    assert app.refusals == 0
    assert app.attach(Obj(), {good}) == [] and app.unsettled == set()
    assert list(app.refused.values()) == [
        f"{good.name}: not parsed within 3 budgets of CPU time (the last 4e-09 s)"]
    assert app.over_budget == {}


def test_the_number_of_libraries_is_bounded(root, monkeypatch):
    monkeypatch.setattr(rdma_app, "MAX_LIBRARIES", 1)
    shutil.copyfile(REAL, root / "lib" / "libibverbs.so.2")
    app = Attachments()
    app.attach(Obj(), {candidate(root, f"/lib/libibverbs.so.{i}") for i in (1, 2)})
    assert len(app.libraries) == 1
    assert list(app.refused.values()) == [
        f"{root}/lib/libibverbs.so.2: already attached to 1 files"]


def test_maps_lines_name_the_inode_mapped(tmp_path):
    pid = tmp_path / "42"
    pid.mkdir()
    (pid / "maps").write_bytes(
        b"7f00-7f10 r--p 00000000 fd:01 1234 /usr/lib/libibverbs.so.1.14.44.0\n"
        b"7f10-7f20 r-xp 00001000 fd:01 1234 /usr/lib/libibverbs.so.1.14.44.0\n"
        b"7f30-7f40 r--p 00000000 00:2a 77 /odd \xff dir/libibverbs.so.1 (deleted)\n"
        b"7f50-7f60 r--p 00000000 fd:01 99 /usr/lib/libc.so.6\n")
    found = sorted(rdma_app.mapped_by(42, str(tmp_path)), key=lambda c: c.ino)
    assert [(c.path, c.dev, c.ino, c.mapped_as) for c in found] == [
        (b"/odd \xff dir/libibverbs.so.1", os.makedev(0, 0x2a), 77,
         f"{tmp_path}/42/map_files/7f30-7f40"),
        (b"/usr/lib/libibverbs.so.1.14.44.0", os.makedev(0xfd, 1), 1234,
         f"{tmp_path}/42/map_files/7f00-7f10")]
    assert found[0].name == f"{tmp_path}/42/root/odd \ufffd dir/libibverbs.so.1"


def test_an_open_that_does_not_return_is_left_behind_and_holds_back_only_other_opens(root,
                                                                                    monkeypatch):
    release, opened = threading.Event(), []
    real_open = rdma_app.open_library

    def hanging(cand):
        if cand.path == b"/lib/hangs.so.1":
            release.wait(60)             # as a lookup a FUSE daemon never answers
        fd, st = real_open(cand)
        opened.append(fd)
        return fd, st

    shutil.copyfile(REAL, root / "lib" / "hangs.so.1")
    monkeypatch.setattr(rdma_app, "open_library", hanging)
    monkeypatch.setattr(rdma_app, "OPEN_TIMEOUT_S", 0.2)
    app = Attachments()
    hangs, good = candidate(root, "/lib/hangs.so.1"), candidate(root, "/lib/libibverbs.so.1")
    assert app.attach(Obj(), {hangs, good}) == []
    assert app.refused == {
        hangs: f"{hangs.name}: not opened within 0.2 s (its file system does not answer)",
        good: f"{good.name}: not opened while the open of {hangs.name} has not returned"}
    release.set()
    for thread in threading.enumerate():
        if thread.name == "rdma-app-open":
            thread.join(30)
            assert not thread.is_alive(), "the abandoned open never returned"
    with pytest.raises(OSError):         # answered too late: closed, not leaked
        os.fstat(opened[0])
    del app.refused[good]
    assert app.attach(Obj(), {good}) == [good.name]
