"""The runner, journal, recovery and report, end to end through the CLI,
with small test faults that change real files."""
import json
import os
import signal
import subprocess
import time

import pytest

from tests.conftest import tracehound_cmd
from tracehound import cli
from tracehound.chaos import faults as catalog
from tracehound.chaos import journal as journal_mod
from tracehound.chaos.cli import EXIT_ROLLBACK
from tracehound.chaos.faults import Arg, Fault, FaultError, Prepared

STATE_DIR = {}


class MarkerFault(Fault):
    """Writes a marker file; rollback deletes it. Checks, when applied, that
    its intent is already on disk in the journal."""
    name = "test.marker"
    summary = "test fault"
    args = {"path": Arg(str, "marker file", required=True),
            "journal": Arg(str, "journal dir to check", required=True)}

    def prepare(self, args, fault_id):
        return Prepared([args["path"]], {"path": args["path"], "journal": args["journal"]})

    def apply(self, state):
        records = [r for f in os.listdir(state["journal"])
                   for r in journal_mod.read_records(os.path.join(state["journal"], f))]
        assert any(r["event"] == "fault" and r["state"]["path"] == state["path"]
                   for r in records), "applied before being journaled"
        with open(state["path"], "w") as f:
            f.write("1\n")
        return {"written": True}

    def rollback(self, state):
        if os.path.exists(state["path"]):
            os.unlink(state["path"])
        return None


class StubbornFault(MarkerFault):
    name = "test.stubborn"
    broken = True

    def rollback(self, state):
        if StubbornFault.broken:
            raise FaultError("the undo is broken")
        return super().rollback(state)


@pytest.fixture
def test_faults(monkeypatch):
    monkeypatch.setitem(catalog.catalog(), "test.marker", MarkerFault())
    monkeypatch.setitem(catalog.catalog(), "test.stubborn", StubbornFault())
    StubbornFault.broken = True


def record_call(path: str, text: str) -> str:
    with open(path, "a") as f:
        f.write(text + "\n")
    return text


def experiment(tmp_path, fault="test.marker", extra_method="", rollbacks=""):
    marker = tmp_path / "marker"
    log = tmp_path / "calls"
    j = tmp_path / "journal"
    return marker, log, f"""
title: runner test
description: exercises every phase
steady-state-hypothesis:
  title: true is true
  probes:
    - type: probe
      name: true-works
      tolerance: 0
      provider: {{type: process, path: "true"}}
method:
  - type: action
    name: first
    provider: {{type: python, module: tests.unit.test_chaos_runner, func: record_call,
               arguments: {{path: "{log}", text: first}}}}
  - type: action
    name: mark
    provider: {{type: tracehound, fault: {fault}, arguments: {{path: "{marker}",
               journal: "{j}"}}}}
  - type: probe
    name: see-marker
    provider:
      type: tracehound
      detect: {{source: process, command: [sh, -c, 'cat "{marker}" 2>/dev/null || echo 0'],
               extract: '(\\d+)',
               predicate: "> 0", timeout: 60, interval: 0.05}}
{extra_method}
rollbacks:
  - type: action
    name: last
    provider: {{type: python, module: tests.unit.test_chaos_runner, func: record_call,
               arguments: {{path: "{log}", text: last}}}}
{rollbacks}
"""


def run(tmp_path, text, *extra):
    """The experiments here run `true`, `test` and record_call(): consented."""
    path = tmp_path / "exp.yaml"
    path.write_text(text)
    return cli.main(["chaos", "run", str(path), "--allow-code", "--journal",
                     str(tmp_path / "journal"), "--report", str(tmp_path / "report"), *extra])


