"""The cgroup walk, PSI parsing and process states over a fake cgroup tree
and a fake /proc: missing files, garbage, huge files, vanished processes."""
import os

import pytest

from tracehound.host import cgroup_state as cs

PSI = ("some avg10=0.00 avg60=0.00 avg300=0.00 total={some}\n"
       "full avg10=0.00 avg60=0.00 avg300=0.00 total={full}\n")


def cgroup(root, rel, pids=(), populated=True, psi=True, extra=None):
    d = os.path.join(root, rel.strip("/")) if rel != "/" else str(root)
    os.makedirs(d, exist_ok=True)
    if rel != "/":
        with open(os.path.join(d, "cgroup.events"), "w") as f:
            f.write(f"populated {int(populated)}\nfrozen 0\n")
    with open(os.path.join(d, "cgroup.procs"), "w") as f:
        f.write("".join(f"{p}\n" for p in pids))
    if psi:
        for i, res in enumerate(cs.RESOURCES):
            with open(os.path.join(d, f"{res}.pressure"), "w") as f:
                f.write(PSI.format(some=1000 * (i + 1), full=10 * (i + 1)))
    for name, text in (extra or {}).items():
        with open(os.path.join(d, name), "wb") as f:
            f.write(text if isinstance(text, bytes) else text.encode())
    return d


def proc(proc_root, pid, state, comm="worker"):
    d = os.path.join(proc_root, str(pid))
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "stat"), "w") as f:
        f.write(f"{pid} ({comm}) {state} 1 {pid} {pid} 0 -1 4194560 100 0 0 0 5 3 0 0 20 0 1 0\n")


@pytest.fixture
def tree(tmp_path):
    root, procs = tmp_path / "cg", tmp_path / "proc"
    cgroup(root, "/", pids=[1, 2])
    cgroup(root, "/job", pids=[])                        # interior: processes live below
    cgroup(root, "/job/step", pids=[10, 11, 12, 13, 14, 15, 99])
    cgroup(root, "/empty", populated=False)
    cgroup(root, "/empty/child", pids=[20])             # below an unpopulated one: never read
    for pid, state in ((1, "S"), (2, "I"), (10, "R"), (11, "S"), (12, "D"), (13, "T"),
                       (14, "t"), (15, "Z"), (20, "R")):
        proc(procs, pid, state)
    return str(root), str(procs)


def test_walk_reads_populated_cgroups_with_ids_paths_pressure_and_states(tree):
    root, procs = tree
    w = cs.walk(root, 100, procs)
    assert [c.path for c in w.cgroups] == ["/", "/job", "/job/step"]
    assert not w.truncated and w.visited == 3              # /empty is looked at, not counted
    by = {c.path: c for c in w.cgroups}
    assert by["/"].cgroup_id == os.stat(root).st_ino
    assert by["/job/step"].cgroup_id == os.stat(os.path.join(root, "job/step")).st_ino
    assert by["/job"].pressure[("memory", "some")] == 2000
    assert by["/job"].pressure[("io", "full")] == 30
    # pid 99 vanished between cgroup.procs and its stat
    assert by["/job/step"].states == {"running": 1, "sleeping": 1, "disk": 1, "stopped": 2,
                                      "zombie": 1, "other": 0}
    assert by["/"].states["other"] == 1                     # an idle kernel thread
    assert sum(by["/job"].states.values()) == 0


def test_walk_stops_at_max_cgroups_and_says_so(tree):
    root, procs = tree
    # breadth first, names in order: /, /empty (looked at, skipped, not counted), /job,
    # then the cap
    w = cs.walk(root, 2, procs)
    assert [c.path for c in w.cgroups] == ["/", "/job"]
    assert w.visited == 2 and w.truncated
    assert not cs.walk(root, 3, procs).truncated


def test_empty_directories_cost_looks_not_cgroups_and_a_users_come_last(tree):
    """A user's directories (below one they own) are walked after root's,
    however their names sort; empty ones only cost the walk a look each, up
    to LOOKS_PER_CGROUP per cgroup it may read."""
    if os.geteuid() != 0:
        pytest.skip("chown needs root")
    root, procs = tree
    cgroup(root, "/a-user", pids=[])
    os.chown(os.path.join(root, "a-user"), 65534, 65534)
    cgroup(root, "/a-user/busy", pids=[20])
    assert [c.path for c in cs.walk(root, 100, procs).cgroups] == \
        ["/", "/a-user", "/job", "/job/step", "/a-user/busy"]
    for i in range(30):
        cgroup(root, f"/a-user/a-empty{i:02d}", populated=False)   # before busy
    w = cs.walk(root, 100, procs)
    assert w.visited == 5 and not w.truncated
    w = cs.walk(root, 5, procs)                     # 5 cgroups, 20 looks: spent on the empties
    assert [c.path for c in w.cgroups] == ["/", "/a-user", "/job", "/job/step"] and w.truncated


def test_process_states_of_one_cgroup(tree):
    root, procs = tree
    states = cs.process_states(os.path.join(root, "job/step"), procs)
    assert states["stopped"] == 2 and set(states) == set(cs.STATES)
    assert cs.process_states(os.path.join(root, "gone"), procs) == dict.fromkeys(cs.STATES, 0)


