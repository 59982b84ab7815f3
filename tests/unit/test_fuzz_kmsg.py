"""Property-based fuzzing of the kernel log's readers (docs/reliability.md
counts the examples with test_fuzz_parsers.py's): any record bytes, any text
around the driver's lines, and Unicode digits where ASCII ones belong, parse
to a record, an event or a refusal, never an exception; well-formed XID lines
round trip."""
import re

from hypothesis import given
from hypothesis import strategies as st

from tracehound.chaos.faults.gpu_xid import xid_line
from tracehound.gpu.kmsg import EVENT_KINDS, MALFORMED, parse_gpu_line, parse_record

from .test_fuzz_parsers import fuzz


KMSG_PIECES = st.sampled_from([
    "NVRM: ", "Xid ", "SXid ", "(PCI:", "0000:3b:00", ".0", "): ", "79", ", ", "pid=", "'<unknown>'",
    "name=", "GPU-I:05", "nvidia-nvswitch3: ", "Fatal", "Non-fatal", "Severity 1",
    "Data {", "GPU 0000:3b:00.0: ", "has fallen off the bus.", "RmInitAdapter failed!",
    "device minor number 3", "[ 12.345] ", "\n", "\\x0a", "\\x5c", ";", ",", "-", "c", "4",
    "\n SUBSYSTEM=pci", "\x00", "\xff", "ffffffff:", "99999999999999999999"])
KMSG_TEXT = st.lists(st.one_of(KMSG_PIECES, st.text(max_size=12)), max_size=24).map("".join)


@fuzz
@given(KMSG_TEXT, st.binary(max_size=40))
def test_kernel_log_records_and_driver_lines_parse_or_are_skipped(text, noise):
    for raw in (text.encode("utf-8", "surrogatepass"), b"4,7,1,-;" + text.encode(
            "utf-8", "surrogatepass") + noise, noise):
        rec = parse_record(raw)
        if rec is not None:
            assert rec.seq >= 0 and isinstance(rec.message, str)
            text_of = rec.message
        else:
            text_of = raw.decode("utf-8", "replace")
        event = parse_gpu_line(text_of)
        if event is None:
            continue
        assert event.kind in (*EVENT_KINDS, MALFORMED)
        if event.kind in ("xid", "sxid"):
            assert isinstance(event.number, int) and event.number >= 0
        if event.pci is not None:
            domain, bus, rest = event.pci.split(":")
            assert len(bus) == 2 and rest[2] == "." and event.pci == event.pci.lower()


ASCII_SPACE = " \t\n\r\x0b\x0c"
# a process name as the driver prints it: no comma (it ends the field) or line break
NAMES = st.text(alphabet=st.characters(blacklist_categories=("Cs", "Cc", "Zl", "Zp"),
                                       blacklist_characters=",'"), max_size=16)


@fuzz
@given(st.integers(0, 99999), st.integers(0, 0xffff), st.integers(0, 255), st.integers(0, 31),
       st.integers(0, 7), st.one_of(st.none(), st.integers(1, 2 ** 22)), NAMES)
def test_driver_xid_lines_round_trip(xid, domain, bus, device, function, pid, name):
    pci = f"{domain:04x}:{bus:02x}:{device:02x}.{function}"
    line = xid_line(xid, pci, pid, name, "detail text")[3:]
    event = parse_gpu_line(line)
    assert (event.kind, event.number, event.pci, event.pid) == ("xid", xid, pci, pid)
    # the driver's grammar is ASCII: only ASCII spaces around the name are its own
    name = name.strip(ASCII_SPACE)
    assert event.process == ((name or None) if name != "<unknown>" else None)


# -- the agent's own exposition: any label value renders and reads back -------

# anything a name read with surrogateescape, or built by hand, may hold:
# lone surrogates, controls, the three escaped characters, line separators


BUS_ID_FORM = re.compile(r"[0-9a-f]{4,8}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]", re.A)
# digits no ASCII grammar may read as digits: Arabic-Indic, fullwidth, superscript, Devanagari
UNICODE_DIGITS = "٠٣٧۹０７¹²³४"
RECORD_HEADS = st.sampled_from([b"", b"3,1,2,-;", b"4,18446744073709551615,1,c;", b"6,7,8;",
                                b"-1,2,3,-;", b"3,\xd9\xa3,1,-;", b"0,0,0,-;NVRM: Xid (PCI:"])


