"""Activities that run code of the file's choosing (Chaos Toolkit's python
and process providers, gpu.nccl's job): `chaos validate` lists each one,
and `chaos run` runs none of them, nor imports a module they name, without
--allow-code. The experiments really run `touch` as the user running the
tests (root in CI), through the real CLI."""
import os
import shutil
import subprocess
from types import SimpleNamespace

import pytest

from tests.conftest import tracehound_cmd
from tracehound import cli

TOUCH, TRUE = shutil.which("touch"), shutil.which("true")    # listings show what runs

EXPERIMENT = """\
title: touches a file
description: a process provider creates a file, a python one another
method:
  - type: action
    name: touch-it
    provider: {{type: process, path: touch, arguments: ["{made}"]}}
  - type: action
    name: touch-too
    provider: {{type: python, module: pathlib, func: Path, arguments: {{}}}}
rollbacks:
  - type: action
    name: say-done
    provider: {{type: process, path: "true"}}
"""


def write(tmp_path, text: str):
    path = tmp_path / "exp.yaml"
    path.write_text(text)
    return path


@pytest.fixture
def th(capsys):
    """`tracehound chaos ARGS` in this process (quicker), as a CompletedProcess."""
    def go(*args: str):
        code = cli.main(["chaos", *args])
        out, err = capsys.readouterr()
        return SimpleNamespace(returncode=code, stdout=out, stderr=err)
    return go


