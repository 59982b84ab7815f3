"""Kernel lines that start with bytes any user chooses, made for real by a
program run as uid 65534, read by a real agent: none counts as a GPU or
NVSwitch error. A process name of 14 bytes starts the kernel's segfault and
trap lines ("SXid(e5:00):1,[pid]: segfault at ..."); an executable's file
name starts its report of a fatal signal when kernel.print-fatal-signals is
1, a common knob when debugging crashes ("NVRM: Xid (...): 79, ...: comm:
potentially unexpected fatal signal 11.")."""
import os
import subprocess
import time

from tests.kernel.conftest import require_tools, series
from tests.kernel.test_gpu_kmsg import (XID, driver_form, kernel_lines_with, kmsg_agent,  # noqa: F401
                                        unique_pci, wait_value, write_kmsg)

SXID = "tracehound_gpu_nvswitch_sxid_errors_total"
FALLEN = "tracehound_gpu_fallen_off_bus_total"
# a program that names itself COMM and dies: of SIGSEGV, or of SIGILL (a trap)
CRASH_C = r"""
#include <sys/prctl.h>
int main(int argc, char **argv) {
    prctl(PR_SET_NAME, COMM, 0, 0, 0);
    if (argc > 1)
        __builtin_trap();
    *(volatile int *)0 = 1;
    return 0;
}
"""


def build(tmp_path, name: str, comm: str):
    """CRASH_C as bin/NAME, named COMM when it runs, where uid 65534 reaches it."""
    bindir = tmp_path / "bin"
    bindir.mkdir(exist_ok=True)
    os.chmod(tmp_path, 0o755)
    os.chmod(bindir, 0o755)
    src = tmp_path / "crash.c"
    src.write_text(CRASH_C)
    binary = bindir / name
    subprocess.run(["gcc", "-O0", f"-DCOMM={comm!r}".replace("'", '"'), "-o", str(binary),
                    str(src)], check=True)
    os.chmod(binary, 0o755)
    return binary


def crash_until_logged(binary, marker: str, *args: str, signal: int = -11) -> None:
    """Run BINARY as nobody until the kernel logged a line with MARKER (it
    rate-limits its segfault and trap lines)."""
    logged = kernel_lines_with(marker)
    deadline = time.monotonic() + 60
    while kernel_lines_with(marker) == logged:
        assert time.monotonic() < deadline, f"the kernel logged no line with {marker!r}"
        done = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups",
                               str(binary), *args], capture_output=True)
        assert done.returncode == signal, done


def sxid_counted(m: dict, pci: str) -> float:
    return series(m, SXID, pci_bus_id=pci)


def test_a_process_named_like_an_sxid_that_crashes_or_traps_counts_nothing(
        kmsg_agent, tmp_path):  # noqa: F811
    require_tools("gcc", "setpriv", "dmesg")
    with open("/proc/sys/debug/exception-trace") as f:
        assert f.read().strip() == "1", "debug.exception-trace=0: the kernel logs no segfaults"
    before = sxid_counted(kmsg_agent.scrape(), "0000:e5:00.0")
    binary = build(tmp_path, "crash", "SXid(e5:00):1,")
    crash_until_logged(binary, "SXid(e5:00):1,[")                      # its segfault line
    crash_until_logged(binary, "traps: SXid(e5:00):1,[", "trap", signal=-4)   # its trap line
    # then the driver's own form: read in order, the crashes' lines came first
    pci = unique_pci()
    write_kmsg(f"nvidia-nvswitch0: SXid ({driver_form(pci)}.0): 12028, Non-fatal, after them")
    deadline = time.monotonic() + 15
    while not sxid_counted(kmsg_agent.scrape(), pci):
        assert time.monotonic() < deadline, "the driver's SXid line was not counted"
        time.sleep(0.1)
    assert sxid_counted(kmsg_agent.scrape(), "0000:e5:00.0") == before


def test_an_executable_named_like_a_fatal_xid_counts_nothing_with_print_fatal_signals(
        kmsg_agent, tmp_path):  # noqa: F811
    require_tools("gcc", "setpriv", "dmesg")
    pci = unique_pci()
    xid_name = f"NVRM: Xid ({driver_form(pci)}): 79, pid=1, name=forged, x"
    fallen_name = f"NVRM: GPU {pci}: GPU has fallen off the bus x"
    xid_binary = build(tmp_path, xid_name, "crash")
    fallen_binary = xid_binary.parent / fallen_name
    os.link(xid_binary, fallen_binary)
    with open("/proc/sys/kernel/print-fatal-signals") as f:
        was = f.read().strip()
    try:
        with open("/proc/sys/kernel/print-fatal-signals", "w") as f:
            f.write("1")
        for binary in (xid_binary, fallen_binary):
            crash_until_logged(binary, f"{binary.name}: crash: potentially unexpected fatal")
    finally:
        with open("/proc/sys/kernel/print-fatal-signals", "w") as f:
            f.write(was)
    write_kmsg(f"NVRM: Xid ({driver_form(pci)}): 31, pid=1, name=x, after the crashes")
    assert wait_value(kmsg_agent, XID, 1, pci_bus_id=pci, xid="31") == 1
    m = kmsg_agent.scrape()
    assert series(m, XID, pci_bus_id=pci, xid="79") == 0, "the crash was counted as an XID"
    assert series(m, FALLEN, pci_bus_id=pci) == 0, "the crash was counted as a lost GPU"
    assert series(m, "tracehound_gpu_health", pci_bus_id=pci) == 0, "the GPU was judged unfit"
