"""The shipped example experiments: every one validates as shipped (with
its configuration defaults), and one whose fault this host cannot inject
is refused before anything is journaled or applied."""
import os
from pathlib import Path

import pytest

from tracehound import cli
from tracehound.chaos import faults as catalog
from tracehound.chaos.faults import Availability

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
NAMES = sorted(p.name for p in EXAMPLES.glob("*.yaml"))
FLEET = sorted(f"fleet/{p.name}" for p in EXAMPLES.glob("fleet/*.yaml"))


def test_there_is_an_example_per_runnable_fault_family():
    faults = {name.split("-")[0] for name in NAMES}
    assert {"io", "net", "proc", "rdma"} <= faults, NAMES


@pytest.mark.parametrize("name", NAMES + FLEET)
def test_example_validates(name, capsys, monkeypatch):
    for key in [k for k in os.environ if k.startswith(("CHAOS_", "TRACEHOUND_"))]:
        monkeypatch.delenv(key)
    assert cli.main(["chaos", "validate", str(EXAMPLES / name)]) == 0, capsys.readouterr().err
    assert "valid experiment" in capsys.readouterr().out


def test_an_unavailable_fault_refuses_the_whole_run(tmp_path, capsys, monkeypatch,
                                                    no_faults_touched):
    monkeypatch.setattr(catalog.get("net.delay"), "availability",
                        lambda: Availability(False, "needs sch_netem"))
    journal, report = tmp_path / "journal", tmp_path / "report"
    code = cli.main(["chaos", "run", str(EXAMPLES / "net-delay.yaml"), "--yes",
                     "--journal", str(journal), "--report", str(report)])
    err = capsys.readouterr().err
    assert code == 1, err
    assert "delay-packets: net.delay is not available here: needs sch_netem" in err
    assert "nothing was run" in err
    assert not journal.exists() and not report.exists()
    assert no_faults_touched == []