def structure(event):
    """What an event says of the GPU and the error, leaving out free text."""
    if event is None:
        return None
    return (event.kind, event.number, event.pci, event.gpu_instance, event.pid, event.fatal)


@fuzz
@given(RECORD_HEADS, st.binary(max_size=200), st.lists(st.one_of(
    KMSG_PIECES, st.sampled_from(list(UNICODE_DIGITS))), max_size=16).map("".join))
def test_any_bytes_record_parses_without_raising_and_reads_ascii_digits_only(head, raw, text):
    for data in (head + raw, head + text.encode("utf-8", "surrogatepass") + raw):
        rec = parse_record(data)
        message = rec.message if rec is not None else data.decode("utf-8", "replace")
        event = parse_gpu_line(message)
        if event is None:
            continue
        assert event.kind in (*EVENT_KINDS, MALFORMED)
        if event.pci is not None:
            assert BUS_ID_FORM.fullmatch(event.pci), event.pci
        if event.number is not None:
            assert 0 <= event.number <= 999999
        # a non-ASCII digit counts for nothing: read as any other symbol
        masked = "".join("~" if c.isdigit() and not c.isascii() else c for c in message)
        assert structure(parse_gpu_line(masked)) == structure(event)


DRIVER_LINES = st.sampled_from([
    "NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, name=python, GPU has fallen off the bus.",
    "NVRM: Xid (PCI:0000:3b:00, GPU-I:05): 13, pid='<unknown>', name=<unknown>, x",
    "[ 12.345678] NVRM: Xid (0000:3B:00.0): 48, pid=77, name=a, b",
    "nvidia-nvswitch3: SXid (PCI:0000:c8:00.0): 12028, Non-fatal, Link 47",
    "NVRM: GPU 0000:3b:00.0: GPU has fallen off the bus.",
    "NVRM: RmInitAdapter failed! device minor number 3"])


@fuzz
@given(DRIVER_LINES, st.lists(st.tuples(st.integers(0, 90), st.sampled_from(UNICODE_DIGITS)),
                              min_size=1, max_size=4))
def test_unicode_digits_in_a_driver_line_are_never_read_as_digits(line, swaps):
    chars = list(line)
    for at, digit in swaps:
        i = at % len(chars)
        if chars[i].isdigit():
            chars[i] = digit
    text = "".join(chars)
    masked = "".join("~" if c.isdigit() and not c.isascii() else c for c in text)
    assert structure(parse_gpu_line(text)) == structure(parse_gpu_line(masked))


HEX_CASE = st.sampled_from([str.lower, str.upper])


@fuzz
@given(st.integers(0, 999999), st.integers(0, 0xffff), st.integers(0, 255), st.integers(0, 31),
       st.one_of(st.none(), st.integers(0, 7)), st.one_of(st.none(), st.integers(0, 9999)),
       st.one_of(st.none(), st.integers(0, 2 ** 31)), st.booleans(), st.booleans(), HEX_CASE,
       st.sampled_from(["", "[ 1234.567890] ", "[    0.000001]"]))
def test_well_formed_driver_xid_lines_round_trip(xid, domain, bus, device, function, instance,
                                                 pid, prefix, long_domain, case, stamp):
    dom = f"{domain:08x}" if long_domain else f"{domain:04x}"
    where = case(f"{'PCI:' if prefix else ''}{dom}:{bus:02x}:{device:02x}")
    if prefix:
        where = "PCI:" + where[4:]
    if function is not None:
        where += f".{function}"
    if instance is not None:
        where += f", GPU-I:{instance:02d}"
    rest = "" if pid is None else f", pid={pid}, name=python3"
    event = parse_gpu_line(f"{stamp}NVRM: Xid ({where}): {xid}{rest}, detail")
    pci = f"{domain:04x}:{bus:02x}:{device:02x}.{function or 0}"
    assert structure(event) == ("xid", xid, pci, instance, pid, None)
    assert BUS_ID_FORM.fullmatch(event.pci)
