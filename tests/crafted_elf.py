"""Copies of the real libibverbs with one section header field rewritten,
as a hostile user would craft them (located with pyelftools, patched in
place). Shared by the unit and kernel tiers."""
import os
import shutil
import struct

from elftools.elf.elffile import ELFFile

REAL_LIBIBVERBS = os.path.realpath("/usr/lib/x86_64-linux-gnu/libibverbs.so.1")
SHT_PROGBITS = 1
# Elf64_Shdr: name, type (u32), flags, addr, offset, size (u64), link, info (u32), ...
_SHDR_FIELDS = {"sh_type": (4, "<I"), "sh_offset": (24, "<Q"), "sh_size": (32, "<Q")}


def section_header_at(path: str, name: str) -> int:
    """The file offset of section `name`'s header."""
    with open(path, "rb") as f:
        elf = ELFFile(f)
        for i, section in enumerate(elf.iter_sections()):
            if section.name == name:
                return elf["e_shoff"] + i * elf["e_shentsize"]
    raise LookupError(f"{path} has no {name}")


def patched(dst: str, name: str, **fields) -> str:
    """A copy of the real library at `dst` with section `name`'s header
    fields set to `fields`."""
    shutil.copyfile(REAL_LIBIBVERBS, dst)
    at = section_header_at(dst, name)
    with open(dst, "r+b") as f:
        for field, value in fields.items():
            offset, layout = _SHDR_FIELDS[field]
            f.seek(at + offset)
            f.write(struct.pack(layout, value))
    return dst


def wrong_type_versions(dst: str) -> str:
    """.gnu.version claims to be plain data: no longer a version table."""
    return patched(dst, ".gnu.version", sh_type=SHT_PROGBITS)


def ten_million_symbols(dst: str) -> str:
    """.dynsym claims 10^7 entries, all really there: the file is extended
    (sparsely) by 240 MB of zero symbols past the original bytes."""
    size = os.path.getsize(REAL_LIBIBVERBS)
    patched(dst, ".dynsym", sh_offset=size, sh_size=10**7 * 24)
    os.truncate(dst, size + 10**7 * 24)
    return dst
