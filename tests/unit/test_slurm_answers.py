"""Slurm's answers come from other processes: read with a deadline and a size cap.

Every command case runs a real executable in place of scontrol.
"""
import logging
import os
import subprocess
import sys
import time
import tracemalloc

import pytest

from tracehound.attribution.slurm_jobs import (
    MAX_ANSWER_BYTES,
    BoundedCommand,
    ScontrolListPids,
    StepdProcessTitle,
    StepEnvironment,
    parse_listpids,
)
from tests.unit.fixtures.fakeproc import add_process

LOGGER = "tracehound.attribution.slurm_jobs"
TABLE = ("PID      JOBID    STEPID   LOCALID GLOBALID\n"
         "3913212  13073    batch    0        0\n"
         "1079629  13074    0+1      -        -\n")
NO_STEPS = 'echo "No job steps exist on this node." >&2\nexit 1\n'


def _script(tmp_path, body, name="scontrol", mode=0o755):
    path = tmp_path / name
    path.write_text("#!/bin/sh\n" + body.replace("PIDFILE", str(tmp_path / "pid")))
    path.chmod(mode)
    return path


def _warnings(caplog):
    return [r.getMessage() for r in caplog.records if r.name == LOGGER and r.levelno == logging.WARNING]


def _live_in_group(pgid):
    """Pids of the group that are not zombies (this container's init may not reap them)."""
    live = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if int(fields[2]) == pgid and fields[0] not in "ZX":
            live.append(int(name))
    return live


def _assert_group_gone(tmp_path):
    """SIGKILL was sent to the group before the answer came back; dying takes
    the kernel a moment, which this waits for (generously)."""
    pgid = int((tmp_path / "pid").read_text())
    deadline = time.monotonic() + 30
    while _live_in_group(pgid) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert _live_in_group(pgid) == []


# (name, script body, timeout, asked pid, expected answer, warning or None,
#  whether the script wrote its pid to check that its process group is gone).
# The timeout is generous where it is not what the case is about: an answer
# that only came by killing the command would carry a "no answer" warning.
CASES = [
    ("valid table", f"cat <<'EOF'\n{TABLE}EOF\n", 30, 1079629, ("13074", "0+1"), None, False),
    ("node with no job", NO_STEPS, 30, 1079629, None, None, False),
    ("sleeps forever", "echo $$ > PIDFILE\nsleep 1000\n", 0.5, 1079629, None,
     "listpids: no answer within 0.5 s; killed", True),
    # its exit, not the end of stdout (the child holds it), ends the answer
    ("answers, leaves a child holding stdout", f"echo $$ > PIDFILE\ncat <<'EOF'\n{TABLE}EOF\n"
     "sleep 1000 &\nexit 0\n", 30, 3913212, ("13073", "batch"), None, True),
    ("prints 100 MB", "echo $$ > PIDFILE\nhead -c 100000000 /dev/zero\n", 30, 1079629, None,
     f"listpids: printed more than {MAX_ANSWER_BYTES // 2**20} MiB; killed", True),
    ("not UTF-8", r"printf 'PID JOBID STEPID\n\377\376 1 0\n7 \377 0\n8 1 \377\n9 2 batch\n'" "\n",
     30, 9, ("2", "batch"), None, False),
    ("exit 1 with a message", 'echo "slurm_load_ctl_conf error: Unable to contact slurm controller" >&2\n'
     "exit 1\n", 30, 1079629, None,
     "listpids: exited 1: slurm_load_ctl_conf error: Unable to contact slurm controller", False),
    ("exit 4, terminal escapes on stderr", r"printf '\033[2Jbad\tthing\r\n' >&2; exit 4" "\n", 30, 1079629,
     None, "listpids: exited 4: ?[2Jbad?thing", False),
    ("a table, then exit 2", f"cat <<'EOF'\n{TABLE}EOF\nexit 2\n", 30, 1079629, None,
     "listpids: exited 2", False),
    ("killed by a signal", "kill -9 $$\n", 30, 1079629, None, "listpids: killed by signal 9", False),
    ("garbage", r"printf 'hello world\nPID JOBID\n1 2 3\n\001\002\n'" "\n", 30, 1, None, None, False),
    ("empty answer", "exit 0\n", 30, 1079629, None, None, False),
]


