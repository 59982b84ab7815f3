"""GPU errors from this machine's real kernel log (/dev/kmsg), read by a real
agent: the gpu.xid experiment detected, with the XID's meaning and
severity, the count exact across an agent restart, malformed driver lines
counted.

No GPU is needed: the lines are written to /dev/kmsg in the driver's form,
each test with a PCI bus id of its own (a random PCI domain), so the host's
real kernel log and earlier runs cannot add to what a test counts."""
import json
import os
import secrets
import shutil
import subprocess
import tempfile
import threading
import time
import urllib.request

import pytest

from tests.kernel.conftest import require_tools, series, start_agent, stop_agent
from tests.kernel.test_chaos_examples import run_example
from tracehound.gpu.kmsg_parse import parse_record

KMSG = "/dev/kmsg"
DETECT_INTERVAL_S = 0.5
FATAL_WINDOW_S = 4
XID = "tracehound_gpu_xid_errors_total"


def _devkmsg_writable() -> str | None:
    try:
        with open("/proc/sys/kernel/printk_devkmsg") as f:
            if f.read().strip() == "off":
                return "printk_devkmsg=off: the kernel refuses lines written to /dev/kmsg"
    except OSError:
        pass
    return None if os.access(KMSG, os.W_OK) else f"{KMSG} is not writable"


pytestmark = pytest.mark.skipif(_devkmsg_writable() is not None,
                                reason=_devkmsg_writable() or "")


def unique_pci() -> str:
    """A bus id in a PCI domain no machine uses, new for every call."""
    return f"{0x1000 + secrets.randbelow(0xe000):04x}:{secrets.randbelow(256):02x}:" \
           f"{secrets.randbelow(32):02x}.0"


def driver_form(pci: str) -> str:
    domain, bus, rest = pci.split(":")
    return f"PCI:{domain}:{bus}:{rest.split('.')[0]}"


def write_kmsg(text: str) -> None:
    # a fresh open per line: the kernel rate-limits each open file's writes
    fd = os.open(KMSG, os.O_WRONLY)
    try:
        os.write(fd, f"<4>{text}\n".encode())
    finally:
        os.close(fd)


def wait_value(agent, name: str, want: float, timeout: float = 15, **labels) -> float:
    deadline = time.monotonic() + timeout
    got = None
    while time.monotonic() < deadline:
        got = series(agent.scrape(), name, **labels)
        if got == want:
            return got
        time.sleep(0.1)
    return got


def events(agent) -> list[dict]:
    url = agent.url.removesuffix("/metrics") + "/events"
    with urllib.request.urlopen(url, timeout=10) as r:
        return json.load(r)["events"]


def positioned_state_dir() -> str:
    """A private --state-dir holding the kernel log's newest position: an
    agent started on it reads only lines logged after, not what earlier runs
    (and other tests) left in the ring, which would take up the few distinct
    bus ids an agent without NVML keeps labels for."""
    d = tempfile.mkdtemp(prefix="thtest-state-")     # mode 0700, root's: a directory it trusts
    fd = os.open(KMSG, os.O_RDONLY | os.O_NONBLOCK)
    seq = None
    try:
        while True:
            try:
                seq = int(os.read(fd, 16384).split(b",", 2)[1])
            except BrokenPipeError:
                continue
            except BlockingIOError:
                break
    finally:
        os.close(fd)
    with open("/proc/sys/kernel/random/boot_id") as f:
        boot = f.read().strip()
    if seq is not None:
        with open(os.path.join(d, "kmsg-seq"), "w") as f:
            f.write(f"{seq} {boot}\n")
    return d


def drain(agent) -> threading.Thread:
    """Read the agent's output as it comes: each XID event is also a log
    line, and a pipe nobody reads would block the agent's writes."""
    t = threading.Thread(target=lambda: agent.proc.stdout.read(), daemon=True)
    t.start()
    return t


@pytest.fixture
def state_dir():
    d = positioned_state_dir()
    yield d
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture(scope="module")
def kmsg_agent(hook_mode):
    """An agent of its own: a private kernel-log position and a short fatal-XID window."""
    d = positioned_state_dir()
    a = start_agent(hook_mode, "--state-dir", d, "--gpu-fatal-xid-window", str(FATAL_WINDOW_S))
    drain(a)        # it reads every test's lines, the noisy log's 300 too
    yield a
    stop_agent(a)
    shutil.rmtree(d, ignore_errors=True)


