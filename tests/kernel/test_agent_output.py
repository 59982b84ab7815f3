"""The agent's own output can never hold it: with standard error a pipe that
no one reads any more (a harness done with start-up, a supervisor that
stopped draining it), a kernel log full of GPU errors, each one an event and
a log line, must still be counted, scraped and stopped on SIGTERM."""
import fcntl
import signal
import struct
import subprocess
import termios

import pytest

from tests.kernel.conftest import require_tools, start_agent
from tests.kernel.test_gpu_kmsg import (
    XID,
    driver_form,
    positioned_state_dir,
    unique_pci,
    wait_value,
    write_kmsg,
)

F_SETPIPE_SZ = 1031
PIPE_BYTES = 4096           # the smallest pipe: a page
LINES = 60                  # each an event and a log line of ~150 bytes: twice the pipe


def test_an_unread_standard_error_never_stops_the_agent(hook_mode):
    require_tools("dmesg")
    agent = start_agent(hook_mode, "--state-dir", positioned_state_dir())
    try:
        # from here on no one reads the agent's output, and the pipe holds a page
        fcntl.fcntl(agent.proc.stdout.fileno(), F_SETPIPE_SZ, PIPE_BYTES)
        pci = unique_pci()
        for n in range(LINES):
            write_kmsg(f"NVRM: Xid ({driver_form(pci)}): 31, pid=1, name=x, unread output {n}")
        got = wait_value(agent, XID, LINES, timeout=60, pci_bus_id=pci, xid="31")
        assert got == LINES, f"counted {got} of {LINES} lines: the agent is held by its output"
        unread = struct.unpack("i", fcntl.ioctl(agent.proc.stdout.fileno(), termios.FIONREAD,
                                                b"\0\0\0\0"))[0]
        print(f"unread output when stopped: {unread} bytes")
        assert unread > PIPE_BYTES // 2, "the pipe was not filled: the test proves nothing"
        agent.proc.send_signal(signal.SIGTERM)
        try:
            agent.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            agent.proc.kill()
            pytest.fail("the agent ignored SIGTERM while its standard error was full")
        assert agent.proc.returncode == 0
        said = agent.proc.stdout.read()
        assert "Xid" in said or "xid" in said.lower(), said[-2000:]
    finally:
        if agent.proc.poll() is None:
            agent.proc.kill()
            agent.proc.wait()
