"""`tracehound health`'s decisions against a fake slurmctld that keeps node
states, comments and reservations as the real one does (the real one is the
cluster tier's), with the agent's answer given; and the parts that touch the
node for real: the local channel, the state file and the textfile."""
import json
import os
import subprocess
import sys

import pytest

from tracehound.health import check as hc
from tracehound.health.breaker import Breaker, parse_comment
from tracehound.health.rules import Rules
from tracehound.health.slurm import (LOCK_NAME, DrainLock, drain_reason, find_scontrol,
                                     parse_nodes, SlurmError)

LINE = ("NodeName={name} Arch=x86_64 CoresPerSocket=1  CPUAlloc=0 NodeAddr=10.0.0.1 "
        "State={state} ThreadsPerCore=1 Partitions={parts}  BootTime=2026-11-26T20:42:39 "
        "{reason}Comment={comment} LastBusyTime=2026-11-26T21:23:40 CfgTRES=cpu=2 AllocTRES= "
        "CapWatts=n/a")
GPU = 'gpu="0",uuid="",model="",pci_bus_id="0000:e7:00.0"'
FATAL = (f'tracehound_gpu_health{{{GPU},condition="recent_fatal_xid"}} 1\n'
         f'tracehound_gpu_recent_fatal_xid_age_seconds{{{GPU},xid="48"}} 3.5\n')


def line(name, state="IDLE", parts="batch", reason="", comment="(null)"):
    return LINE.format(name=name, state=state, parts=parts, comment=comment,
                       reason=f"Reason={reason} " if reason else "")


def test_parse_nodes_keeps_reasons_and_comments_whole():
    nodes = parse_nodes("\n".join([
        line("n1", "IDLE+DRAIN", reason="tracehound: XID 48 double-bit ECC error (0000:e7:00.0) "
                                        "[root@2026-11-26T21:30:01]",
             comment="tracehound: unfit=recent_fatal_xid@1764000000 seen=1764000000"),
        line("n2", "DOWN*+DRAIN", "batch,gpu", reason="disk swap, ticket=42 [alice@2026-11-26T20:00:00]",
             comment="rack 7, see ticket 42"),
        line("n3", "MIXED")]))
    assert nodes["n1"].reason == "tracehound: XID 48 double-bit ECC error (0000:e7:00.0)"
    assert nodes["n1"].reason_time == "root@2026-11-26T21:30:01"
    assert nodes["n1"].ours and nodes["n1"].partitions == ["batch"]
    assert parse_comment(nodes["n1"].comment).unfit == {"recent_fatal_xid": 1764000000.0}
    assert nodes["n2"].reason == "disk swap, ticket=42" and not nodes["n2"].ours
    assert nodes["n2"].comment == "rack 7, see ticket 42"
    assert not parse_comment(nodes["n2"].comment).ours
    assert nodes["n2"].state == "DOWN" and nodes["n2"].partitions == ["batch", "gpu"]
    assert not nodes["n3"].drained and nodes["n3"].reason == "" and nodes["n3"].comment == ""


def test_drain_reason_is_one_printable_bounded_line():
    assert drain_reason(["a", "b", "a"]) == "tracehound: a; b"
    reason = drain_reason(['x"\n' * 200])
    assert len(reason) == 200 and reason.endswith("...") and "\n" not in reason


def test_scontrol_is_found_without_path(monkeypatch):
    monkeypatch.delenv("PATH", raising=False)
    assert find_scontrol("/opt/x/scontrol") == "/opt/x/scontrol"
    assert find_scontrol() == "/usr/bin/scontrol"       # Debian's, installed by --dev


