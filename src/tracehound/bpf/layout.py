"""Python views of the C structs and enums shared with the BPF probes, and a
check of them against the BTF the compiler wrote into a probe object.

`Layout` names every field of a struct Python packs or unpacks, so `check()`
can compare it field by field (offset, size, element size, signedness) with
the struct of that name in the object; `EnumLayout` does the same for a Python
name table indexed by a C enum. The BTF is read from the object's .BTF ELF
section (format: uapi linux/btf.h): no bpftool or libbpf needed.
"""
from __future__ import annotations

import re
import struct
from typing import NamedTuple

_SCALARS, _SIGNED = set("QqIiHhBb"), set("qihb")
_BYTES = re.compile(r"([1-9][0-9]*)s")
# A Python field absent from the C struct is accepted only under such a name,
# and only where the C struct has implicit padding.
_PAD = re.compile(r"_?pad")


class Field(NamedTuple):
    name: str
    fmt: str            # one struct code, or "Ns" for a char[N]
    count: int | None   # None: a scalar; else an array of count elements
    elem_size: int
    size: int           # elem_size * (count or 1)


class Layout:
    """A C struct as Python packs and unpacks it: native sizes, no implicit
    padding (declare padding as a field, e.g. ("pad", "I"))."""

    def __init__(self, c_name: str, fields: list[tuple]):
        self.c_name = c_name
        self.fields: tuple[Field, ...] = tuple(_field(f) for f in fields)
        names = [f.name for f in self.fields]
        if len(set(names)) != len(names):
            raise ValueError(f"struct {c_name}: duplicate field names in {names}")
        codes = "".join(f.fmt * (f.count or 1) if f.fmt.endswith("s")
                        else f"{f.count or ''}{f.fmt}" for f in self.fields)
        self.struct = struct.Struct("=" + codes)
        self.size = self.struct.size

    def offsets(self) -> dict[str, tuple[int, int]]:
        """field name -> (byte offset, byte size)"""
        out, off = {}, 0
        for f in self.fields:
            out[f.name] = (off, f.size)
            off += f.size
        return out

    def pack(self, *values) -> bytes:
        if len(values) != len(self.fields):
            raise TypeError(f"struct {self.c_name}: {len(self.fields)} values needed, "
                            f"got {len(values)}")
        flat = []
        for f, v in zip(self.fields, values):
            if f.count is None:
                flat.append(v)
            elif len(v := tuple(v)) == f.count:
                flat.extend(v)
            else:
                raise ValueError(f"struct {self.c_name}: field {f.name} takes {f.count} "
                                 f"values, got {len(v)}")
        return self.struct.pack(*flat)

    def unpack_flat(self, raw) -> tuple:
        """Every element in order, arrays spread out (raw may be longer)."""
        return self.struct.unpack_from(raw)

    def unpack(self, raw) -> tuple:
        """One item per field; array fields come back as tuples."""
        flat, out, i = self.unpack_flat(raw), [], 0
        for f in self.fields:
            out.append(flat[i] if f.count is None else flat[i:i + f.count])
            i += f.count or 1
        return tuple(out)


def _field(spec: tuple) -> Field:
    if len(spec) not in (2, 3):
        raise ValueError(f"field {spec!r}: expected (name, fmt) or (name, fmt, count)")
    name, fmt, count = (*spec, None) if len(spec) == 2 else spec
    if fmt not in _SCALARS and not _BYTES.fullmatch(fmt):
        raise ValueError(f"field {name}: unsupported format {fmt!r}")
    if count is not None and (not isinstance(count, int) or count < 1):
        raise ValueError(f"field {name}: count must be a positive int, got {count!r}")
    elem = struct.calcsize("=" + fmt)
    return Field(name, fmt, count, elem, elem * (count or 1))


class EnumLayout:
    """A Python name table indexed by a C enum: the enumerator
    prefix + NAME.upper() has the value names.index(NAME); stop, when given,
    names the enumerator that counts them (e.g. OP_MAX)."""

    def __init__(self, c_name: str, names: tuple[str, ...], prefix: str, stop: str | None = None):
        self.c_name, self.names, self.prefix, self.stop = c_name, tuple(names), prefix, stop

    def expected(self) -> dict[str, int]:
        """C enumerator -> the value Python relies on"""
        out = {self.prefix + n.upper(): i for i, n in enumerate(self.names)}
        if self.stop:
            out[self.stop] = len(self.names)
        return out


# --- BTF ------------------------------------------------------------------

class BtfError(ValueError):
    """The file is not an ELF object with a BTF section this reader knows."""


