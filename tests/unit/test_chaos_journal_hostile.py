"""Journals that are not what a run writes: a JSON list, a record of the
wrong shape, a directory named *.jsonl, a FIFO, a symbolic link, a file
others can write. Each is moved into quarantine/ and named, the exit status
says so (4), and the good journal beside it is still recovered; a journal
directory others can write is refused. Real files, through the real CLI."""
import json
import os
import subprocess
from types import SimpleNamespace

import pytest

from tests.conftest import tracehound_cmd
from tracehound import cli
from tracehound.chaos import journal as journal_mod
from tracehound.chaos.cli import EXIT_QUARANTINED

# the good dead run: its declared rollback removes a file its helper made
GOOD_RUN = "20260101T000000-good"


def dead_run(journal, made) -> None:
    j = journal_mod.Journal(str(journal), GOOD_RUN, "killed", "f")
    j.declare_rollbacks([{"type": "action", "name": "clean-up",
                          "provider": {"type": "process", "path": "rm",
                                       "arguments": ["-f", str(made)]}}])
    j.close()            # as SIGKILL leaves it: no run-end, no lock


def recover_apart(journal) -> subprocess.CompletedProcess:
    """In a process of its own where it could hang (timeout: fails by name)."""
    return subprocess.run(tracehound_cmd() + ["chaos", "recover", "--journal", str(journal)],
                          capture_output=True, text=True, timeout=60)


@pytest.fixture
def recover(capsys):
    """`tracehound chaos recover` in this process (quicker), as a CompletedProcess."""
    def go(journal):
        code = cli.main(["chaos", "recover", "--journal", str(journal)])
        out, err = capsys.readouterr()
        return SimpleNamespace(returncode=code, stdout=out, stderr=err)
    return go


def plant_list(path):
    path.write_text('[{"event": "fault"}]\n')


def plant_wrong_shape(path):
    path.write_text(json.dumps({"event": "fault", "id": "x", "fault": "io.fill",
                                "state": [1, 2]}) + "\n")


def plant_directory(path):
    path.mkdir()


def plant_fifo(path):
    os.mkfifo(path, 0o600)


def plant_world_writable(path):
    path.write_text('{"event": "run-start", "run": "w"}\n')
    os.chmod(path, 0o666)


def plant_only_garbage(path):
    path.write_bytes(b"\xff\xfe not a journal \x00\n" * 3)


def plant_deep(path):
    path.write_text("[" * 200_000 + "]" * 200_000 + "\n")


PLANTS = {"deep": (plant_deep, "is nested too deep"),
          "json-list": (plant_list, "is a JSON list, not a record"),
          "wrong-shape": (plant_wrong_shape, "'state' of a fault record must be dict"),
          "directory": (plant_directory, "is not a regular file"),
          "fifo": (plant_fifo, "is not a regular file (a FIFO)"),
          "world-writable": (plant_world_writable, "is writable by group and others"),
          "garbage": (plant_only_garbage, "no line is a journal record")}


@pytest.mark.parametrize("kind", sorted(PLANTS))
def test_a_bad_journal_is_quarantined_and_the_others_still_recovered(kind, tmp_path, recover):
    journal, made = tmp_path / "journal", tmp_path / "made-by-the-helper"
    made.write_text("x")
    dead_run(journal, made)
    plant, why = PLANTS[kind]
    bad = journal / "00-bad.jsonl"          # sorted first: it must not stop the good one
    plant(bad)
    res = (recover_apart if kind == "fifo" else recover)(journal)
    assert res.returncode == EXIT_QUARANTINED, res.stdout + res.stderr
    assert "ran the experiment's rollback 'clean-up'" in res.stdout and not made.exists()
    assert f"QUARANTINED journal {bad}" in res.stderr and why in res.stderr, res.stderr
    assert "1 bad journal(s) quarantined" in res.stdout
    assert not os.path.lexists(bad)
    assert os.path.lexists(journal / "quarantine" / "00-bad.jsonl")
    again = recover(journal)
    assert again.returncode == 0 and "nothing to recover" in again.stdout, again.stderr


def test_a_symlinked_journal_never_appends_to_its_target(tmp_path, recover):
    journal, target = tmp_path / "journal", tmp_path / "precious"
    journal.mkdir(mode=0o700)
    target.write_text(json.dumps({"event": "rollbacks-declared", "actions": [
        {"type": "action", "name": "a", "provider": {"type": "process", "path": "true"}}]})
        + "\n")
    before = target.read_bytes()
    (journal / "link.jsonl").symlink_to(target)
    res = recover(journal)
    assert res.returncode == EXIT_QUARANTINED, res.stdout + res.stderr
    assert "is a symbolic link" in res.stderr
    assert target.read_bytes() == before
    assert (journal / "quarantine" / "link.jsonl").is_symlink()


def test_a_new_journal_never_opens_an_existing_file(tmp_path):
    journal, target = tmp_path / "journal", tmp_path / "precious"
    journal.mkdir(mode=0o700)
    target.write_text("keep\n")
    (journal / "r1.jsonl").symlink_to(target)
    with pytest.raises(FileExistsError):
        journal_mod.Journal(str(journal), "r1", "t", "f")
    assert target.read_text() == "keep\n"


@pytest.mark.skipif(os.geteuid() != 0, reason="chaos run applies faults as root only")
def test_a_bad_journal_does_not_block_the_next_run(tmp_path):
    journal = tmp_path / "journal"
    journal.mkdir(mode=0o700)
    (journal / "bad.jsonl").write_text("[1, 2, 3]\n")
    path = tmp_path / "exp.yaml"
    path.write_text("title: t\ndescription: d\nmethod:\n"
                    "  - {type: probe, name: p, provider: {type: http, "
                    "url: 'http://127.0.0.1:9/'}}\n")
    res = subprocess.run(tracehound_cmd() + ["chaos", "run", str(path), "--no-plot",
                                             "--journal", str(journal), "--report",
                                             str(tmp_path / "r")],
                         capture_output=True, text=True, timeout=60)
    assert "QUARANTINED journal" in res.stderr and "bad.jsonl" in res.stderr, res.stderr
    assert "experiment 't': completed" in res.stdout, res.stdout + res.stderr
    assert res.returncode == 0


@pytest.mark.parametrize("mode", [0o777, 0o770, 0o702])
def test_a_journal_directory_others_can_write_is_refused(tmp_path, mode, recover):
    journal, made = tmp_path / "journal", tmp_path / "made"
    made.write_text("x")
    dead_run(journal, made)
    os.chmod(journal, mode)
    res = recover(journal)
    assert res.returncode == 1, res.stdout + res.stderr
    assert "refusing the journal" in res.stderr and "is writable by" in res.stderr
    assert made.exists()                   # nothing it says was run