def test_run_without_consent_refuses_before_anything_runs(tmp_path):
    """The installed command, as an operator runs it (root in CI)."""
    made = tmp_path / "made"
    path = write(tmp_path, EXPERIMENT.format(made=made))
    res = subprocess.run(tracehound_cmd() + ["chaos", "run", str(path), "--journal",
                                             str(tmp_path / "j"), "--report",
                                             str(tmp_path / "r")],
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 1, res.stdout + res.stderr
    assert "refusing" in res.stderr and "without --allow-code" in res.stderr
    for named in (f"method[0].provider 'touch-it': process {TOUCH} {made}",
                  "method[1].provider 'touch-too': python pathlib.Path()",
                  f"rollbacks[0].provider 'say-done': process {TRUE}"):
        assert named in res.stderr, res.stderr
    assert "nothing was run" in res.stderr
    assert not made.exists()
    assert not (tmp_path / "j").exists() and not (tmp_path / "r").exists()


def test_run_with_consent_runs_the_code(tmp_path, th):
    made = tmp_path / "made"
    path = write(tmp_path, EXPERIMENT.format(made=made))
    res = th("run", str(path), "--allow-code", "--journal", str(tmp_path / "j"),
             "--report", str(tmp_path / "r"), "--no-plot")
    assert res.returncode == 0, res.stdout + res.stderr
    assert made.exists()


def test_validate_lists_every_activity_that_runs_code(tmp_path, th):
    made = tmp_path / "made"
    path = write(tmp_path, EXPERIMENT.format(made=made))
    res = th("validate", str(path))
    assert res.returncode == 0, res.stderr
    assert "faults: none" in res.stdout
    assert "RUNS CODE: 3 activities" in res.stdout and "--allow-code" in res.stdout
    assert f"'touch-it': process {TOUCH} {made}" in res.stdout
    assert "'touch-too': python pathlib.Path()" in res.stdout
    assert not made.exists()


def test_a_dry_run_needs_no_consent_and_shows_the_code(tmp_path, th):
    made = tmp_path / "made"
    path = write(tmp_path, EXPERIMENT.format(made=made))
    res = th("run", str(path), "--dry-run")
    assert res.returncode == 0, res.stderr
    assert "runs code: 3 activities" in res.stdout and "needs --allow-code" in res.stdout
    assert f"process {TOUCH} {made}" in res.stdout
    assert not made.exists()


def test_code_in_a_tolerance_a_process_probe_and_a_launched_job_is_listed_too(tmp_path, capsys):
    made = tmp_path / "made"
    path = write(tmp_path, f"""\
title: hidden code
description: a probe tolerance and a detection run a program; gpu.nccl launches a job
steady-state-hypothesis:
  title: t
  probes:
    - type: probe
      name: looks-harmless
      provider: {{type: http, url: "http://127.0.0.1:9/"}}
      tolerance: {{type: probe, provider: {{type: process, path: touch, arguments: ["{made}"]}}}}
method:
  - type: action
    name: job
    provider: {{type: tracehound, fault: gpu.nccl, arguments: {{command: [touch, "{made}"],
               mode: ib_disable}}}}
  - type: probe
    name: see-it
    provider: {{type: tracehound, detect: {{source: process, command: [touch, "{made}"],
               predicate: "> 0"}}}}
""")
    assert cli.main(["chaos", "validate", str(path)]) == 0
    out = capsys.readouterr().out
    assert "RUNS CODE: 3 activities" in out
    assert f"method[1].provider 'see-it': detect (process source) touch {made}" in out
    assert f"tolerance.provider 'looks-harmless': process {TOUCH}" in out
    assert "method[0].provider 'job': gpu.nccl touch" in out


def test_a_fault_in_a_probe_tolerance_is_refused(tmp_path, capsys):
    path = write(tmp_path, """\
title: a fault hidden in a tolerance
description: it would escape the method's checks (no --yes, no journal of its args)
steady-state-hypothesis:
  title: t
  probes:
    - type: probe
      name: p
      provider: {type: process, path: "true"}
      tolerance: {type: probe, provider: {type: tracehound, fault: proc.kill,
                                          arguments: {pid: 2}}}
method:
  - {type: action, name: a, provider: {type: process, path: "true"}}
""")
    assert cli.main(["chaos", "validate", str(path)]) == 2
    assert "tolerance.provider: a probe tolerance needs a provider mapping of type python" \
        in capsys.readouterr().err


def test_a_module_is_not_imported_before_consent(tmp_path, monkeypatch):
    """Importing a module runs it: validation merely locates it until --allow-code."""
    made = tmp_path / "imported"
    (tmp_path / "mods").mkdir()
    (tmp_path / "mods" / "th_side_effect.py").write_text(
        f"open({str(made)!r}, 'w').close()\ndef f():\n    return 1\n")
    path = write(tmp_path, """\
title: a module with a side effect
description: importing it creates a file
method:
  - {type: action, name: call-it, provider: {type: python, module: th_side_effect, func: f}}
""")
    env = {**os.environ, "PYTHONPATH": str(tmp_path / "mods")}
    base = tracehound_cmd() + ["chaos"]
    res = subprocess.run(base + ["validate", str(path)], capture_output=True, text=True,
                         env=env, timeout=60)
    assert res.returncode == 0, res.stderr
    assert "not imported before consent" in res.stdout
    res = subprocess.run(base + ["run", str(path), "--journal", str(tmp_path / "j"),
                                 "--report", str(tmp_path / "r")],
                         capture_output=True, text=True, env=env, timeout=60)
    assert res.returncode == 1 and "without --allow-code" in res.stderr, res.stderr
    assert not made.exists()
    res = subprocess.run(base + ["run", str(path), "--allow-code", "--no-plot", "--journal",
                                 str(tmp_path / "j"), "--report", str(tmp_path / "r")],
                         capture_output=True, text=True, env=env, timeout=60)
    assert res.returncode == 0, res.stderr
    assert made.exists()


def test_a_main_module_is_not_imported_before_consent(tmp_path, th):
    """tracehound.__main__ runs the CLI when imported: located only."""
    path = write(tmp_path, """\
title: imports a program
description: importing tracehound.__main__ would run tracehound itself
method:
  - {type: action, name: m, provider: {type: python, module: tracehound.__main__, func: main}}
""")
    res = th("validate", str(path))
    assert res.returncode == 0, res.stderr
    assert "tracehound.__main__ is not imported before consent" in res.stdout