class FakeSlurm:
    """slurmctld's state as health reads and changes it."""

    def __init__(self, count=10, parts="batch"):
        self.state = {f"n{i}": {"state": "IDLE", "reason": "", "comment": "(null)",
                                "parts": parts} for i in range(1, count + 1)}
        self.reservations, self.calls, self.dry_run = {}, [], False

    def nodes(self):
        return parse_nodes("\n".join(line(n, s["state"], s["parts"], s["reason"], s["comment"])
                                     for n, s in self.state.items()))

    def drained(self, node, reason, when="2026-11-26T21:00:00"):
        self.state[node].update(state="IDLE+DRAIN", reason=f"{reason} [root@{when}]")

    def drain(self, node, reason):
        self.calls.append(("drain", node))
        self.drained(node, reason)

    def resume(self, node):
        self.calls.append(("resume", node))
        self.state[node].update(state="IDLE", reason="")

    def set_comment(self, node, text):
        self.calls.append(("comment", node))
        self.state[node]["comment"] = text or "(null)"

    def try_reserve(self, name, node, minutes):
        self.calls.append(("reserve", node))
        if name in self.reservations:       # slurmctld: Duplicate reservation name
            return False
        self.reservations[name] = node
        return True

    def reservation_nodes(self, name):
        return self.reservations.get(name)

    def unreserve(self, name):
        self.calls.append(("unreserve", self.reservations.pop(name)))


def run(slurm, text, node="n1", breaker=Breaker(), state_file=None, down_after=2):
    opts = hc.Options(node, "/run/none.sock", 0.5, Rules(), breaker, slurm, state_file,
                      down_after, lock_wait_s=0.2)
    original = hc.ask_agent

    def answer(*_):
        if text is None:
            raise hc.LocalAgentError("no agent socket at /run/none.sock (agent not running)")
        return text
    hc.ask_agent = answer
    try:
        return hc.check(opts)
    finally:
        hc.ask_agent = original


def acts(slurm):
    return [c for c in slurm.calls if c[0] in ("drain", "resume")]


def test_unfit_node_is_drained_under_the_lock_with_the_reason():
    slurm = FakeSlurm()
    v = run(slurm, FATAL)
    assert slurm.state["n1"]["reason"].startswith(
        "tracehound: XID 48 double-bit ECC error (0000:e7:00.0) [root@")
    assert v.code == hc.UNFIT and v.line().endswith("; drained")
    kinds = [c[0] for c in slurm.calls]
    # declared, then the lock, the drain, the drain's time, the lock given back
    assert kinds == ["comment", "reserve", "drain", "comment", "unreserve"]
    assert slurm.reservations == {}
    d = parse_comment(slurm.state["n1"]["comment"])
    assert set(d.unfit) == {"recent_fatal_xid"} and d.drained > 0


def test_fit_node_drained_by_tracehound_is_resumed_an_admins_is_not():
    slurm = FakeSlurm()
    slurm.drained("n1", "tracehound: x")
    assert run(slurm, "").action == "resume" and acts(slurm) == [("resume", "n1")]
    admin = FakeSlurm()
    admin.drained("n1", "bad DIMM")
    admin.state["n1"]["comment"] = "DIMM B2 ordered"
    for text in ("", FATAL):
        v = run(admin, text)
        assert acts(admin) == [] and v.drained_by_other == "bad DIMM"
    assert admin.state["n1"]["comment"] == "DIMM B2 ordered"     # never ours to write


def test_agent_down_only_after_runs_in_a_row_with_its_cause(tmp_path):
    slurm, state = FakeSlurm(), str(tmp_path / "h.json")
    slurm.drained("n1", "tracehound: XID 48 double-bit ECC error")
    v = run(slurm, None, state_file=state)
    # the first failure decides nothing: neither the drain nor a resume
    assert v.code == hc.FIT and v.findings == [] and acts(slurm) == []
    assert "run 1 of 2 before agent_down" in v.line()
    assert "agent_down" in parse_comment(slurm.state["n1"]["comment"]).unfit
    slurm.resume("n1")
    slurm.calls.clear()
    v = run(slurm, None, state_file=state)
    assert v.findings[0].condition == "agent_down" and acts(slurm) == [("drain", "n1")]
    assert slurm.state["n1"]["reason"].startswith(
        "tracehound: agent not answering: no agent socket at /run/none.sock (agent not running)")
    # an answer resets the count
    run(slurm, "", state_file=state)
    assert json.loads(open(state).read())["agent_failures"] == 0