class Member(NamedTuple):
    name: str
    offset: int          # bytes from the start of the struct
    size: int            # bytes of the whole member (arrays: all elements)
    elem_size: int       # bytes of one element once arrays are stripped
    signed: bool | None  # for integer elements; None for anything else
    bitfield: int = 0    # width in bits when a bitfield, else 0


class BtfStruct(NamedTuple):
    name: str
    size: int
    members: tuple[Member, ...]


class Btf(NamedTuple):
    structs: dict[str, BtfStruct]
    enums: dict[str, dict[str, int]]


# BTF kinds (linux/btf.h) and the bytes that follow each 12-byte btf_type.
INT, PTR, ARRAY, STRUCT, UNION, ENUM, FWD, TYPEDEF, VOLATILE, CONST, RESTRICT = range(1, 12)
FUNC, FUNC_PROTO, VAR, DATASEC, FLOAT, DECL_TAG, TYPE_TAG, ENUM64 = range(12, 20)
_FIXED = {INT: 4, ARRAY: 12, VAR: 4, DECL_TAG: 4}
_PER_VLEN = {STRUCT: 12, UNION: 12, ENUM: 8, FUNC_PROTO: 8, DATASEC: 12, ENUM64: 12}
_MODIFIERS = {TYPEDEF, VOLATILE, CONST, RESTRICT, TYPE_TAG}
_SIZED = {INT, ENUM, STRUCT, UNION, FLOAT, ENUM64, DATASEC}