@pytest.mark.parametrize(("body", "timeout", "pid", "expected", "warning", "group"),
                         [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_scontrol_answers(tmp_path, caplog, body, timeout, pid, expected, warning, group):
    caplog.set_level(logging.INFO, LOGGER)
    scontrol = _script(tmp_path, body)
    source = ScontrolListPids(str(scontrol), timeout=timeout)
    assert source(pid) == expected
    if warning is None:
        assert _warnings(caplog) == []
    else:
        assert _warnings(caplog) == [f"{scontrol} {warning}"]
    if group:
        _assert_group_gone(tmp_path)


@pytest.mark.parametrize("make", [
    lambda tmp_path: tmp_path / "not-installed",
    lambda tmp_path: _script(tmp_path, "exit 0\n", mode=0o644),
    lambda tmp_path: tmp_path,
], ids=["missing", "not executable", "a directory"])
def test_scontrol_that_cannot_run(tmp_path, caplog, make):
    caplog.set_level(logging.INFO, LOGGER)
    path = make(tmp_path)
    assert ScontrolListPids(str(path))(1079629) is None
    [message] = _warnings(caplog)
    assert message.startswith(f"{path} listpids: cannot run: ")


def test_long_stderr_is_cut_to_one_short_line(tmp_path, caplog):
    scontrol = _script(tmp_path, "head -c 1000000 /dev/zero | tr '\\0' x >&2\necho second line >&2\nexit 3\n")
    assert BoundedCommand()([str(scontrol)], 5) == ""
    assert _warnings(caplog) == [f"{scontrol}: exited 3: " + "x" * 200]


def test_output_over_the_cap_is_not_held(tmp_path, caplog):
    scontrol = _script(tmp_path, "echo $$ > PIDFILE\nexec yes\n")
    tracemalloc.start()
    try:
        # the cap, not the deadline, ends it: the warning says which
        assert BoundedCommand(max_bytes=MAX_ANSWER_BYTES)([str(scontrol)], 60) == ""
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 3 * MAX_ANSWER_BYTES
    assert _warnings(caplog) == [f"{scontrol}: printed more than 4 MiB; killed"]
    _assert_group_gone(tmp_path)


def test_an_answer_exactly_at_the_cap_is_used(tmp_path):
    # 23 bytes of table and 1001 spaces
    scontrol = _script(tmp_path, "printf 'PID JOBID STEPID\\n5 6 0\\n'; head -c 1001 /dev/zero | tr '\\0' ' '\n")
    answer = BoundedCommand(max_bytes=1024)([str(scontrol)], 5)
    assert len(answer) == 1024 and parse_listpids(answer) == {5: ("6", "0")}
    assert BoundedCommand(max_bytes=1023)([str(scontrol)], 5) == ""


def test_a_warning_is_logged_once_until_the_reason_changes(tmp_path, caplog):
    caplog.set_level(logging.INFO, LOGGER)
    state = tmp_path / "state"
    scontrol = _script(tmp_path, f"case $(cat {state}) in\n"
                                 "down) echo 'connect failure' >&2; exit 1;;\n"
                                 "slow) sleep 1000;;\n"
                                 "idle) " + NO_STEPS.replace("\n", "; ") + ";;\n"
                                 f"*) cat <<'EOF'\n{TABLE}EOF\n;;\nesac\n")
    source = ScontrolListPids(str(scontrol), min_interval=3600, timeout=0.5)
    seen = []
    for answer in ["down", "down", "down", "slow", "slow", "down", "up", "up", "down", "idle", "down"]:
        state.write_text(answer)
        source.refresh()
        seen.append(source(1079629))
    assert seen == [None] * 6 + [("13074", "0+1")] * 2 + [None] * 3
    messages = [(r.levelname, r.getMessage().split(": ", 1)[1]) for r in caplog.records if r.name == LOGGER]
    assert messages == [
        ("WARNING", "exited 1: connect failure"),
        ("WARNING", "no answer within 0.5 s; killed"),
        ("WARNING", "exited 1: connect failure"),
        ("INFO", "answers again"),
        ("WARNING", "exited 1: connect failure"),
        ("INFO", "answers again"),                  # a node with no job is an answer
        ("WARNING", "exited 1: connect failure"),
    ]


@pytest.mark.parametrize(("text", "expected"), [
    ("PID JOBID STEPID\n99999999999 1 0\n5 1 0\n", {5: ("1", "0")}),         # no such pid
    ("PID JOBID STEPID\n4194305 1 0\n4194304 1 0\n", {4194304: ("1", "0")}),  # above PID_MAX_LIMIT
    ("PID JOBID STEPID\n5 4294967296 0\n6 4294967295 0\n", {6: ("4294967295", "0")}),
    ("PID JOBID STEPID\n5 99999999999999999999 0\n", {}),
    ("PID JOBID STEPID\n+5 1 0\n1_0 1 0\n\u00b2 1 0\n5 \u00b2 0\n5 \u0663 0\n", {}),  # not ASCII digits
    ("PID JOBID STEPID\n5 1 " + "9" * 40 + "\n6 1 b;tch\n7 1 \ufffd\n", {}),
    ("PID JOBID STEPID\n0 1 0\n-1 1 0\n-5 1 0\n", {}),
], ids=["huge pid", "pid above the limit", "job id above uint32", "huge job id", "not ASCII digits",
        "bad steps", "pid not positive"])
def test_parse_listpids_skips_values_slurm_cannot_print(text, expected):
    assert parse_listpids(text) == expected


def test_environ_over_the_cap_is_skipped(tmp_path):
    big = {"SLURM_JOB_ID": "77", "SLURM_STEP_ID": "0", "PAD": "x" * (10 * 2**20)}
    fits = {"PAD": "x" * (2**20 - 100), "SLURM_JOB_ID": "78", "SLURM_STEP_ID": "1"}
    add_process(tmp_path, 10, environ=big)
    add_process(tmp_path, 11, environ=fits)
    add_process(tmp_path, 12, environ={"SLURM_JOB_ID": "79", "SLURM_STEP_ID": "0\nfake_metric 1"})
    add_process(tmp_path, 13, environ={"SLURM_JOB_ID": "79", "SLURM_STEP_ID": "x" * 100_000})
    add_process(tmp_path, 14, environ={"SLURM_JOB_ID": "9" * 40})
    source = StepEnvironment(str(tmp_path))
    assert [source(pid) for pid in (10, 11, 12, 13, 14)] == [None, ("78", "1"), None, None, None]


def test_long_cmdline_is_matched_from_its_start(tmp_path):
    add_process(tmp_path, 20, uid=0, exe="/usr/sbin/slurmstepd", cmdline=["slurmstepd: [42.batch]", "x" * 2**20])
    add_process(tmp_path, 21, uid=0, exe="/usr/sbin/slurmstepd", cmdline=["x" * 2**20 + "slurmstepd: [43.0]"])
    source = StepdProcessTitle(str(tmp_path))
    assert source(20) == ("42", "batch")
    assert source(21) is None


# An endless file stands for an answer that would not fit in memory: read in a
# child with little address space, so an unbounded read fails that child only.
_ENDLESS = """
import os, resource, sys
resource.setrlimit(resource.RLIMIT_AS, (512 * 2**20, 512 * 2**20))
from tracehound.attribution.slurm_jobs import StepdProcessTitle, StepEnvironment
root = sys.argv[1]
print(StepdProcessTitle(root)(30), StepEnvironment(root)(30))
"""


def test_proc_files_that_never_end(tmp_path):
    add_process(tmp_path, 30, uid=0, exe="/usr/sbin/slurmstepd", environ={})
    for name in ("cmdline", "environ"):
        os.remove(tmp_path / "30" / name)
        os.symlink("/dev/zero", tmp_path / "30" / name)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    done = subprocess.run([sys.executable, "-c", _ENDLESS, str(tmp_path)], capture_output=True,
                          text=True, timeout=30, env=env)
    assert (done.returncode, done.stdout) == (0, "None None\n"), done.stderr[-2000:]
