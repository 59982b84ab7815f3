"""File offsets of a shared library's exported functions, read from bytes
nobody vouches for (a library a container user mapped, or crafted).

pyelftools knows the layouts; this module decides how much to believe: every
count, size and offset the file claims is checked against the bytes really
there and against limits a genuine library stays far below, the walk stops
at a wall-clock budget, and whatever else goes wrong inside the parser is a
refusal naming it, never an exception of another kind.
"""
from __future__ import annotations

import io
import time
from dataclasses import dataclass

from elftools.common.utils import struct_parse
from elftools.elf.elffile import ELFFile

_HIDDEN = 0x8000                 # versym bit of a non-default (compatibility) version
_VERSYM_SIZE = 2
_MAX_NAME = 256                  # longer names are not the functions looked for


class ElfRefused(Exception):
    """The bytes are not a library whose exports can be read, and why."""


class ElfOverBudget(ElfRefused):
    """The walk used up its time budget before it ended: crafted bytes, or a
    genuine library on a CPU too slow or too busy for this budget."""


@dataclass(frozen=True)
class ElfLimits:
    # a libibverbs is ~130 KB with ~35 sections, ~10 segments, ~250 dynamic
    # symbols and an 8 KB string table, parsed in a few milliseconds
    max_file_bytes: int = 16 << 20
    max_sections: int = 256
    max_segments: int = 64
    max_symbols: int = 1 << 16
    max_strings_bytes: int = 1 << 20
    budget_s: float = 1.0


LIMITS = ElfLimits()


class _Budget:
    def __init__(self, seconds: float, clock):
        self.seconds, self.clock = seconds, clock
        self.end = clock() + seconds

    def check(self) -> None:
        if self.clock() > self.end:
            raise ElfOverBudget(f"not parsed within {self.seconds:g} s of CPU time")


def default_function_offsets(data: bytes, wanted, limits: ElfLimits = LIMITS,
                             clock=time.thread_time) -> dict[str, int]:
    """name -> file offset of the default-version definition of each function
    of `wanted` that `data` (a whole ELF file) defines. Raises ElfRefused, and
    nothing else, for bytes that cannot be read within `limits`.

    The budget counts this thread's CPU time: the work the bytes cost, not
    the time spent waiting for the interpreter lock or a busy CPU, which on
    a loaded node can be many times a genuine library's few milliseconds."""
    try:
        return _offsets(data, {w.encode(): w for w in wanted}, limits,
                        _Budget(limits.budget_s, clock))
    except ElfRefused:
        raise
    except Exception as exc:  # noqa: BLE001 - malformed input surfaces as many types
        raise ElfRefused(f"malformed ELF: {type(exc).__name__}: {exc}"[:200]) from None


def _offsets(data: bytes, wanted: dict[bytes, str], limits: ElfLimits, budget: _Budget):
    if len(data) > limits.max_file_bytes:
        raise ElfRefused(f"larger than {limits.max_file_bytes} bytes")
    stream = io.BytesIO(data)
    elf = ELFFile(stream)
    structs = elf.structs
    sections = _table_headers(elf, stream, "section", limits.max_sections, budget)
    segments = _table_headers(elf, stream, "segment", limits.max_segments, budget)
    dynsym_index = next((i for i, h in enumerate(sections) if h["sh_type"] == "SHT_DYNSYM"), None)
    if dynsym_index is None:
        raise ElfRefused("no dynamic symbol table")
    dynsym = sections[dynsym_index]
    count = _entries(dynsym, structs.Elf_Sym.sizeof(), len(data), "the dynamic symbol table",
                     limits.max_symbols)
    versym = next((h for h in sections if h["sh_type"] == "SHT_GNU_versym"
                   and h["sh_link"] == dynsym_index), None)
    if versym is None:
        raise ElfRefused("no symbol version table (.gnu.version of type VERSYM) for the dynamic "
                         "symbols")
    if _entries(versym, _VERSYM_SIZE, len(data), "the symbol version table",
                limits.max_symbols) != count:
        raise ElfRefused("the symbol version table and the dynamic symbols differ in length")
    strings = _string_table(sections, dynsym["sh_link"], len(data), limits)
    start, end = strings["sh_offset"], strings["sh_offset"] + strings["sh_size"]
    loads = [s for s in segments if s["p_type"] == "PT_LOAD"]
    found: dict[str, int] = {}
    for i in range(count):
        if i % 64 == 0:
            budget.check()
        sym = struct_parse(structs.Elf_Sym, stream, dynsym["sh_offset"] + i * dynsym["sh_entsize"])
        if sym["st_info"]["type"] != "STT_FUNC" or sym["st_shndx"] == "SHN_UNDEF":
            continue
        name_at = start + sym["st_name"]
        name_end = data.find(b"\0", name_at, min(end, name_at + _MAX_NAME))
        name = wanted.get(data[name_at:name_end]) if name_at < end and name_end >= 0 else None
        if name is None:
            continue
        ndx = struct_parse(structs.Elf_Versym, stream,
                           versym["sh_offset"] + i * _VERSYM_SIZE)["ndx"]
        if isinstance(ndx, int) and ndx & _HIDDEN:
            continue
        addr = sym["st_value"]
        for seg in loads:
            if seg["p_vaddr"] <= addr < seg["p_vaddr"] + seg["p_filesz"]:
                offset = addr - seg["p_vaddr"] + seg["p_offset"]
                if offset < len(data):
                    found[name] = offset
                break
    return found


def _table_headers(elf: ELFFile, stream, kind: str, most: int, budget: _Budget) -> list:
    """Every section or segment header, read only where the file has them."""
    if kind == "section":
        n, at, size, layout = elf.num_sections(), elf["e_shoff"], elf["e_shentsize"], \
            elf.structs.Elf_Shdr
    else:
        n, at, size, layout = elf.num_segments(), elf["e_phoff"], elf["e_phentsize"], \
            elf.structs.Elf_Phdr
    if n > most:
        raise ElfRefused(f"{n} {kind}s (at most {most})")
    if n and (size != layout.sizeof() or at + n * size > len(stream.getbuffer())):
        raise ElfRefused(f"the {kind} header table is not where the file says")
    headers = []
    for i in range(n):
        budget.check()
        headers.append(struct_parse(layout, stream, at + i * size))
    return headers


def _entries(header, entry_size: int, file_size: int, what: str, most: int) -> int:
    size = header["sh_size"]
    if header["sh_entsize"] != entry_size or size % entry_size:
        raise ElfRefused(f"{what} has entries of {header['sh_entsize']} bytes, not {entry_size}")
    if size // entry_size > most:
        raise ElfRefused(f"{what} claims {size // entry_size} entries (at most {most})")
    if header["sh_offset"] + size > file_size:
        raise ElfRefused(f"{what} ends past the end of the file")
    return size // entry_size


def _string_table(sections: list, index: int, file_size: int, limits: ElfLimits):
    if not 0 < index < len(sections) or sections[index]["sh_type"] != "SHT_STRTAB":
        raise ElfRefused("the dynamic symbols' string table is missing")
    strings = sections[index]
    if strings["sh_size"] > limits.max_strings_bytes:
        raise ElfRefused(f"a string table of {strings['sh_size']} bytes "
                         f"(at most {limits.max_strings_bytes})")
    if strings["sh_offset"] + strings["sh_size"] > file_size:
        raise ElfRefused("the string table ends past the end of the file")
    return strings
