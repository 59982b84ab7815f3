"""Kernel-log GPU errors: the record and driver-line parsers on real-world
shaped input, and on lines any user can shape (gpu/kmsg_parse.py)."""
import random

import pytest

from tracehound.gpu.kmsg import MALFORMED, normalize_pci, parse_gpu_line, parse_record


# -- records ------------------------------------------------------------------


def test_record_fields_and_continuation_lines():
    rec = parse_record(b"4,1956,59018355738,-;NVRM: Xid (PCI:0000:3b:00): 79, x\n"
                       b" SUBSYSTEM=pci\n DEVICE=+pci:0000:3b:00.0\n")
    assert (rec.seq, rec.usec, rec.level, rec.facility) == (1956, 59018355738, 4, 0)
    assert rec.message == "NVRM: Xid (PCI:0000:3b:00): 79, x"
    assert dict(rec.fields) == {"SUBSYSTEM": "pci", "DEVICE": "+pci:0000:3b:00.0"}
    assert not rec.fragment


def test_record_unescapes_what_the_kernel_escaped():
    # as read back after writing "NVRM: one\nNVRM: two\x41 <0xff 0xfe> end"
    rec = parse_record(b"12,7,1,-;NVRM: one\\x0aNVRM: two\\x5cx41 \\xff\\xfe end\n")
    assert rec.facility == 1 and rec.level == 4
    assert rec.message.startswith("NVRM: one\nNVRM: two\\x41 ")
    assert "\ufffd" in rec.message     # not UTF-8: replaced, never raised


def test_record_with_raw_non_utf8_bytes_and_extra_header_fields():
    rec = parse_record(b"6,12,345,c,caller=T42;caf\xe9 \xff\n")
    assert rec.seq == 12 and rec.fragment
    assert rec.message.startswith("caf")


@pytest.mark.parametrize("raw", [b"", b"no header", b"6,12;x", b"a,b,c,-;x", b"6,-3,1,-;x",
                                 b";", b"\xff\xfe;\n"])
def test_garbage_records_are_refused(raw):
    assert parse_record(raw) is None


def test_random_bytes_never_raise():
    rnd = random.Random(7)
    for _ in range(3000):
        raw = bytes(rnd.randrange(256) for _ in range(rnd.randrange(60)))
        if rnd.random() < 0.5:
            raw = b"4,%d,1,-;NVRM: Xid (" % rnd.randrange(99) + raw
        rec = parse_record(raw)
        parse_gpu_line(raw.decode("utf-8", "replace"))
        if rec is not None:
            parse_gpu_line(rec.message)


# -- driver lines --------------------------------------------------------------

@pytest.mark.parametrize("line,want", [
    ("NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, name=python, GPU has fallen off the bus.",
     dict(pci="0000:3b:00.0", number=79, pid=1234, process="python",
          detail="GPU has fallen off the bus.")),
    ("NVRM: Xid (PCI:0000:3b:00): 13, Graphics Exception: ESR 0x405840=0x0",
     dict(pci="0000:3b:00.0", number=13, pid=None, process=None,
          detail="Graphics Exception: ESR 0x405840=0x0")),
    ("NVRM: Xid (PCI:0000:01:00): 48, pid='<unknown>', name=<unknown>, An uncorrectable "
     "double bit error (DBE) has been detected on GPU in the framebuffer at partition 2",
     dict(pci="0000:01:00.0", number=48, pid=None, process=None)),
    ("NVRM: Xid (PCI:0000:10:1c): 63, pid=1896, Row Remapper: New row marked for remapping, "
     "reset gpu to activate.",
     dict(pci="0000:10:1c.0", number=63, pid=1896, process=None,
          detail="Row Remapper: New row marked for remapping, reset gpu to activate.")),
    ("NVRM: Xid (PCI:0000:01:00 GPU-I:05): 94, pid=7194, Contained: CE User Channel (0x9). "
     "RST: No, D-RST: No",
     dict(pci="0000:01:00.0", number=94, pid=7194, gpu_instance=5)),
    ("NVRM: Xid (0000:01:00): 31, Ch 0000000b, engmask 00000120, intr 10000000",
     dict(pci="0000:01:00.0", number=31, detail="Ch 0000000b, engmask 00000120, intr 10000000")),
    ("NVRM: Xid (PCI:00000000:3B:00.0): 119, pid=77, name=pt_main_thread, Timeout waiting "
     "for RPC from GSP!",
     dict(pci="0000:3b:00.0", number=119, pid=77, process="pt_main_thread")),
    ("[ 1843.308145] NVRM: Xid (PCI:0000:b3:00): 74, pid=1, name=nccl worker, NVLink: fatal",
     dict(pci="0000:b3:00.0", number=74, process="nccl worker", detail="NVLink: fatal")),
    ("NVRM: Xid (PCI:0000:3b:00): 154", dict(number=154, detail="")),
])
def test_xid_lines(line, want):
    ev = parse_gpu_line(line)
    assert ev.kind == "xid"
    assert ev.message.endswith(line.split("] ")[-1])
    for key, value in want.items():
        assert getattr(ev, key) == value, key


