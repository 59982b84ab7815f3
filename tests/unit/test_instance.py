"""Instances: names that stay one path component, the lock that keeps two
agents of one instance apart (and what a hostile lock directory does to it),
per-instance paths, and what `doctor` says about a held instance."""
import os
import signal
import stat
import subprocess
import sys

import pytest

from tracehound import instance
from tracehound.commands.doctor import instance_line
from tracehound.errors import SetupError
from tracehound.instance import InstanceBusy, InstanceLock
from tracehound.probes import rdma_pins

from tests.conftest import tracehound_cmd

ME = os.geteuid()


@pytest.mark.parametrize("name", ["default", "node-01", "a.b_c", "x" * 64, "..a", "-"])
def test_names_that_are_one_path_component_are_instances(name):
    assert instance.check_name(name) == name


@pytest.mark.parametrize("name", ["", ".", "..", "a/b", "../etc", "x" * 65, "nöde", "a b",
                                  "a\n", "a\0b", "/abs"])
def test_anything_else_is_refused(name):
    with pytest.raises(ValueError, match="not an instance name"):
        instance.check_name(name)


@pytest.mark.parametrize("command", [["run"], ["doctor"], ["rdma", "show"]])
def test_each_command_refuses_a_bad_instance_as_a_usage_error(command):
    res = subprocess.run([*tracehound_cmd(), *command, "--instance", "../../etc"],
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 2
    assert "argument --instance: '../../etc' is not an instance name" in res.stderr
    assert "Traceback" not in res.stderr


def test_default_instance_keeps_todays_paths_and_others_get_their_own():
    assert instance.state_dir("default") == "/var/lib/tracehound"
    assert instance.state_dir("node1") == "/var/lib/tracehound/instances/node1"
    # a name the default instance (or the chaos journal) uses there is another instance's directory
    assert instance.state_dir("kmsg-seq") == "/var/lib/tracehound/instances/kmsg-seq"
    assert instance.state_dir("chaos") == "/var/lib/tracehound/instances/chaos"
    assert instance.state_dir("node1", "/srv/th/n1") == "/srv/th/n1"
    assert rdma_pins.pin_path("rdma_objects") == "/sys/fs/bpf/tracehound/default/rdma_objects"
    assert rdma_pins.pin_path("app_objects", "n2") == "/sys/fs/bpf/tracehound/n2/rdma_app_objects"


@pytest.fixture
def run_dir(tmp_path):
    d = tmp_path / "run"
    return str(d)


def test_a_second_lock_of_one_instance_is_refused_naming_the_holder(run_dir):
    with InstanceLock("node1", run_dir, owner=ME):
        with pytest.raises(InstanceBusy) as exc:
            InstanceLock("node1", run_dir, owner=ME).acquire()
        msg = str(exc.value)
        assert "instance 'node1' is already running" in msg
        assert f"pid {os.getpid()}" in msg and "--instance NAME" in msg
        # another name is another instance
        with InstanceLock("node2", run_dir, owner=ME):
            pass
    InstanceLock("node1", run_dir, owner=ME).acquire().release()
    mode = stat.S_IMODE(os.stat(os.path.join(run_dir, "node1.lock")).st_mode)
    assert mode & 0o077 == 0


def test_two_instances_given_one_state_dir_are_refused(run_dir, tmp_path):
    state = str(tmp_path / "state")
    with InstanceLock("node1", run_dir, owner=ME, state=state):
        with pytest.raises(InstanceBusy) as exc:
            InstanceLock("node2", run_dir, owner=ME, state=state).acquire()
        assert f"state directory {state} is in use by another agent (pid {os.getpid()};" \
            in str(exc.value)
        assert "own --state-dir" in str(exc.value)
        # refused whole: node2's own lock was given back
        InstanceLock("node2", run_dir, owner=ME).acquire().release()
        InstanceLock("node2", run_dir, owner=ME, state=str(tmp_path / "s2")).acquire().release()
    assert stat.S_IMODE(os.stat(state).st_mode) & 0o077 == 0


def test_a_state_dir_that_cannot_be_made_only_loses_the_state(run_dir, tmp_path, caplog):
    (tmp_path / "file").write_text("")
    with InstanceLock("n", run_dir, owner=ME, state=str(tmp_path / "file" / "state")) as lock:
        assert lock.instance.fd >= 0
    assert "will not outlive a restart" in caplog.text


def test_a_killed_holder_leaves_no_stale_lock(run_dir):
    holder = subprocess.Popen(
        [sys.executable, "-c",
         "import sys; from tracehound.instance import InstanceLock;"
         "InstanceLock('n', sys.argv[1], owner=int(sys.argv[2])).acquire(); print('held', flush=True);"
         "sys.stdin.read()", run_dir, str(ME)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(InstanceBusy, match=f"pid {holder.pid}"):
            InstanceLock("n", run_dir, owner=ME).acquire()
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait(timeout=30)
    InstanceLock("n", run_dir, owner=ME).acquire().release()


def test_doctor_reads_the_holder_without_taking_the_lock(run_dir):
    assert "default: no agent holds it" in instance_line("default", run_dir)
    with InstanceLock("default", run_dir, owner=ME):
        line = instance_line("default", run_dir)
        assert f"held by the running agent, pid {os.getpid()}" in line
        assert "--instance NAME" in line


def test_doctor_says_when_it_cannot_look_at_the_lock(tmp_path):
    # a lock it cannot look at (as a user: the directory is root's alone) is not a free one
    not_a_dir = tmp_path / "file"
    not_a_dir.write_text("")
    line = instance_line("default", str(not_a_dir))
    assert "[??]" in line and "cannot tell whether an agent holds it" in line


# -- a lock directory or file someone else prepared ---------------------------

def test_a_symlink_for_the_lock_directory_is_refused(tmp_path):
    target = tmp_path / "elsewhere"
    target.mkdir()
    (tmp_path / "run").symlink_to(target)
    with pytest.raises(SetupError, match="must be a directory, not a symbolic link"):
        InstanceLock("n", str(tmp_path / "run"), owner=ME).acquire()
    assert not os.listdir(target)


def test_a_lock_directory_others_can_write_is_refused(run_dir):
    os.mkdir(run_dir)
    os.chmod(run_dir, 0o1777)
    with pytest.raises(SetupError, match="writable by it alone"):
        InstanceLock("n", run_dir, owner=ME).acquire()


def test_a_lock_directory_of_another_owner_is_refused(run_dir):
    os.mkdir(run_dir, 0o755)
    with pytest.raises(SetupError, match=f"must belong to uid {ME + 1}"):
        InstanceLock("n", run_dir, owner=ME + 1).acquire()


def test_a_symlinked_lock_file_is_refused_and_its_target_untouched(run_dir, tmp_path):
    os.mkdir(run_dir, 0o755)
    target = tmp_path / "precious"
    target.write_text("keep")
    os.chmod(target, 0o644)
    os.symlink(target, os.path.join(run_dir, "n.lock"))
    with pytest.raises(SetupError, match="must be a regular file"):
        InstanceLock("n", run_dir, owner=ME).acquire()
    assert target.read_text() == "keep" and stat.S_IMODE(target.stat().st_mode) == 0o644


def test_a_fifo_for_the_lock_file_is_refused_without_hanging(run_dir):
    os.mkdir(run_dir, 0o755)
    os.mkfifo(os.path.join(run_dir, "n.lock"), 0o600)
    with pytest.raises(SetupError, match="must be a regular file"):
        InstanceLock("n", run_dir, owner=ME).acquire()


def test_a_lock_file_others_can_open_is_refused(run_dir):
    # anyone who can open it can flock it, and keep every agent of the
    # instance from starting
    os.mkdir(run_dir, 0o755)
    path = os.path.join(run_dir, "n.lock")
    with open(path, "w"):
        pass
    os.chmod(path, 0o644)
    with pytest.raises(SetupError, match="mode 0600"):
        InstanceLock("n", run_dir, owner=ME).acquire()


def test_a_hard_linked_lock_file_is_refused(run_dir, tmp_path):
    os.mkdir(run_dir, 0o755)
    other = tmp_path / "other"
    other.write_text("")
    os.chmod(other, 0o600)
    os.link(other, os.path.join(run_dir, "n.lock"))
    with pytest.raises(SetupError, match="one link"):
        InstanceLock("n", run_dir, owner=ME).acquire()


def test_the_kernel_lock_table_is_read_by_its_grammar(tmp_path):
    st = os.stat(tmp_path)
    dev = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"
    locks = tmp_path / "locks"
    locks.write_text(
        f"1: -> FLOCK  ADVISORY  WRITE 111 {dev} 0 EOF\n"      # a waiter, not the holder
        f"2: POSIX  ADVISORY  WRITE 222 {dev} 0 EOF\n"         # not a flock
        f"3: FLOCK  ADVISORY  READ  333 {dev} 0 EOF\n"         # shared, not the agent's
        f"4: FLOCK  ADVISORY  WRITE ４４ {dev} 0 EOF\n"         # not ASCII digits
        "garbage\n\n"
        f"5: FLOCK  ADVISORY  WRITE 555 {dev} 0 EOF\n")
    assert instance.holder_pid(st, str(locks)) == 555
    locks.write_text(f"1: -> FLOCK  ADVISORY  WRITE 111 {dev} 0 EOF\n")
    assert instance.holder_pid(st, str(locks)) is None
    assert instance.holder_pid(st, str(tmp_path / "absent")) is None
