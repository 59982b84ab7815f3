"""Hostile input to the agent's flags, its mount table and its HTTP queries:
each ends in one line that names what was wrong, never in a traceback, a
hang or unbounded memory. Every case here failed with a traceback (or read
/dev/zero until the OOM killer came) before."""
import os
import subprocess
import threading

import pytest

from tests.unit.test_cli import one_line_error, th
from tracehound.errors import SetupError
from tracehound.exporter.events import EventLog
from tracehound.exporter.rows import Block
from tracehound.exporter.messages import call_wsgi
from tracehound.exporter.server import parse_listen
from tracehound.host.mounts import MAX_TABLE_BYTES, MountTable, MountTableError
from tests.unit.test_exposition import request

VALID = "22 1 0:21 / /sys rw - sysfs sysfs rw\n30 1 0:26 / /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n"

# flag, value, what the one error line must say
FLAGS = [
    ("--max-entries", "0", "out of range"),
    ("--max-entries", "-1", "not a whole number"),
    ("--max-entries", "2000000000", "out of range"),
    ("--max-entries", "1e3", "not a whole number"),
    ("--max-entries", "²", "not a whole number"),
    ("--max-series", "-1", "not a whole number"),
    ("--max-series", "99999999999", "out of range"),
    ("--rdma-grace", "-5", "out of range"),
    ("--rdma-grace", "0", "out of range"),
    ("--rdma-grace", "nan", "out of range"),
    ("--rdma-grace", "inf", "out of range"),
    ("--rdma-grace", "soon", "not a number"),
    ("--stall-after", "-1", "out of range"),
    ("--stall-after", "nan", "out of range"),
    ("--stall-after", "soon", "not a number"),
    ("--stall-cgroups", "(", "not a regular expression"),
    ("--net-max-sockets", "0", "out of range"),
    ("--net-max-cgroups", "-1", "not a whole number"),
    ("--pressure-max-cgroups", "0", "out of range"),
    ("--kubelet-url", "garbage://x", "not an http"),
    ("--kubelet-url", "http://", "not an http"),
    ("--latency-histograms", "pod", "invalid choice"),
    ("--latency", "io.open", "expected on, off"),
    ("--latency", "io.read,", "expected on, off"),
    ("--latency", "", "expected on, off"),
    ("--cgroup-key", "blkio", "invalid choice"),
    ("--cgroup-scope", "slurm_n1", "an absolute cgroup path"),
    ("--cgroup-scope", "/slurm_n1\n/", "an absolute cgroup path"),
    ("--cgroup-scope", "/" + "x" * 5000, "an absolute cgroup path"),
]


@pytest.mark.parametrize("flag,value,says", FLAGS)
def test_out_of_range_flags_are_refused_naming_the_flag(flag, value, says):
    res = th("run", f"{flag}={value}")
    assert res.returncode == 2 and "Traceback" not in res.stderr
    last = res.stderr.strip().splitlines()[-1]
    assert flag in last and says in last, last


@pytest.mark.parametrize("value", ["127.0.0.1:²", "127.0.0.1:99999", "127.0.0.1:" + "9" * 50,
                                   "127.0.0.1", ":-1"])
def test_bad_listen_addresses_are_one_line(value):
    with pytest.raises(SetupError, match="--listen"):
        parse_listen(value)


def hostile_tables(tmp_path):
    """name -> path of a file (or not) that --mountinfo could be pointed at."""
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    binary = tmp_path / "binary"
    binary.write_bytes(os.urandom(4096))
    malformed = tmp_path / "malformed"
    malformed.write_text(VALID + "this is not a mount\n")
    empty = tmp_path / "empty"
    empty.write_text("")
    huge = tmp_path / "huge"
    with open(huge, "wb") as f:
        f.truncate(MAX_TABLE_BYTES + 1)          # sparse: costs no disk
    return {"missing": tmp_path / "nope", "directory": tmp_path, "/dev/zero": "/dev/zero",
            "/dev/urandom": "/dev/urandom", "fifo": fifo, "binary": binary,
            "malformed": malformed, "empty": empty, "huge": huge}