def test_gpu_xid_experiment_is_detected_with_the_xids_meaning(kmsg_agent):
    pci = unique_pci()
    run = run_example(kmsg_agent, "gpu-xid.yaml", {
        "CHAOS_GPU_PCI": pci, "CHAOS_XID": "48",
        "CHAOS_DETECT_INTERVAL": str(DETECT_INTERVAL_S)})
    assert run.code == 0, run.err
    for probe in ("tracehound-counts-xid", "tracehound-reports-xid"):
        d = run.detection(probe)
        assert d["detected"] and d["tracehound_signal"], d
        # the query asks about this bus id and this XID, nothing broader
        assert f'pci_bus_id="{pci}"' in d["query"] and 'xid="48"' in d["query"], d
        print(f"{probe}: MTTD {d['mttd_seconds']:.3f} s (detection interval "
              f"{DETECT_INTERVAL_S} s)")
    assert "nothing to undo" in run.record["faults"][0]["rollback_note"]

    event = run.detection("tracehound-reports-xid")["event"]
    assert (event["kind"], event["xid"], event["pci_bus_id"]) == ("xid", 48, pci)
    assert (event["name"], event["severity"]) == ("double-bit ECC error", "fatal")
    assert event["action"] and event["source"] == "kmsg"
    assert (event["driver_pid"], event["driver_process"]) == (1, "tracehound-chaos")

    m = kmsg_agent.scrape()
    assert series(m, XID, pci_bus_id=pci, xid="48") == 1
    info = {("xid", "48"), ("name", "double-bit ECC error"), ("severity", "fatal")}
    assert [v for (n, ls), v in m.items() if n == "tracehound_gpu_xid_info" and info <= ls] == [1]
    # the fatal XID is recent, then the window passes and the condition clears
    health = dict(pci_bus_id=pci, condition="recent_fatal_xid")
    assert series(m, "tracehound_gpu_health", **health) == 1
    assert wait_value(kmsg_agent, "tracehound_gpu_health", 0, FATAL_WINDOW_S + 5, **health) == 0
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        cleared = [e for e in events(kmsg_agent) if e.get("event") == "gpu_health"
                   and e.get("pci_bus_id") == pci and e.get("state") == "cleared"]
        if cleared:
            break
        time.sleep(0.2)
    assert cleared and cleared[0]["condition"] == "recent_fatal_xid", cleared


def test_lines_written_while_the_agent_is_down_count_once_after_it_restarts(
        hook_mode, state_dir):
    pci = unique_pci()
    line = f"NVRM: Xid ({driver_form(pci)}): 13, pid=4242, name=python, Graphics Exception"
    a = start_agent(hook_mode, "--state-dir", state_dir)
    try:
        for _ in range(2):
            write_kmsg(line)
        assert wait_value(a, XID, 2, pci_bus_id=pci, xid="13") == 2
    finally:
        stop_agent(a)
    assert os.path.exists(os.path.join(state_dir, "kmsg-seq"))
    for _ in range(3):
        write_kmsg(line)            # nobody reading
    b = start_agent(hook_mode, "--state-dir", state_dir)
    try:
        # the ring is read in order: once the third new line is counted, the
        # two the first agent counted have been passed over, not counted again
        assert wait_value(b, XID, 3, pci_bus_id=pci, xid="13") == 3
        # a later line, counted once read: every line before it was read too,
        # so the count of the five above is final
        write_kmsg(f"NVRM: Xid ({driver_form(pci)}): 31, pid=4242, name=python, later")
        assert wait_value(b, XID, 1, pci_bus_id=pci, xid="31") == 1
        assert series(b.scrape(), XID, pci_bus_id=pci, xid="13") == 3
    finally:
        stop_agent(b)


def kernel_messages() -> list[str]:
    """Every record's message in the kernel ring, oldest first (what the
    agent reads: /dev/kmsg records, not dmesg's formatting)."""
    out = []
    fd = os.open(KMSG, os.O_RDONLY | os.O_NONBLOCK)
    try:
        while True:
            try:
                rec = parse_record(os.read(fd, 8192))
            except BlockingIOError:
                return out
            except BrokenPipeError:     # a record overwritten while read: the next one
                continue
            if rec is not None:
                out.append(rec.message)
    finally:
        os.close(fd)