def test_missing_pressure_files_and_lines_are_absent(tmp_path):
    root = tmp_path / "cg"
    cgroup(root, "/", psi=False)
    cgroup(root, "/a", pids=[], psi=False, extra={"cpu.pressure": "some avg10=0 total=77\n"})
    w = cs.walk(str(root), 10, str(tmp_path / "proc"))
    by = {c.path: c for c in w.cgroups}
    assert by["/a"].pressure == {("cpu", "some"): 77}      # old kernels: no cpu full line
    assert by["/"].pressure == {}


def test_the_root_falls_back_to_proc_pressure(tmp_path):
    root, procs = tmp_path / "cg", tmp_path / "proc"
    cgroup(root, "/", psi=False)
    os.makedirs(procs / "pressure")
    (procs / "pressure" / "io").write_text(PSI.format(some=5, full=6))
    w = cs.walk(str(root), 10, str(procs))
    assert w.cgroups[0].pressure == {("io", "some"): 5, ("io", "full"): 6}
    assert cs.psi_absent(str(root), str(procs)) is not None     # but no cpu pressure
    (procs / "pressure" / "cpu").write_text(PSI.format(some=1, full=0))
    assert cs.psi_absent(str(root), str(procs)) is None


@pytest.mark.parametrize("text", [
    b"", b"\n\n", b"garbage\n", b"some total=\n", b"some total=-5\n", b"some total=1e9\n",
    b"some total=\xff\xfe\n", b"some avg10=1.0\n", b"some total=" + b"9" * 40 + b"\n",
    b"\x00" * 100, b"full total=\xd9\xa3\n",           # an Arabic-Indic digit is not a digit here
])
def test_garbage_pressure_lines_are_ignored(text):
    assert cs.parse_pressure(text) == {}


def test_pressure_parse_takes_the_first_of_each_kind():
    assert cs.parse_pressure(b"full total=3\nsome total=1\nsome total=2\nwhat total=4\n") == \
        {"full": 3, "some": 1}


def test_huge_files_are_read_with_a_cap(tmp_path):
    root, procs = tmp_path / "cg", tmp_path / "proc"
    many = list(range(100000, 100000 + 40000))
    d = cgroup(root, "/", pids=[])
    with open(os.path.join(d, "cgroup.procs"), "w") as f:
        f.write("".join(f"{p}\n" for p in many))
    (root / "cpu.pressure").write_bytes(b"some total=5\n" + b"x" * 10**6 + b"\nfull total=9\n")
    pids, cut = cs.read_pids(d)
    assert cut and len(pids) <= cs.MAX_PIDS and pids[0] == 100000
    w = cs.walk(str(root), 10, str(procs))
    assert w.cgroups[0].pids_cut and w.cgroups[0].pressure[("cpu", "some")] == 5
    assert ("cpu", "full") not in w.cgroups[0].pressure          # past the cap


def test_pid_limit(tmp_path):
    d = cgroup(tmp_path / "cg", "/", pids=[1, 2, 3])
    assert cs.read_pids(d, limit=3) == ([1, 2, 3], False)
    assert cs.read_pids(d, limit=2) == ([1, 2], True)


def test_garbage_in_cgroup_procs_and_proc_stat(tmp_path):
    root, procs = tmp_path / "cg", tmp_path / "proc"
    d = cgroup(root, "/", pids=[])
    with open(os.path.join(d, "cgroup.procs"), "wb") as f:
        f.write(b"1\n-2\nabc\n\xff\n3 4\n" + b"9" * 30 + b"\n5\n")
    proc(procs, 1, "R", comm="a) (b) S")               # a hostile command name
    proc(procs, 3, "?")                                  # an unknown state
    os.makedirs(procs / "4")
    (procs / "4" / "stat").write_bytes(b"4 (truncated")  # nothing after the name
    os.makedirs(procs / "5")
    (procs / "5" / "stat").write_bytes(b"")              # empty: treated as gone
    assert cs.read_pids(d) == ([1, 3, 4, 5], False)
    assert cs.process_states(d, str(procs)) == {"running": 1, "sleeping": 0, "disk": 0,
                                                "stopped": 0, "zombie": 0, "other": 2}


def test_a_cgroup_removed_mid_walk_is_left_out(tmp_path, monkeypatch):
    root, procs = tmp_path / "cg", tmp_path / "proc"
    cgroup(root, "/")
    cgroup(root, "/a", pids=[])
    cgroup(root, "/b", pids=[])
    real = cs.os.scandir

    def scandir(path):
        if str(path).endswith("/a"):
            raise FileNotFoundError(path)
        return real(path)
    monkeypatch.setattr(cs.os, "scandir", scandir)
    assert [c.path for c in cs.walk(str(root), 10, str(procs)).cgroups] == ["/", "/b"]


def test_a_missing_root_walks_nothing(tmp_path):
    w = cs.walk(str(tmp_path / "none"), 10)
    assert w.cgroups == [] and not w.truncated


def test_unreadable_events_count_as_populated(tmp_path):
    root = tmp_path / "cg"
    cgroup(root, "/")
    d = cgroup(root, "/a", extra={"cgroup.events": b"\xff garbage\n"})
    assert cs.populated(d)
    os.remove(os.path.join(d, "cgroup.events"))
    assert cs.populated(d)
