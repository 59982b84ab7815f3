"""Who could have written the experiment a root run obeys: a file (or a
directory above it) writable by group or others, or owned by another user,
is refused before anything runs; a symbolic link or a FIFO is refused by
validate and run alike, without hanging. Real files, modes and owners."""
import os
import subprocess
from types import SimpleNamespace

import pytest

from tests.conftest import tracehound_cmd
from tracehound import cli

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="a root run is what is checked")

EXPERIMENT = """\
title: touches a file
description: a process provider creates a file
method:
  - type: action
    name: touch-it
    provider: {{type: process, path: touch, arguments: ["{made}"]}}
"""
NOBODY = 65534


def th(*args: str) -> subprocess.CompletedProcess:
    """In a process of its own where it could hang (timeout: fails by name)."""
    return subprocess.run(tracehound_cmd() + ["chaos", *args], capture_output=True, text=True,
                          timeout=60)


def run_args(tmp_path, path) -> list[str]:
    return ["run", str(path), "--allow-code", "--no-plot", "--journal", str(tmp_path / "j"),
            "--report", str(tmp_path / "r")]


@pytest.fixture
def run(capsys):
    """`tracehound chaos run` in this process (quicker), as a CompletedProcess."""
    def go(tmp_path, path):
        code = cli.main(["chaos", *run_args(tmp_path, path)])
        out, err = capsys.readouterr()
        return SimpleNamespace(returncode=code, stdout=out, stderr=err)
    return go


def experiment_in(directory, made):
    directory.mkdir(exist_ok=True)
    path = directory / "exp.yaml"
    path.write_text(EXPERIMENT.format(made=made))
    os.chmod(path, 0o644)
    return path


@pytest.mark.parametrize("mode,who", [(0o666, "group and others"), (0o646, "others"),
                                      (0o664, "group")])
def test_a_file_others_can_write_is_refused(tmp_path, mode, who, run):
    made = tmp_path / "made"
    path = experiment_in(tmp_path / "d", made)
    os.chmod(path, mode)
    res = run(tmp_path, path)
    assert res.returncode == 1, res.stdout + res.stderr
    assert f"refusing {path}" in res.stderr and f"is writable by {who}" in res.stderr
    assert "chmod go-w" in res.stderr and "nothing was run" in res.stderr
    assert not made.exists() and not (tmp_path / "j").exists()


def test_a_file_owned_by_another_user_is_refused(tmp_path, run):
    made = tmp_path / "made"
    path = experiment_in(tmp_path / "d", made)
    os.chown(path, NOBODY, NOBODY)
    res = run(tmp_path, path)
    assert res.returncode == 1, res.stdout + res.stderr
    assert "belongs to" in res.stderr and f"uid {NOBODY}" in res.stderr
    assert not made.exists()


def test_a_directory_others_can_write_is_refused(tmp_path, run):
    made = tmp_path / "made"
    path = experiment_in(tmp_path / "open", made)
    os.chmod(tmp_path / "open", 0o777)
    res = run(tmp_path, path)
    assert res.returncode == 1, res.stdout + res.stderr
    assert f"the directory {tmp_path / 'open'} is writable by group and others" in res.stderr
    assert not made.exists()


def test_a_sticky_directory_like_tmp_is_fine(tmp_path, run):
    made = tmp_path / "made"
    path = experiment_in(tmp_path / "sticky", made)
    os.chmod(tmp_path / "sticky", 0o1777)
    res = run(tmp_path, path)
    assert res.returncode == 0, res.stdout + res.stderr
    assert made.exists()


def test_a_directory_owned_by_another_user_is_refused(tmp_path, run):
    made = tmp_path / "made"
    path = experiment_in(tmp_path / "theirs", made)
    os.chown(tmp_path / "theirs", NOBODY, NOBODY)
    res = run(tmp_path, path)
    assert res.returncode == 1, res.stdout + res.stderr
    assert f"the directory {tmp_path / 'theirs'} belongs to" in res.stderr
    assert not made.exists()


def test_a_symbolic_link_is_refused(tmp_path, run):
    made = tmp_path / "made"
    real = experiment_in(tmp_path / "d", made)
    link = tmp_path / "d" / "link.yaml"
    link.symlink_to(real)
    for res in (run(tmp_path, link), th("validate", str(link))):
        assert res.returncode == 2, res.stdout + res.stderr
        assert "is a symbolic link" in res.stderr and "give the file itself" in res.stderr
    assert not made.exists()


def test_a_fifo_is_refused_without_waiting_for_a_writer(tmp_path):
    fifo = tmp_path / "exp.yaml"
    os.mkfifo(fifo)
    for res in (th("validate", str(fifo)), th(*run_args(tmp_path, fifo))):
        assert res.returncode == 2, res.stdout + res.stderr
        assert "is not a regular file (a FIFO)" in res.stderr