def test_full_run_journals_detects_rolls_back_and_reports(tmp_path, test_faults, capsys):
    marker, log, text = experiment(tmp_path)
    assert run(tmp_path, text, "--yes") == 0
    out = capsys.readouterr().out
    assert "detection 'see-marker' of test.marker: detected yes" in out
    assert not marker.exists()
    assert log.read_text().split() == ["first", "last"]
    [jl] = os.listdir(tmp_path / "journal")
    events = [r["event"] for r in journal_mod.read_records(str(tmp_path / "journal" / jl))]
    assert events == ["run-start", "rollbacks-declared", "fault", "applied", "rolled-back",
                      "rollbacks-run", "run-end"]
    reports = sorted(os.listdir(tmp_path / "report"))
    assert {r.rsplit("-", 1)[-1].split(".", 1)[-1] for r in reports} >= {"json", "md"}
    md = next(tmp_path / "report" / r for r in reports if r.endswith(".md"))
    text = md.read_text()
    assert "| status | **completed** |" in text and "**yes**" in text
    assert "after rollback**: met" in text
    record = json.loads(next((tmp_path / "report" / r) for r in reports
                             if r.endswith("journal.json")).read_text())
    [det] = record["detections"]
    assert det["detected"] and not det["tracehound_signal"]
    # before the fault the marker was not there (0); under it, 1
    assert det["before"] == 0 and det["value"] == 1
    assert "| before the fault | under the fault (last) |" in text and "| 0.0 | 1.0 |" in text
    # detected at the reading the samples end with, counted from the fault
    assert det["mttd_seconds"] >= 0 and det["samples"][-1] == [det["mttd_seconds"], 1]
    assert record["faults"][0]["rollback"] == "done"


def test_destructive_faults_are_a_dry_run_without_yes(tmp_path, test_faults, capsys):
    marker, log, text = experiment(tmp_path)
    assert run(tmp_path, text) == 0
    out = capsys.readouterr().out
    assert "nothing is applied" in out and "pass --yes" in out
    assert "would affect" in out
    assert not marker.exists() and not log.exists()
    assert not (tmp_path / "journal").exists() and not (tmp_path / "report").exists()
    assert run(tmp_path, text, "--yes", "--dry-run") == 0
    assert not marker.exists()


def test_explicit_rollback_action_in_the_method(tmp_path, test_faults, capsys):
    marker, log, text = experiment(tmp_path, extra_method="""
  - type: probe
    name: marker-still-there
    provider: {type: process, path: test, arguments: [-e, "%s"]}
  - type: action
    name: unmark
    provider: {type: tracehound, rollback: mark}
  - type: probe
    name: marker-gone
    provider: {type: process, path: test, arguments: [-e, "%s"]}
""" % (tmp_path / "marker", tmp_path / "marker"))
    assert run(tmp_path, text, "--yes") == 0
    record = json.loads(next((tmp_path / "report").glob("*journal.json")).read_text())
    status = {r["name"]: r["output"]["status"] for r in record["runs"]
              if r["provider"] == "process"}
    assert status == {"marker-still-there": 0, "marker-gone": 1}


def test_rollback_failures_are_loud_and_recoverable(tmp_path, test_faults, capsys):
    marker, _, text = experiment(tmp_path, fault="test.stubborn")
    assert run(tmp_path, text, "--yes") == 3
    err = capsys.readouterr().err
    assert "ROLLBACK FAILED: test.stubborn (mark)" in err and "the undo is broken" in err
    assert marker.exists()
    j = str(tmp_path / "journal")
    assert cli.main(["chaos", "recover", "--journal", j]) == 3
    assert "ROLLBACK FAILED" in capsys.readouterr().err
    StubbornFault.broken = False
    assert cli.main(["chaos", "recover", "--journal", j]) == 0
    assert not marker.exists()
    assert cli.main(["chaos", "recover", "--journal", j]) == 0
    assert "nothing to recover" in capsys.readouterr().out


def test_a_torn_last_line_is_ignored(tmp_path):
    j = journal_mod.Journal(str(tmp_path), "r1", "t", "f")
    j.fault("r1-1", "a", "io.fill", {}, {"file": "/x"}, ["x"])
    j.close()
    with open(tmp_path / "r1.jsonl", "a") as f:
        f.write('{"event": "rolled-back", "id": "r1-')
    [pending] = journal_mod.pending_faults(journal_mod.read_records(str(tmp_path / "r1.jsonl")))
    assert pending.id == "r1-1"