def test_sxid_lines():
    ev = parse_gpu_line("nvidia-nvswitch3: SXid (PCI:0000:c7:00.0): 12028, Non-fatal, "
                        "Link 32 egress non-posted PRIV error (First)")
    assert (ev.kind, ev.device, ev.pci, ev.number, ev.fatal) == \
        ("sxid", "nvidia-nvswitch3", "0000:c7:00.0", 12028, False)
    assert ev.detail == "Link 32 egress non-posted PRIV error (First)"
    ev = parse_gpu_line("nvidia-nvswitch0: SXid (PCI:0000:c3:00.0): 01004, Fatal, Link 28 "
                        "ingress invalid command")
    assert (ev.number, ev.fatal, ev.pid) == (1004, True, None)


@pytest.mark.parametrize("line", [
    # the second and third lines of one SXid report: not another error
    "nvidia-nvswitch0: SXid (PCI:0000:c3:00.0): 12033, Severity 1 Engine instance 00 "
    "Sub-engine instance 00",
    "nvidia-nvswitch0: SXid (PCI:0000:c3:00.0): 12033, Data {0x00000000, 0x00000000}",
])
def test_sxid_follow_up_lines_are_not_events(line):
    assert parse_gpu_line(line) is None


def test_fallen_off_the_bus_printed_as_one_record_of_three_lines():
    raw = (b"3,2001,1843308145,-;NVRM: The NVIDIA GPU 0000:b3:00.0\\x0aNVRM: (PCI ID: "
           b"10de:26b5) installed in this system has\\x0aNVRM: fallen off the bus and is "
           b"not responding to commands.\n")
    ev = parse_gpu_line(parse_record(raw).message)
    assert (ev.kind, ev.pci, ev.number) == ("fallen_off_bus", "0000:b3:00.0", None)
    assert "\n" not in ev.message and "10de:26b5" in ev.detail


@pytest.mark.parametrize("line,pci", [
    ("NVRM: GPU 0000:3b:00.0: GPU has fallen off the bus.", "0000:3b:00.0"),
    ("NVRM: The NVIDIA GPU 0000:3B:00.0 (PCI ID: 10de:20b0) installed in this system has "
     "fallen off the bus and is not responding to commands.", "0000:3b:00.0"),
    ("NVRM: GPU has fallen off the bus.", None),
])
def test_fallen_off_the_bus_without_xid(line, pci):
    ev = parse_gpu_line(line)
    assert (ev.kind, ev.pci) == ("fallen_off_bus", pci)


@pytest.mark.parametrize("line,pci,device", [
    ("NVRM: RmInitAdapter failed! (0x22:0x56:742)", None, None),
    ("NVRM: GPU 0000:3b:00.0: RmInitAdapter failed! (0x25:0x65:1457)", "0000:3b:00.0", None),
    ("NVRM: rm_init_adapter failed, device minor number 0", None, "nvidia0"),
    ("NVRM: rm_init_adapter failed, device minor number 7", None, "nvidia7"),
])
def test_adapter_init_failures(line, pci, device):
    ev = parse_gpu_line(line)
    assert (ev.kind, ev.pci, ev.device) == ("init_failed", pci, device)
    assert "failed" in ev.detail


@pytest.mark.parametrize("line", [
    "NVRM: Xid (PCI:0000:3b:00): garbled",
    "NVRM: Xid",
    "NVRM: Xid (PCI:0000:3b:00) 79, missing colon",
    "NVRM: Xid (PCI:0000:3b:00): 79 no comma after the number",
    "nvidia-nvswitch3: SXid (PCI:0000:c1:00.0): garbled, Fatal",
    "SXid",
    # only ASCII digits make an XID number, and no XID has seven of them
    "NVRM: Xid (PCI:0000:3b:00): \u0663, pid=1, name=x",         # an Arabic-Indic three
    "NVRM: Xid (PCI:0000:3b:00): 7\u00b9, pid=1, name=x",        # a superscript one
    "NVRM: Xid (PCI:0000:3b:00): 1234567, pid=1, name=x",
])
def test_malformed_xid_lines_are_marked(line):
    assert parse_gpu_line(line).kind == MALFORMED