def driver_lines_between(first: str, last: str) -> list[str]:
    """The kernel's records from the one saying FIRST to the one saying LAST,
    those that mention an Xid or SXid: any the agent may count."""
    messages = kernel_messages()
    i = max(n for n, m in enumerate(messages) if m == first)
    j = max(n for n, m in enumerate(messages) if m == last)
    return [m for m in messages[i:j + 1] if "Xid" in m]


def test_malformed_driver_lines_are_skipped_and_counted(kmsg_agent):
    # The malformed count is the host's; the check is exact for a window in
    # which no one else logged a driver line (the ring says), tried anew if not.
    for _ in range(5):
        pci = unique_pci()
        # counted: every line before it was read, so `before` is complete
        first = f"NVRM: Xid ({driver_form(pci)}): 31, pid=1, name=x, before"
        write_kmsg(first)
        assert wait_value(kmsg_agent, XID, 1, pci_bus_id=pci, xid="31") == 1
        before = series(kmsg_agent.scrape(), "tracehound_gpu_kmsg_malformed_total")
        bad = [f"NVRM: Xid ({driver_form(pci)}): not-a-number, pid=1, name=x",
               f"NVRM: Xid ({driver_form(pci)}",
               "NVRM: Xid"]
        for text in bad:
            write_kmsg(text)
        last = f"NVRM: Xid ({driver_form(pci)}): 31, pid=1, name=x, after"
        write_kmsg(last)
        assert wait_value(kmsg_agent, XID, 2, pci_bus_id=pci, xid="31") == 2
        m = kmsg_agent.scrape()
        if driver_lines_between(first, last) != [first, *bad, last]:
            continue                    # another writer's driver line fell in the window
        # read in order: by the time the good line is counted the bad ones were seen
        assert series(m, "tracehound_gpu_kmsg_malformed_total") == before + len(bad)
        assert series(m, XID, pci_bus_id=pci) == 2
        assert series(m, "tracehound_gpu_kmsg_up") == 1
        return
    pytest.fail("five windows in a row had another writer's driver lines in the kernel log")


SEGFAULT_C = r"""
#include <sys/prctl.h>
int main(void) {
    prctl(PR_SET_NAME, "NVRM: Xid (", 0, 0, 0);   /* the start of the kernel's line */
    *(volatile int *)0 = 1;                        /* its end: this file's name */
    return 0;
}
"""


def kernel_lines_with(text: str) -> int:
    out = subprocess.run(["dmesg", "--raw"], capture_output=True, text=True, check=True).stdout
    return out.count(text)