def test_breaker_refuses_past_its_share_its_cap_and_its_rate():
    # 10 % of 10 nodes: one; n2 is already drained by tracehound
    slurm = FakeSlurm()
    slurm.drained("n2", "tracehound: x")
    v = run(slurm, FATAL)
    assert acts(slurm) == [] and v.code == hc.REFUSED and slurm.reservations == {}
    assert "partition batch has 1 of 10 nodes drained by tracehound (n2), limit 1" in v.refusal
    assert run(slurm, FATAL, breaker=Breaker(percent=20)).action == "drain"
    # a cap across partitions: n2 in another partition still counts
    slurm = FakeSlurm()
    slurm.state["n2"]["parts"] = "other"
    slurm.drained("n2", "tracehound: x")
    v = run(slurm, FATAL, breaker=Breaker(percent=50, cap=1))
    assert acts(slurm) == [] and "cap 1" in v.refusal
    # a rate: n3 was drained and resumed a minute ago; its comment remembers
    slurm = FakeSlurm()
    slurm.state["n3"]["comment"] = f"tracehound: drained={int(__import__('time').time()) - 60}"
    v = run(slurm, FATAL, breaker=Breaker(percent=50, rate=1, rate_window_s=600))
    assert acts(slurm) == [] and "rate limit 1" in v.refusal
    assert run(slurm, FATAL, breaker=Breaker(percent=50, rate=1, rate_window_s=30)).action \
        == "drain"


def test_common_mode_drains_none_for_a_reason_the_crowd_shares():
    import time
    now = int(time.time())
    slurm = FakeSlurm()
    for n in ("n2", "n3"):
        slurm.state[n]["comment"] = f"tracehound: unfit=agent_down@{now - 20} seen={now - 5}"
    slurm.drained("n4", "tracehound: agent not answering")     # before the crowd formed
    v = run(slurm, None, down_after=1)
    assert acts(slurm) == [] and v.code == hc.REFUSED
    assert v.common_mode.keys() == {"agent_down"}
    assert "common mode: 3 of 10 nodes of partition batch began to fail for agent_down" \
        in v.refusal
    assert slurm.state["n4"]["state"] == "IDLE+DRAIN"           # no flapping: it stays
    # old declarations (a long-drained node) and stale ones are no crowd
    slurm = FakeSlurm()
    slurm.state["n2"]["comment"] = f"tracehound: unfit=agent_down@{now - 4000} seen={now}"
    slurm.state["n3"]["comment"] = f"tracehound: unfit=agent_down@{now - 20} seen={now - 4000}"
    assert run(slurm, None, breaker=Breaker(percent=20), down_after=1).action == "drain"


def test_a_held_lock_is_waited_for_then_refused():
    slurm = FakeSlurm()
    slurm.reservations[LOCK_NAME] = "n7"
    v = run(slurm, FATAL)
    assert acts(slurm) == [] and v.code == hc.REFUSED
    assert v.refusal == "breaker busy: n7 held the drain lock for 0.2 s; not drained this run"
    assert slurm.reservations == {LOCK_NAME: "n7"}      # another's lock is never ended


def test_a_lease_used_up_gives_the_lock_back_without_draining():
    # taken at 0, looked at 30 s on: past its use, and ended as still its own
    slurm, ticks = FakeSlurm(), iter([0.0, 0.0, 30.0, 30.0])
    lock = DrainLock(slurm, "n1", clock=lambda: next(ticks))
    with lock:
        assert not lock.fresh()
    assert slurm.reservations == {} and slurm.calls[-1] == ("unreserve", "n1")


def test_breaker_limit():
    assert [Breaker().limit(n) for n in (1, 3, 10, 25, 100)] == [1, 1, 1, 2, 10]
    assert Breaker(percent=50, minimum=2).limit(3) == 2


def test_comments_not_of_our_grammar_say_nothing():
    for text in ("tracehound: unfit=Gpu_Lost@1 seen=x", "tracehound: unfit=a@" + "9" * 40,
                 "tracehound:unfit", "tracehound: drained=-5"):
        d = parse_comment(text)
        assert d.ours and d.unfit == {} and d.drained == 0.0
    assert not parse_comment("Tracehound: unfit=gpu_lost@1").ours


def test_scontrol_failure_is_an_error():
    from tracehound.health.slurm import Slurm
    with pytest.raises(SlurmError, match="scontrol show"):
        Slurm("/bin/false").nodes()


def test_dry_run_asks_slurm_but_changes_nothing(tmp_path):
    from tracehound.health.slurm import Slurm
    log = tmp_path / "calls"
    scontrol = tmp_path / "scontrol"
    scontrol.write_text(f"#!/bin/sh\necho \"$*\" >> {log}\n"
                        f"[ \"$1\" = show ] && echo '{line('n1')}'\nexit 0\n")
    scontrol.chmod(0o755)
    slurm = Slurm(str(scontrol), dry_run=True)
    v = run(slurm, FATAL)
    assert v.action == "drain" and v.reason.startswith("tracehound: XID 48")
    assert log.read_text().splitlines() == ["show node -o", "show node -o"]


