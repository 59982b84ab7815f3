"""`tracehound health`'s decisions against a Slurm that records what was
asked of it, a real agent-like HTTP server on loopback, and the breaker."""
import http.server
import socket
import threading
import time

import pytest

from tracehound.health import check as hc
from tracehound.health.rules import Rules
from tracehound.health.slurm import (Breaker, drain_reason, find_scontrol,
                                     parse_nodes, SlurmError)

LINE = ("NodeName={name} Arch=x86_64 CoresPerSocket=1  CPUAlloc=0 NodeAddr=10.0.0.1 "
        "State={state} ThreadsPerCore=1 Partitions={parts}  BootTime=2026-11-26T20:42:39 "
        "{reason}LastBusyTime=2026-11-26T21:23:40 CfgTRES=cpu=2 AllocTRES= CapWatts=n/a")
FATAL = ('tracehound_gpu_health{gpu="0",uuid="",model="",pci_bus_id="0000:e7:00.0",'
         'condition="recent_fatal_xid"} 1\n'
         'tracehound_gpu_xid_errors_total{gpu="0",uuid="",model="",pci_bus_id="0000:e7:00.0",'
         'xid="48"} 1\n')


def line(name, state="IDLE", parts="batch", reason=""):
    return LINE.format(name=name, state=state, parts=parts,
                       reason=f"Reason={reason} " if reason else "")


def test_parse_nodes_keeps_reasons_whole():
    nodes = parse_nodes("\n".join([
        line("n1", "IDLE+DRAIN", reason="tracehound: XID 48 double-bit ECC error (0000:e7:00.0) "
                                        "[root@2026-11-26T21:30:01]"),
        line("n2", "DOWN*+DRAIN", "batch,gpu", reason="disk swap, ticket=42 [alice@2026-11-26T20:00:00]"),
        line("n3", "MIXED")]))
    assert nodes["n1"].reason == "tracehound: XID 48 double-bit ECC error (0000:e7:00.0)"
    assert nodes["n1"].reason_time == "root@2026-11-26T21:30:01"
    assert nodes["n1"].ours and nodes["n1"].partitions == ["batch"]
    assert nodes["n2"].reason == "disk swap, ticket=42" and not nodes["n2"].ours
    assert nodes["n2"].state == "DOWN" and nodes["n2"].partitions == ["batch", "gpu"]
    assert not nodes["n3"].drained and nodes["n3"].reason == ""


def test_drain_reason_is_one_printable_bounded_line():
    assert drain_reason(["a", "b", "a"]) == "tracehound: a; b"
    reason = drain_reason(['x"\n' * 200])
    assert len(reason) == 200 and reason.endswith("...") and "\n" not in reason


def test_scontrol_is_found_without_path(monkeypatch):
    monkeypatch.delenv("PATH", raising=False)
    assert find_scontrol("/opt/x/scontrol") == "/opt/x/scontrol"
    assert find_scontrol() == "/usr/bin/scontrol"       # Debian's, installed by --dev


class FakeSlurm:
    def __init__(self, lines, after_drain=None):
        self.lines, self.after_drain, self.calls, self.dry_run = lines, after_drain, [], False

    def nodes(self):
        return parse_nodes("\n".join(self.lines))

    def drain(self, node, reason):
        self.calls.append(("drain", node, reason))
        if self.after_drain is not None:
            self.lines = self.after_drain

    def resume(self, node):
        self.calls.append(("resume", node))


def run(slurm, text, node="n1", breaker=Breaker()):
    opts = hc.Options(node, "http://agent", 0.5, Rules(), breaker, slurm, None)
    original = hc.scrape
    hc.scrape = lambda *_: text
    try:
        return hc.check(opts)
    finally:
        hc.scrape = original


def ten_nodes(drained_by_us=(), me_reason=""):
    out = []
    for i in range(1, 11):
        name = f"n{i}"
        if name in drained_by_us:
            out.append(line(name, "IDLE+DRAIN", reason=f"tracehound: x [root@2026-11-26T21:0{i % 10}:00]"))
        elif name == "n1" and me_reason:
            out.append(line(name, "IDLE+DRAIN", reason=me_reason))
        else:
            out.append(line(name))
    return out


def test_unfit_node_is_drained_with_the_reason():
    slurm = FakeSlurm(ten_nodes())
    v = run(slurm, FATAL)
    assert slurm.calls == [("drain", "n1", "tracehound: XID 48 double-bit ECC error (0000:e7:00.0)")]
    assert v.code == hc.UNFIT and v.line().endswith("; drained")


def test_fit_node_drained_by_tracehound_is_resumed_an_admins_is_not():
    slurm = FakeSlurm(ten_nodes(drained_by_us=("n1",)))
    assert run(slurm, "").action == "resume" and slurm.calls == [("resume", "n1")]
    admin = FakeSlurm(ten_nodes(me_reason="bad DIMM [bob@2026-11-26T10:00:00]"))
    for text in ("", FATAL):
        v = run(admin, text)
        assert admin.calls == [] and v.drained_by_other == "bad DIMM"