HOSTILE = ["missing", "directory", "/dev/zero", "/dev/urandom", "fifo", "binary", "malformed",
           "empty", "huge"]


@pytest.mark.parametrize("name", HOSTILE)
def test_hostile_mount_tables_fail_fast_with_the_path(tmp_path, name):
    path = str(hostile_tables(tmp_path)[name])
    done = []

    def read():
        try:
            MountTable(path)
        except MountTableError as exc:
            done.append(str(exc))
    t = threading.Thread(target=read, daemon=True)
    t.start()
    t.join(10)                    # a FIFO or a device must not block or read forever
    assert not t.is_alive(), f"reading {name} did not return"
    assert done and done[0].startswith(path), done


def test_a_copy_of_a_valid_table_is_refused_for_its_namespace(tmp_path):
    copy = tmp_path / "mountinfo"
    copy.write_text(VALID)
    table = MountTable(str(copy))
    assert table.cgroup2_root() == "/sys/fs/cgroup"
    with pytest.raises(MountTableError, match="not a copy"):
        table.mount_namespace_inode()


def test_a_broken_refresh_keeps_the_last_good_table(tmp_path):
    path = tmp_path / "mountinfo"
    path.write_text(VALID)
    table = MountTable(str(path))
    path.write_text("garbage\n")
    with pytest.raises(MountTableError, match="line 1"):
        table.refresh()
    assert [m.mountpoint for m in table.mounts] == ["/sys", "/sys/fs/cgroup"]


def test_mount_points_that_are_not_utf8_are_kept_and_exported_as_valid_utf8(tmp_path):
    path = tmp_path / "mountinfo"
    path.write_bytes(VALID.encode() + b"40 1 0:50 / /mnt/\xff\xfe rw - tmpfs t rw\n")
    mount = MountTable(str(path)).by_id[40]
    # the kernel's bytes survive for the probe's path trie
    assert mount.mountpoint.encode("utf-8", "surrogateescape") == b"/mnt/\xff\xfe"
    block = Block(("mountpoint",), (mount.mountpoint,))
    assert block.braced.decode("utf-8") == '{mountpoint="/mnt/\ufffd\ufffd"}'


@pytest.mark.skipif(os.geteuid() != 0, reason="the root check runs first; needs root to reach this one")
@pytest.mark.parametrize("name", ["/dev/zero", "fifo", "malformed", "empty"])
def test_the_agent_names_the_flag_for_a_hostile_mount_table(tmp_path, name):
    path = str(hostile_tables(tmp_path)[name])
    try:
        res = th("run", "--listen", "127.0.0.1:0", "--mountinfo", path)
    except subprocess.TimeoutExpired:
        pytest.fail(f"the agent hung on --mountinfo {name}")
    one_line_error(res, "--mountinfo", path)


@pytest.mark.parametrize("since", ["%C2%B2", "9" * 5000, "-1", "1.5", "0x10"])
def test_events_since_that_is_no_sequence_number_is_400(since):
    response = call_wsgi(EventLog().wsgi, request(query=f"since={since}"))
    assert response.status == 400
    assert b"sequence number" in response.body


@pytest.mark.skipif(os.path.isdir("/sys/module/ib_core") or os.path.isdir("/sys/class/infiniband"),
                    reason="this host has an RDMA subsystem: the case is a host without one")
def test_rdma_show_without_rdma_says_what_the_host_lacks():
    one_line_error(th("rdma", "show"), "no RDMA subsystem", "modprobe ib_core")
    assert "NETLINK" not in th("rdma", "show").stderr


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to make a journal only root can read")
def test_chaos_recover_without_the_rights_to_read_the_journal_fails(tmp_path):
    journal = tmp_path / "journal"
    journal.mkdir(mode=0o700)
    (journal / "run.jsonl").write_text('{"event": "run-start", "run": "r1", "pid": 999999}\n')
    os.chmod(tmp_path, 0o755)
    res = th("chaos", "recover", "--journal", str(journal), user=65534)
    assert res.returncode != 0, res.stdout + res.stderr
    assert "nothing to recover" not in res.stdout
    assert "cannot recover" in res.stderr and str(journal) in res.stderr
    assert "Traceback" not in res.stderr