def health_cli(tmp_path, *argv):
    code = ("import sys; from tracehound.cli import main; "
            f"rc = main(['health', '--check-only', *{list(argv)!r}]); "
            "print(rc, 'tracehound.subsystems' in sys.modules, 'tracehound.commands.run' in sys.modules)")
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60)


def test_health_starts_without_the_agents_subsystems(tmp_path):
    """slurmd runs it on every node every interval: `tracehound health`
    builds only its own parser, never importing what `run` needs."""
    args = ("--socket", str(tmp_path / "none.sock"), "--state-file", str(tmp_path / "s.json"),
            "--timeout", "0.3")
    out = health_cli(tmp_path, *args)
    assert out.stdout.splitlines()[-1] == "0 False False", out.stdout + out.stderr
    assert f"no agent socket at {tmp_path}/none.sock (agent not running)" in out.stdout
    assert "run 1 of 2 before agent_down" in out.stdout
    out = health_cli(tmp_path, *args)
    assert out.stdout.splitlines()[-1] == "1 False False", out.stdout + out.stderr
    # every command imports its own module only
    code = ("import sys; from tracehound.cli import main\n"
            "try: main(['run', '--help'])\n"
            "except SystemExit: pass\n"
            "print(sorted(m for m in ('tracehound.chaos', 'tracehound.top', 'tracehound.commands.doctor')"
            " if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.stdout.splitlines()[-1] == "[]", out.stdout + out.stderr


@pytest.mark.parametrize("argv", [["--conditions", "gpu_lost,no_such"], ["--breaker-percent", "0"],
                                  ["--breaker-min", "-1"], ["--timeout", "x"],
                                  ["--rdma-flaps", "1.5"], ["--instance", "../x"],
                                  ["--breaker-cap", "-2"]])
def test_bad_flags_are_usage_errors(argv, capsys):
    from tracehound.cli import main
    with pytest.raises(SystemExit) as exit_:
        main(["health", *argv])
    assert exit_.value.code == 2
    assert "tracehound health: error: argument" in capsys.readouterr().err


def test_state_and_textfile_are_never_written_through_a_link_nor_read_from_a_fifo(tmp_path):
    from tracehound.health.files import FileRefused, read_own, write_whole
    victim = tmp_path / "victim"
    victim.write_text("root's own\n")
    os.symlink(victim, tmp_path / "health.prom")
    write_whole(str(tmp_path / "health.prom"), b"tracehound_health_unfit 0\n")
    assert victim.read_text() == "root's own\n"
    assert (tmp_path / "health.prom").read_text() == "tracehound_health_unfit 0\n"
    assert not (tmp_path / "health.prom").is_symlink()
    os.mkfifo(tmp_path / "fifo")
    with pytest.raises(FileRefused, match="not a regular file"):
        read_own(str(tmp_path / "fifo"), 100)
    (tmp_path / "big").write_bytes(b"[" * 5000)
    with pytest.raises(FileRefused, match="more than 4096"):
        read_own(str(tmp_path / "big"), 4096)
    os.symlink(victim, tmp_path / "link")
    with pytest.raises(FileRefused):
        read_own(str(tmp_path / "link"), 100)
    # a state health cannot use starts afresh, and the run goes on
    assert hc.load_memory(str(tmp_path / "fifo")).agent_failures == 0


def test_an_unexpected_failure_is_one_line_and_could_not_decide(monkeypatch, capsys, tmp_path):
    # e.g. no thread to be had: never a traceback, never the 1 NHC reads as unfit
    from tracehound.cli import main
    from tracehound.commands import health as command

    def fails(_opts):
        raise RuntimeError("can't start new thread")
    monkeypatch.setattr(command, "check", fails)
    assert main(["health", "--check-only", "--state-file", str(tmp_path / "s.json")]) == 2
    err = capsys.readouterr().err
    assert err.endswith("cannot decide: RuntimeError: can't start new thread\n")
    assert "Traceback" not in err and err.count("\n") == 1