def crashing_binary(tmp_path, name: str):
    """SEGFAULT_C built as bin/NAME in a directory uid 65534 can reach."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    os.chmod(tmp_path, 0o755)
    os.chmod(bindir, 0o755)
    src = tmp_path / "crash.c"
    src.write_text(SEGFAULT_C)
    binary = bindir / name
    subprocess.run(["gcc", "-O0", "-o", str(binary), str(src)], check=True)
    os.chmod(binary, 0o755)
    return binary


def test_an_unprivileged_segfault_shaped_like_a_fatal_xid_counts_nothing(kmsg_agent, tmp_path):
    """Any user's crashing program puts its name first and its file's name
    last in the kernel's segfault line: named to read as a fatal XID of a
    real-looking GPU, the line is a malformed driver line, never an XID."""
    require_tools("gcc", "setpriv", "dmesg")
    with open("/proc/sys/debug/exception-trace") as f:
        assert f.read().strip() == "1", "debug.exception-trace=0: the kernel logs no segfaults"
    pci = unique_pci()
    binary = crashing_binary(tmp_path, f"{pci}):79, pid=1, name=forged,")
    before = series(kmsg_agent.scrape(), "tracehound_gpu_kmsg_malformed_total")
    marker = f"{pci}):79"
    logged = kernel_lines_with(marker)
    deadline = time.monotonic() + 60
    # the kernel rate-limits segfault lines: crash until one is logged
    while kernel_lines_with(marker) == logged:
        assert time.monotonic() < deadline, "the kernel logged no segfault line"
        crash = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups",
                                str(binary)], capture_output=True)
        assert crash.returncode == -11, crash      # SIGSEGV, as nobody
    # a well-formed line after it: read in order, the crash's line was seen first
    write_kmsg(f"NVRM: Xid ({driver_form(pci)}): 31, pid=1, name=x, after the crash")
    assert wait_value(kmsg_agent, XID, 1, pci_bus_id=pci, xid="31") == 1
    m = kmsg_agent.scrape()
    assert not [k for k in m if k[0] == XID and ("pci_bus_id", pci) in k[1]
                and ("xid", "79") in k[1]], "the crash was counted as an XID"
    assert series(m, "tracehound_gpu_kmsg_malformed_total") >= before + 1
    assert not [e for e in events(kmsg_agent) if e.get("pci_bus_id") == pci and e.get("xid") == 79]
    assert series(m, "tracehound_gpu_kmsg_up") == 1


def gpu_series(m: dict, family: str) -> list[dict]:
    return [dict(ls) for (n, ls) in m if n == family]


NOISY_LINES = 300


def test_hostile_crashes_and_a_noisy_log_keep_the_series_bounded(hook_mode, tmp_path):
    """A real binary run as uid 65534 under many hostile names crashes again
    and again, and root writes XID lines for 300 distinct bus ids (a noisy
    log): the agent, which has no NVML here, keeps labels for at most
    BUS_IDS_WITHOUT_NVML bus ids, folds the rest into "other" and counts
    them, gives "other" no health gauge, and keeps reading."""
    from tracehound.gpu.kmsg_labels import BUS_IDS_WITHOUT_NVML, OTHER
    require_tools("gcc", "setpriv", "dmesg")
    marker = f"thnoise{secrets.token_hex(4)}"
    first = crashing_binary(tmp_path, "crash")
    bindir = first.parent
    names = []
    for i in range(40):     # each a bus id and an XID of its own, some not UTF-8
        name = os.fsencode(f"{marker}{i}):{unique_pci()}): {79 + i}, pid=1, name=forged,")
        names.append(bindir / os.fsdecode(name + (b"\xff\xfe" if i % 2 else b"")))
        os.link(first, names[-1])
    d = positioned_state_dir()
    agent = start_agent(hook_mode, "--state-dir", d)
    drain(agent)
    try:
        before = agent.scrape()
        crashes = 0
        deadline = time.monotonic() + 60
        # the kernel rate-limits segfault lines: crash until a few are logged
        while crashes < len(names) or kernel_lines_with(marker) < 3:
            assert time.monotonic() < deadline, "the kernel logged too few segfault lines"
            crash = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534",
                                    "--clear-groups", str(names[crashes % len(names)])],
                                   capture_output=True)
            assert crash.returncode == -11, crash      # SIGSEGV, as nobody
            crashes += 1
        domain = 0x1000 + secrets.randbelow(0xd000)
        for n in range(NOISY_LINES):
            write_kmsg(f"NVRM: Xid (PCI:{domain + n // 256:04x}:{n % 256:02x}:00): 79, pid=1, "
                       f"name={marker}, noisy log")
        want = series(before, XID, xid="79") + NOISY_LINES
        deadline = time.monotonic() + 30
        while series(agent.scrape(), XID, xid="79") < want:
            assert time.monotonic() < deadline, "the noisy lines were not all counted"
            time.sleep(0.1)
        m = agent.scrape()
        xid_buses = {ls["pci_bus_id"] for ls in gpu_series(m, XID)}
        health_buses = {ls["pci_bus_id"] for ls in gpu_series(m, "tracehound_gpu_health")}
        assert len(xid_buses - {OTHER}) <= BUS_IDS_WITHOUT_NVML and OTHER in xid_buses
        assert len(health_buses) <= BUS_IDS_WITHOUT_NVML and OTHER not in health_buses
        assert len(gpu_series(m, XID)) <= 2 * (BUS_IDS_WITHOUT_NVML + 1)
        folded = "tracehound_gpu_kmsg_folded_total"
        assert series(m, folded, label="pci_bus_id") >= \
            series(before, folded, label="pci_bus_id") + NOISY_LINES - BUS_IDS_WITHOUT_NVML
        # the crashes were read (as malformed driver lines) and counted as no XID
        assert series(m, "tracehound_gpu_kmsg_malformed_total") >= \
            series(before, "tracehound_gpu_kmsg_malformed_total") + 3
        assert not [ls for ls in gpu_series(m, XID) if ls["xid"] != "79"]
        assert series(m, "tracehound_gpu_kmsg_up") == 1
        print(f"{crashes} crashes as uid 65534, {NOISY_LINES} bus ids written: "
              f"{len(gpu_series(m, XID))} XID series, "
              f"{len(gpu_series(m, 'tracehound_gpu_health'))} health series")
    finally:
        stop_agent(agent)
        shutil.rmtree(d, ignore_errors=True)
