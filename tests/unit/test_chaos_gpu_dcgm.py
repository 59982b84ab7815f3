"""gpu.dcgm_inject against a stand-in `dcgmi`: a real executable on PATH
that records every call with its time, answers `discovery -l` as a running
or a missing host engine, and `dmon` with a field value."""
import json
import os
import uuid

import pytest

from tracehound.chaos import faults as catalog
from tracehound.chaos.faults import FaultError, gpu_dcgm
from tracehound.chaos.faults.proc import kill_marked, marked_pids

from .waiting import wait_until

DCGMI = r'''#!/bin/sh
here=$(dirname "$0")
echo "$(date +%s.%N) $*" >> "$here/calls"
case "$1 $2" in
  "discovery -l")
    if [ -e "$here/engine-down" ]; then
      echo "Error: unable to establish a connection to the specified host: localhost"
      exit 1
    fi
    echo "1 GPU found." ;;
  dmon*)
    printf '#Entity   XIDER\nID\nGPU 0     %s\n' "${FAKE_DCGM_VALUE:-0}" ;;
esac
'''


@pytest.fixture
def dcgmi(tmp_path, monkeypatch):
    script = tmp_path / "dcgmi"
    script.write_text(DCGMI)
    script.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    return tmp_path


def calls(d, what="test --inject"):
    path = d / "calls"
    lines = path.read_text().splitlines() if path.exists() else []
    return [(float(t), rest) for t, rest in (ln.split(" ", 1) for ln in lines) if what in rest]


@pytest.fixture
def marker():
    """A fault id no other run on this host carries (rollback kills by it);
    whatever still carries it when the test ends is ended."""
    fault_id = f"dcgm-test-{uuid.uuid4().hex[:12]}"
    yield fault_id
    kill_marked(fault_id, None)


def exited(pid: int) -> bool:
    """Whether this process's child `pid` has ended (collecting it if so)."""
    try:
        done, _ = os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        return True         # already collected
    return done == pid


def test_available_only_when_the_host_engine_answers(dcgmi):
    fault = catalog.get("gpu.dcgm_inject")
    assert fault.availability().ok
    (dcgmi / "engine-down").write_text("")
    avail = fault.availability()
    assert not avail.ok and "nv-hostengine running" in avail.reason
    assert "unable to establish a connection" in avail.reason
    with pytest.raises(FaultError, match="not available here: DCGM host engine not reachable"):
        fault.prepare(fault.with_defaults({"field": 230, "value": 79}), "t1")


def test_not_installed(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))
    assert catalog.get("gpu.dcgm_inject").availability().reason == \
        "dcgmi (DCGM) is not installed here"


def test_reinjects_until_rollback_stops_it_then_restores_the_prior(dcgmi, monkeypatch, marker):
    # (the schedule of the re-injections is test_reinject_loop_counts_into_its_result's)
    monkeypatch.setenv("FAKE_DCGM_VALUE", "3")
    fault = catalog.get("gpu.dcgm_inject")
    p = fault.prepare(fault.with_defaults({"field": 230, "value": 79, "interval": 0.05}),
                      marker)
    assert p.state["restore"] == "3"          # read from DCGM before the fault
    p.state.update(fault.apply(p.state))
    assert calls(dcgmi)[0][1] == "test --inject --gpuid 0 -f 230 -v 79"    # apply's own
    # then the child's, each counted into its result as it goes
    wait_until(lambda: fault.observe(p.state).get("reinjections", 0) >= 4,
               "four re-injections by the child")
    assert len(calls(dcgmi)) >= 5
    fault.rollback(p.state)
    after = calls(dcgmi)
    assert after[-1][1] == "test --inject --gpuid 0 -f 230 -v 3"
    assert all(c[1].endswith("-v 79") for c in after[:-1])
    # the child and anything it ran are gone: nothing is left to re-inject
    assert exited(p.state["pid"]) and marked_pids(marker) == []
    assert calls(dcgmi) == after
    assert not os.path.exists(p.state["result"])


def test_the_child_stops_by_itself_when_its_time_is_up(dcgmi, marker):
    fault = catalog.get("gpu.dcgm_inject")
    p = fault.prepare(fault.with_defaults({"field": 230, "value": 79, "restore": 0,
                                           "interval": 0.1, "seconds": 1}), marker)
    p.state.update(fault.apply(p.state))
    wait_until(lambda: exited(p.state["pid"]), "the child to end when its 1 s is up")
    assert marked_pids(marker) == []          # nothing it ran is left either
    done = fault.observe(p.state)["reinjections"]
    # slots at 0.1 s .. 0.9 s: never one at or past its time; apply's own came first
    assert 1 <= done <= 9
    assert len(calls(dcgmi)) == 1 + done
    fault.rollback(p.state)
    assert calls(dcgmi)[-1][1] == "test --inject --gpuid 0 -f 230 -v 0"


def test_no_prior_value_needs_restore(dcgmi, monkeypatch):
    monkeypatch.setenv("FAKE_DCGM_VALUE", "N/A")
    fault = catalog.get("gpu.dcgm_inject")
    with pytest.raises(FaultError, match="give restore"):
        fault.prepare(fault.with_defaults({"field": 230, "value": 79}), "t1")


def test_detection_asks_dcgm_exporter_and_says_tracehound_cannot_see_it():
    fault = catalog.get("gpu.dcgm_inject")
    d = fault.detection({"gpu": 1, "field": 230, "value": 79})
    assert d.query is None and d.promql == 'DCGM_FI_DEV_XID_ERRORS{gpu="1"}'
    assert d.predicate == "== 79"
    assert "tracehound (NVML) cannot see" in d.note
    d = fault.detection({"gpu": 0, "field": 9999, "value": 1})
    assert d.promql is None and "give metric" in d.note
    d = fault.detection({"gpu": 0, "field": 9999, "value": 1, "metric": "DCGM_FI_X"})
    assert d.promql == 'DCGM_FI_X{gpu="0"}'


def test_reinject_loop_counts_into_its_result(tmp_path, monkeypatch):
    now = [0.0]
    done = []
    monkeypatch.setattr(gpu_dcgm, "inject", lambda *a: done.append(a))
    result = str(tmp_path / "r.json")
    n = gpu_dcgm.reinject(0, 230, 79, 2.0, 7.0, result, clock=lambda: now[0],
                          sleep=lambda s: now.__setitem__(0, now[0] + s))
    assert n == 3 and done == [(0, 230, 79)] * 3      # at 2, 4 and 6 s; 7 s ends it
    # a slow injection skips the slots it overran instead of bursting after
    now[0] = 0.0
    done.clear()

    def slow(*a):
        done.append(now[0])
        now[0] += 4.5 if len(done) == 1 else 0.0
    monkeypatch.setattr(gpu_dcgm, "inject", slow)
    gpu_dcgm.reinject(0, 230, 79, 2.0, 11.0, result, clock=lambda: now[0],
                      sleep=lambda s: now.__setitem__(0, now[0] + s))
    assert done == [2.0, 8.0, 10.0]
    assert json.load(open(result)) == {"reinjections": 3}