def test_agent_down_is_a_finding(monkeypatch):
    slurm = FakeSlurm(ten_nodes())
    v = run(slurm, None)
    assert slurm.calls == [("drain", "n1", "tracehound: agent not answering at http://agent")]
    assert v.findings[0].condition == "agent_down"


def test_breaker_refuses_past_its_share():
    # 10 % of 10 nodes: one; n2 is already drained by tracehound
    slurm = FakeSlurm(ten_nodes(drained_by_us=("n2",)))
    v = run(slurm, FATAL)
    assert slurm.calls == [] and v.code == hc.REFUSED
    assert "partition batch has 1 of 10 nodes drained by tracehound (n2), limit 1" in v.refusal
    # a larger share lets it through
    slurm = FakeSlurm(ten_nodes(drained_by_us=("n2",)))
    assert run(slurm, FATAL, breaker=Breaker(percent=20)).action == "drain"


def test_racing_drains_keep_the_earliest():
    # n1 drained at the same moment as n2 (earlier reason time): n1 gives it back
    racing = ten_nodes(drained_by_us=("n1", "n2"))
    racing[0] = line("n1", "IDLE+DRAIN", reason="tracehound: y [root@2026-11-26T21:09:00]")
    slurm = FakeSlurm(ten_nodes(), after_drain=racing)
    v = run(slurm, FATAL)
    assert [c[0] for c in slurm.calls] == ["drain", "resume"] and v.code == hc.REFUSED
    assert "n2 stay drained" in v.refusal
    # the earlier one keeps its drain
    v = run(FakeSlurm(racing), FATAL, node="n2")
    assert v.refusal == "" and v.action == "none"


def test_breaker_limit():
    assert [Breaker().limit(n) for n in (1, 3, 10, 25, 100)] == [1, 1, 1, 2, 10]
    assert Breaker(percent=50, minimum=2).limit(3) == 2


class Trickle(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200)
        self.send_header("Content-Length", "100000")
        self.end_headers()
        try:
            for _ in range(200):
                self.wfile.write(b"# x\n")
                self.wfile.flush()
                time.sleep(0.05)
        except OSError:
            pass

    def log_message(self, *args):
        pass


@pytest.fixture
def trickling_agent():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Trickle)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_an_agent_that_trickles_its_answer_is_not_waited_for(trickling_agent):
    # each byte comes well within the timeout, the whole answer never does
    assert hc.scrape(trickling_agent, 0.5, {}) is None


def test_an_agent_that_is_not_there():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]       # bound, never listening: refused
        assert hc.scrape(f"http://127.0.0.1:{port}", 0.5, {}) is None


def test_scontrol_failure_is_an_error():
    from tracehound.health.slurm import Slurm
    with pytest.raises(SlurmError, match="scontrol show"):
        Slurm("/bin/false").nodes()


def test_health_starts_without_the_agents_subsystems(tmp_path):
    """slurmd runs it on every node every interval: `tracehound health`
    builds only its own parser, never importing what `run` needs."""
    import subprocess
    import sys
    code = ("import sys; from tracehound.cli import main; "
            "rc = main(['health', '--check-only', '--url', 'http://127.0.0.1:1', "
            f"'--state-file', {str(tmp_path / 's.json')!r}]); "
            "print(rc, 'tracehound.subsystems' in sys.modules, 'tracehound.commands.run' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.stdout.splitlines()[-1] == "1 False False", out.stdout + out.stderr
    assert "agent not answering at http://127.0.0.1:1" in out.stdout
    # every command imports its own module only: an agent's or an
    # experiment's start does not pay for the others'
    code = ("import sys; from tracehound.cli import main\n"
            "try: main(['run', '--help'])\n"
            "except SystemExit: pass\n"
            "print(sorted(m for m in ('tracehound.chaos', 'tracehound.top', 'tracehound.commands.doctor')"
            " if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.stdout.splitlines()[-1] == "[]", out.stdout + out.stderr
    # every command is still listed where no command is given
    from tracehound.cli import build_parser
    assert "health" in build_parser().format_help() and "run" in build_parser().format_help()


def test_health_reads_the_agent_the_environment_names(tmp_path, capsys, monkeypatch):
    # the variable every client honours names /metrics; health asks its base
    from tracehound.cli import main
    monkeypatch.setenv("TRACEHOUND_METRICS_URL", "http://127.0.0.1:1/metrics")
    assert main(["health", "--check-only", "--state-file", str(tmp_path / "s.json")]) == 1
    assert "agent not answering at http://127.0.0.1:1\n" in capsys.readouterr().out


@pytest.mark.parametrize("argv", [["--conditions", "gpu_lost,no_such"], ["--breaker-percent", "0"],
                                  ["--breaker-min", "-1"], ["--timeout", "x"],
                                  ["--rdma-flaps", "1.5"]])
def test_bad_flags_are_usage_errors(argv, capsys):
    from tracehound.cli import main
    with pytest.raises(SystemExit) as exit_:
        main(["health", *argv])
    assert exit_.value.code == 2
    assert "tracehound health: error: argument" in capsys.readouterr().err


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
    assert log.read_text().splitlines() == ["show node -o"]
