"""gpu.xid: the line it writes is the driver's form (the agent's own parser
reads back what was asked for), its arguments are checked, and it names
the counter that detects it."""
import pytest

from tracehound.chaos import faults as catalog
from tracehound.chaos.faults import check_args, gpu_xid
from tracehound.gpu.kmsg import parse_gpu_line, parse_record

FAULT = catalog.get("gpu.xid")


@pytest.mark.parametrize("pci,want", [("0000:ff:00.0", "0000:ff:00.0"),
                                      ("00000000:3B:00.0", "0000:3b:00.0"),
                                      ("3b:00.1", "0000:3b:00.1")])
def test_the_line_parses_back_to_what_was_asked(pci, want):
    state = FAULT.prepare(FAULT.with_defaults({"xid": 79, "pci_bus_id": pci, "pid": 4242,
                                               "process": "python"}), "f1").state
    assert state["line"].startswith("<4>NVRM: Xid (PCI:")
    e = parse_gpu_line(state["line"][3:])
    assert (e.kind, e.number, e.pci, e.pid, e.process) == ("xid", 79, want, 4242, "python")
    assert e.detail == "synthetic XID written by tracehound chaos"
    assert state["pci"] == want


def test_without_pid_and_name_the_line_says_unknown_like_the_driver():
    line = gpu_xid.xid_line(13, "0000:ff:00.0", None, None, "x", level=3)
    assert line == "<3>NVRM: Xid (PCI:0000:ff:00): 13, pid='<unknown>', name=<unknown>, x"
    e = parse_gpu_line(line[3:])
    assert (e.pid, e.process, e.number) == (None, None, 13)


@pytest.mark.parametrize("args,problem", [
    ({}, "needs argument 'xid'"),
    ({"xid": 0}, "at least 1"),
    ({"xid": 48, "pci_bus_id": "gpu0"}, "not a PCI bus id"),
    ({"xid": 48, "process": "a,b"}, "comma or a line break"),
    ({"xid": 48, "message": "one\ntwo"}, "comma or a line break")])
def test_bad_arguments_are_refused(args, problem):
    problems = check_args(FAULT, args)
    assert any(problem in p for _, p in problems), problems


def test_apply_writes_one_record_and_rollback_only_says_so(tmp_path, monkeypatch):
    target = tmp_path / "kmsg"
    target.write_bytes(b"")
    monkeypatch.setattr(gpu_xid, "DEFAULT_PATH", str(target))
    state = FAULT.prepare(FAULT.with_defaults({"xid": 48}), "f2").state
    assert FAULT.apply(state) is None
    written = target.read_bytes()
    assert written.count(b"\n") == 1
    rec = parse_record(b"4,1,1,-;" + written[3:])
    assert parse_gpu_line(rec.message).number == 48
    assert "recent_fatal_xid" in FAULT.rollback(state)          # 48 is fatal
    assert "recent_fatal_xid" not in FAULT.rollback({**state, "xid": 13})


def test_detection_names_the_xid_counter_of_that_bus_id():
    d = FAULT.detection({"xid": 79, "pci_bus_id": "00000000:FF:00.0"})
    assert d.query == 'tracehound_gpu_xid_errors_total{pci_bus_id="0000:ff:00.0",xid="79"}'
    assert (d.signal, d.predicate) == ("increase", "> 0") and "increase(" in d.promql