def test_a_live_run_is_never_recovered(tmp_path):
    j = journal_mod.Journal(str(tmp_path), "live", "t", "f")
    j.fault("live-1", "a", "io.fill", {}, {"file": "/x"}, ["x"])
    assert journal_mod.dead_runs(str(tmp_path)) == []
    j.close()
    [dead] = journal_mod.dead_runs(str(tmp_path))
    journal_mod.release(dead)


def fill_experiment(tmp_path, pause: int) -> str:
    st = os.statvfs(tmp_path)
    # 24 MiB to write (twice that, with a killed run's fill still there, is
    # under max_bytes): other work writing to the same file system before
    # the fault starts must not leave it below its target already
    keep = st.f_bavail * st.f_frsize - (24 << 20)
    return f"""
title: killed mid-fault
description: io.fill, then a long wait
method:
  - type: action
    name: fill
    provider: {{type: tracehound, fault: io.fill, arguments: {{path: "{tmp_path / 'fs'}",
               free_bytes: {keep}, allow_root_fs: true, max_bytes: 67108864}}}}
    pauses: {{after: {pause}}}
"""


def start_run(tmp_path, text):
    (tmp_path / "fs").mkdir(exist_ok=True)
    path = tmp_path / "exp.yaml"
    path.write_text(text)
    proc = subprocess.Popen(tracehound_cmd() + ["chaos", "run", str(path), "--yes",
                                                "--journal", str(tmp_path / "journal"),
                                                "--report", str(tmp_path / "report")],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and not os.listdir(tmp_path / "fs"):
        time.sleep(0.02)
    assert os.listdir(tmp_path / "fs"), proc.communicate(timeout=5)
    return proc


@pytest.mark.skipif(os.geteuid() != 0, reason="chaos run applies faults as root only")
def test_sigterm_rolls_back_and_exits_130(tmp_path):
    proc = start_run(tmp_path, fill_experiment(tmp_path, 60))
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 130, err
    assert "SIGTERM received: rolling back" in err
    assert os.listdir(tmp_path / "fs") == []
    md = next((tmp_path / "report").glob("*.md")).read_text()
    assert "**interrupted**" in md


@pytest.mark.skipif(os.geteuid() != 0, reason="chaos run applies faults as root only")
def test_sigkill_then_recover_and_next_run_recovers_first(tmp_path):
    proc = start_run(tmp_path, fill_experiment(tmp_path, 60))
    proc.kill()
    proc.wait(timeout=10)
    assert len(os.listdir(tmp_path / "fs")) == 1          # left behind by the killed run
    out = subprocess.run(tracehound_cmd() + ["chaos", "recover", "--journal",
                                             str(tmp_path / "journal")],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "rolled back io.fill (fill)" in out.stdout
    assert os.listdir(tmp_path / "fs") == []
    # a crash again, then a plain run: it cleans up before it starts
    proc = start_run(tmp_path, fill_experiment(tmp_path, 60))
    proc.kill()
    proc.wait(timeout=10)
    (tmp_path / "exp.yaml").write_text(fill_experiment(tmp_path, 0))
    out = subprocess.run(tracehound_cmd() + ["chaos", "run", str(tmp_path / "exp.yaml"),
                                             "--yes", "--journal", str(tmp_path / "journal"),
                                             "--report", str(tmp_path / "report")],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.index("recovering run") < out.stdout.index("applied io.fill")
    assert os.listdir(tmp_path / "fs") == []


def test_failed_steady_state_skips_the_method(tmp_path, test_faults, capsys):
    marker, log, text = experiment(tmp_path)
    text = text.replace("tolerance: 0", "tolerance: 1")      # `true` exits 0, not 1
    assert run(tmp_path, text, "--yes") == 1
    assert not log.read_text().startswith("first")           # only the rollbacks ran
    assert log.read_text().split() == ["last"]
    record = json.loads(next((tmp_path / "report").glob("*journal.json")).read_text())
    assert record["status"] == "failed" and record["faults"] == []


def test_background_activities_run_alongside(tmp_path, test_faults):
    marker, log, text = experiment(tmp_path, extra_method=f"""
  - type: action
    name: slow-in-background
    background: true
    provider: {{type: python, module: tests.unit.test_chaos_runner, func: record_call,
               arguments: {{path: "{tmp_path / 'calls'}", text: background}}}}
""")
    assert run(tmp_path, text, "--yes") == 0
    assert sorted(log.read_text().split()) == ["background", "first", "last"]


def test_recover_runs_the_declared_rollbacks_a_killed_run_never_ran(tmp_path, capsys):
    """The run died after its method started: no fault left, but its own
    rollback (here: remove what its helper made) never ran."""
    made = tmp_path / "made-by-the-helper"
    made.write_text("x")
    j = journal_mod.Journal(str(tmp_path / "journal"), "r1", "killed", "f")
    j.declare_rollbacks([{"type": "action", "name": "clean-up",
                          "provider": {"type": "process", "path": "rm",
                                       "arguments": ["-f", str(made)]}},
                         {"type": "action", "name": "lift",
                          "provider": {"type": "tracehound", "rollback": "mark"}}])
    j.close()               # as a SIGKILL would: no run-end, the lock gone with the process
    assert cli.main(["chaos", "recover", "--journal", str(tmp_path / "journal")]) == 0
    out = capsys.readouterr().out
    assert "ran the experiment's rollback 'clean-up'" in out and not made.exists()
    assert cli.main(["chaos", "recover", "--journal", str(tmp_path / "journal")]) == 0
    assert "nothing to recover" in capsys.readouterr().out


def test_a_run_that_ran_its_rollbacks_leaves_nothing_to_recover(tmp_path, test_faults, capsys):
    marker, _, text = experiment(tmp_path)
    assert run(tmp_path, text, "--yes") == 0
    records = journal_mod.read_records(next((tmp_path / "journal").glob("*.jsonl")))
    assert [r["event"] for r in records if r["event"].startswith("rollbacks-")] \
        == ["rollbacks-declared", "rollbacks-run"]
    assert cli.main(["chaos", "recover", "--journal", str(tmp_path / "journal")]) == 0
    assert "nothing to recover" in capsys.readouterr().out


def test_a_declared_rollback_that_fails_stays_pending_until_one_succeeds(tmp_path, capsys):
    """Only the rollback that failed is tried again; before, the failure was
    journaled as run and the next recover said there was nothing to do."""
    made, ran = tmp_path / "made", tmp_path / "ran"
    j = journal_mod.Journal(str(tmp_path / "journal"), "r1", "killed", "f")
    j.declare_rollbacks([
        {"type": "action", "name": "count", "provider": {
            "type": "process", "path": "sh", "arguments": ["-c", f"echo x >> {ran}"]}},
        {"type": "action", "name": "clean-up", "provider": {
            "type": "python", "module": "os", "func": "remove",
            "arguments": {"path": str(made)}}}])
    j.close()
    journal = str(tmp_path / "journal")
    assert cli.main(["chaos", "recover", "--journal", journal]) == EXIT_ROLLBACK  # nothing to remove yet
    assert "ROLLBACK FAILED: the experiment's rollback 'clean-up'" in capsys.readouterr().err
    assert ran.read_text() == "x\n"
    made.write_text("x")
    assert cli.main(["chaos", "recover", "--journal", journal]) == 0
    out = capsys.readouterr().out
    assert "ran the experiment's rollback 'clean-up'" in out and "'count'" not in out
    assert not made.exists() and ran.read_text() == "x\n"
    assert cli.main(["chaos", "recover", "--journal", journal]) == 0
    assert "nothing to recover" in capsys.readouterr().out