@pytest.mark.parametrize("line", [
    "NVRM: loading NVIDIA UNIX x86_64 Kernel Module  535.161.08",
    "NVRM: GPU at PCI:0000:3b:00: GPU-8a1c6a4c-62fc-2b41-6c2b-3b8a1d4b3c2e",
    "NVRM: GPU Board Serial Number: 1650522003345",
    "EXT4-fs (sda1): mounted filesystem with ordered data mode",
    "audit: look for Xid (PCI:0000:3b:00): 79 in the journal",
    "nvidia 0000:3b:00.0: enabling device (0000 -> 0003)",
    "",
])
def test_unrelated_lines_are_ignored(line):
    assert parse_gpu_line(line) is None


@pytest.mark.parametrize("parts,want", [
    (("0000", "3b", "00", None), "0000:3b:00.0"),
    (("00000000", "3B", "00", "0"), "0000:3b:00.0"),
    ((None, "01", "00", None), "0000:01:00.0"),
    (("10000", "01", "00", "1"), "10000:01:00.1"),
])
def test_pci_ids_take_nvmls_form(parts, want):
    assert normalize_pci(*parts) == want


# -- lines any user can shape -------------------------------------------------

# A segfault line begins with the process name (PR_SET_NAME, 15 bytes) and
# ends with the binary's file name: both the user's.
FORGED = [
    "NVRM: Xid ([5375]: segfault at 0 ip 0000000000401000 sp 00007ffd3d1c8e60 error 6 in "
    "0000:3b:00.0):79, pid=1, name=forged,[401000+1000]",
    "NVRM: Xid (PCI:[81]: segfault at 0 ip 0000000000401000 sp 00007ffd3d1c8e60 error 6 in "
    "0000:3b:00):79, pid=1, name=forged,[401000+1000]",
    "nvswitch0: SXid ([91]: segfault at 0 ip 0 sp 0 error 6 in PCI:0000:c3:00.0): 24007, Fatal,",
]


# Lines of the kernel's that start with the user's bytes: a 14-byte process
# name in a segfault, trap or OOM line; an executable's file name (up to 255
# bytes) in the report of a fatal signal (kernel.print-fatal-signals=1)
FORGED += [
    "SXid(e5:00):1,[1234]: segfault at 0 ip 0000000000401000 sp 00007ffd3d1c8e60 error 6 in "
    "crash[401000+1000] likely on CPU 0 (core 0, socket 0)",
    "traps: SXid(e5:00):1,[1234] trap invalid opcode ip:401126 sp:7ffd3d1c8e60 error:0 in "
    "crash[401000+1000]",
    "SXid(e5:00):1, invoked oom-killer: gfp_mask=0xcc0(GFP_KERNEL), order=0, oom_score_adj=0",
    "NVRM: Xid (PCI:0000:e5:00): 79, pid=1, name=forged, x: NVRM: Xid (PCI:: potentially "
    "unexpected fatal signal 11.",
    "nvidia-nvswitch0: SXid (PCI:0000:c3:00.0): 24007, Fatal, x: crash: potentially unexpected "
    "fatal signal 11.",
    "NVRM: GPU has fallen off the bus x: crash: potentially unexpected fatal signal 7.",
    "NVRM: RmInitAdapter failed! x: crash: potentially unexpected fatal signal 6.",
]


@pytest.mark.parametrize("line", FORGED)
def test_a_segfault_line_shaped_like_an_xid_is_not_one(line):
    ev = parse_gpu_line(line)
    assert ev is None or ev.kind == MALFORMED, ev


@pytest.mark.parametrize("line", [
    "NVRM: GPU [77]: segfault at 0 ip 0 sp 0 error 6 in GPU has fallen off the bus 0000:3b:00.0",
    "NVRM: The NVID[7]: segfault at 0 ip 0 sp 0 error 6 in fallen off the bus 0000:3b:00.0",
    "NVRM: RmInitAd[7]: segfault at 0 ip 0 sp 0 error 6 in RmInitAdapter failed!",
])
def test_a_segfault_line_shaped_like_a_lost_gpu_is_not_one(line):
    assert parse_gpu_line(line) is None


def test_a_pid_in_other_digits_is_no_pid_and_no_error():
    ev = parse_gpu_line("NVRM: Xid (PCI:0000:3b:00): 79, pid=\u00b2\u00b3, name=x, GPU has fallen "
                        "off the bus.")
    assert (ev.kind, ev.number, ev.pid, ev.process) == ("xid", 79, None, "x")
