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


def _names(exp) -> list[str]:
    """Every cgroup, namespace and interface name the experiment's actions use."""
    keys = ("cgroup", "netns", "peer_netns", "netns_a", "netns_b", "if_a", "if_b", "interface")
    args = [act["provider"].get("arguments") for act in exp.method + exp.rollbacks]
    return [(key, value) for a in args if isinstance(a, dict)
            for key, value in a.items() if key in keys]


@pytest.mark.parametrize("name", ["io-throttle.yaml", "net-loss.yaml", "rdma-link-down.yaml"])
def test_two_runs_of_an_example_name_their_cgroups_and_namespaces_apart(name, monkeypatch):
    from tracehound.chaos.document import load
    from tracehound.chaos.schema import validate
    for key in [k for k in os.environ if k.startswith("CHAOS_")]:
        monkeypatch.delenv(key)
    doc = load(str(EXAMPLES / name))
    runs = [validate(doc, run_id=run_id)[1] for run_id in
            ("20261128T120000-0a1b2c3d", "20261128T120000-4e5f6a7b")]
    first, second = (_names(exp) for exp in runs)
    assert first and all(n.endswith("0a1b2c") for _, n in first), first
    assert not {n for _, n in first} & {n for _, n in second}
    # a network interface's name is 15 bytes at most
    assert all(len(n) <= 15 for key, n in first if key in ("if_a", "if_b", "interface"))
    assert runs[0].run_id == "20261128T120000-0a1b2c3d"


def test_run_is_the_runners_not_the_files(tmp_path, capsys):
    exp = tmp_path / "exp.yaml"
    exp.write_text("title: t\ndescription: d\nconfiguration: {run: x}\n"
                   "method:\n  - {type: action, name: a, provider: {type: process, path: 'true'}}\n")
    assert cli.main(["chaos", "validate", str(exp)]) == 2
    assert "'run' is the runner's" in capsys.readouterr().err