def _btf_section(data: bytes, path: str) -> tuple[bytes, str]:
    """The .BTF section of an ELF64 object, and its byte order for struct."""
    if data[:4] != b"\x7fELF" or data[4] != 2 or data[5] not in (1, 2):
        raise BtfError(f"{path}: not a 64-bit ELF object")
    e = "<" if data[5] == 1 else ">"
    shoff, = struct.unpack_from(e + "Q", data, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from(e + "HHH", data, 0x3A)
    if shoff == 0 or shnum == 0:    # (shnum 0 means > 0xff00 sections: never BPF)
        raise BtfError(f"{path}: no section headers")
    headers = [struct.unpack_from(e + "I20xQQ", data, shoff + i * shentsize)
               for i in range(shnum)]      # (sh_name, sh_offset, sh_size)
    stroff = headers[shstrndx][1]
    for name, off, size in headers:
        if data[stroff + name:data.index(b"\0", stroff + name)] == b".BTF":
            return data[off:off + size], e
    raise BtfError(f"{path}: no .BTF section (built without -g?)")


def read_btf(path: str) -> Btf:
    """The named structs and enums in a BPF object's BTF."""
    with open(path, "rb") as f:
        blob, e = _btf_section(f.read(), path)
    magic, _ver, _flags, hdr_len, type_off, type_len, str_off, str_len = \
        struct.unpack_from(e + "HBBIIIII", blob, 0)
    if magic != 0xEB9F:
        raise BtfError(f"{path}: bad BTF magic {magic:#x}")
    strs = blob[hdr_len + str_off:hdr_len + str_off + str_len]

    def name_at(off: int) -> str:
        return strs[off:strs.index(b"\0", off)].decode()

    # types[id] = (kind, name, size_or_type, kind_flag, extra bytes); id 0 is void
    types: list[tuple] = [(0, "", 0, 0, b"")]
    pos, end = hdr_len + type_off, hdr_len + type_off + type_len
    while pos < end:
        name_off, info, size_or_type = struct.unpack_from(e + "III", blob, pos)
        kind, vlen, kflag = (info >> 24) & 0x1F, info & 0xFFFF, info >> 31
        if not INT <= kind <= ENUM64:     # its length is unknown: cannot go on
            raise BtfError(f"{path}: unknown BTF kind {kind} at type {len(types)}")
        n = _FIXED.get(kind, 0) + _PER_VLEN.get(kind, 0) * vlen
        types.append((kind, name_at(name_off), size_or_type, kflag, blob[pos + 12:pos + 12 + n]))
        pos += 12 + n

    def strip(tid: int) -> int:
        while types[tid][0] in _MODIFIERS:
            tid = types[tid][2]
        return tid

    def size_of(tid: int) -> int:
        kind, _, sot, _, extra = types[strip(tid)]
        if kind == ARRAY:
            elem, _index, nelems = struct.unpack_from(e + "III", extra)
            return nelems * size_of(elem)
        return 8 if kind == PTR else sot if kind in _SIZED else 0

    def element(tid: int) -> tuple[int, bool | None]:
        """(size, signedness) of the scalar inside any nesting of arrays"""
        tid = strip(tid)
        while types[tid][0] == ARRAY:
            tid = strip(struct.unpack_from(e + "I", types[tid][4])[0])
        kind, _, _, _, extra = types[tid]
        signed = bool(struct.unpack_from(e + "I", extra)[0] >> 24 & 1) if kind == INT else None
        return size_of(tid), signed

    structs, enums = {}, {}
    for kind, name, sot, kflag, extra in types:
        if kind == STRUCT and name and name not in structs:
            members = []
            for i in range(0, len(extra), 12):
                m_name, m_type, m_off = struct.unpack_from(e + "III", extra, i)
                bits, width = (m_off & 0xFFFFFF, m_off >> 24) if kflag else (m_off, 0)
                members.append(Member(name_at(m_name), bits // 8, size_of(m_type),
                                      *element(m_type), bitfield=width))
            structs[name] = BtfStruct(name, sot, tuple(members))
        elif kind in (ENUM, ENUM64) and name and name not in enums:
            # kind_flag: 1 signed, 0 unsigned (clang < 15 always writes 0, so
            # a negative enumerator there reads as its u32 value, as in bpftool)
            values, bits = {}, 32 if kind == ENUM else 64
            for i in range(0, len(extra), 8 if kind == ENUM else 12):
                n_off, lo = struct.unpack_from(e + "II", extra, i)
                v = lo if kind == ENUM else lo | struct.unpack_from(e + "I", extra, i + 8)[0] << 32
                values[name_at(n_off)] = v - (1 << bits) if kflag and v >> (bits - 1) else v
            enums[name] = values
    return Btf(structs, enums)


# --- check -----------------------------------------------------------------

def check(obj_path: str | Btf, layouts) -> list[str]:
    """Mismatches between the layouts and the BTF of a built probe object (a
    path, or what read_btf() made of one), one readable line each; empty when
    they all agree."""
    btf = obj_path if isinstance(obj_path, Btf) else read_btf(obj_path)
    out: list[str] = []
    for lay in layouts:
        if isinstance(lay, EnumLayout):
            out += _check_enum(btf, lay)
        elif isinstance(lay, Layout):
            out += _check_struct(btf, lay)
        else:
            raise TypeError(f"not a Layout or EnumLayout: {lay!r}")
    return out


def _check_struct(btf: Btf, lay: Layout) -> list[str]:
    where = f"struct {lay.c_name}"
    c = btf.structs.get(lay.c_name)
    if c is None:
        return [f"{where} not in the object's BTF (no map or program uses it)"]
    out = []
    if c.size != lay.size:
        out.append(f"{where}: size {c.size}, Python says {lay.size}")
    c_members = {m.name: m for m in c.members}
    offsets = lay.offsets()
    for f in lay.fields:
        off, size = offsets[f.name]
        m = c_members.get(f.name)
        if m is None:
            covered = any(x.offset < off + size and off < x.offset + x.size for x in c.members)
            if not _PAD.match(f.name) or covered:
                out.append(f"{where}: field {f.name} (offset {off}) not in C")
            continue
        if m.bitfield:
            out.append(f"{where}: field {f.name} is a {m.bitfield}-bit bitfield in C")
        elif m.offset != off:
            out.append(f"{where}: field {f.name} at offset {m.offset}, Python says {off}")
        elif m.size != size:
            out.append(f"{where}: field {f.name} is {m.size} bytes, Python says {size}")
        elif f.fmt.endswith("s"):
            pass  # raw bytes: any C element type
        elif m.elem_size != f.elem_size:
            out.append(f"{where}: field {f.name} has {m.elem_size}-byte elements, "
                       f"Python says {f.elem_size}")
        elif m.signed is not None and m.elem_size > 1 and m.signed != (f.fmt in _SIGNED):
            sign = "signed" if m.signed else "unsigned"
            out.append(f"{where}: field {f.name} is {sign} in C, Python says {f.fmt!r}")
    named = {f.name for f in lay.fields}
    for m in c.members:
        if m.name not in named:
            out.append(f"{where}: C field {m.name or '(anonymous)'} (offset {m.offset}, "
                       f"{m.size} bytes) missing in Python")
    return out


def _check_enum(btf: Btf, lay: EnumLayout) -> list[str]:
    where = f"enum {lay.c_name}"
    c = btf.enums.get(lay.c_name)
    if c is None:
        return [f"{where} not in the object's BTF (used only as constants?)"]
    out = []
    want = lay.expected()
    for name, value in want.items():
        if name not in c:
            out.append(f"{where}: no enumerator {name} in C, Python says {value}")
        elif c[name] != value:
            out.append(f"{where}: {name} = {c[name]}, Python says {value}")
    # An enumerator Python does not name is harmless when it lies outside the
    # table (sentinels such as OP_NONE = 255); one inside it, or right after
    # it, is a name the table lacks.
    for name, value in c.items():
        if name not in want and 0 <= value <= len(lay.names):
            out.append(f"{where}: {name} = {value} has no Python name")
    return out
