"""Bad input and missing prerequisites: one clear line, non-zero exit, no traceback."""
import os
import socket
import subprocess

import pytest

from tests.conftest import tracehound_cmd


def th(*args, env=None, user=None):
    e = dict(os.environ, **(env or {}))
    cmd = tracehound_cmd() + list(args)
    if user is not None:
        cmd = ["setpriv", f"--reuid={user}", f"--regid={user}", "--clear-groups"] + cmd
    return subprocess.run(cmd, capture_output=True, text=True, env=e, timeout=60)


def one_line_error(res, *needles):
    assert res.returncode != 0
    assert "Traceback" not in res.stderr + res.stdout
    lines = [x for x in res.stderr.splitlines() if x.strip()]
    assert len(lines) == 1, res.stderr
    for n in needles:
        assert n in lines[0], lines[0]


def test_help_lists_subcommands():
    res = th("--help")
    assert res.returncode == 0
    assert "run" in res.stdout and "doctor" in res.stdout
    sub = th("run", "--help")
    assert "--listen" in sub.stdout and "--hook-mode" in sub.stdout


ALL_TIMED = {"io.read", "io.write", "io.fsync"}


@pytest.mark.parametrize("value,timed,sampled,audit", [
    ("on", ALL_TIMED, True, False), ("off", set(), True, False),
    (" io.fsync , io.read ", {"io.fsync", "io.read"}, True, False),
    ("every", ALL_TIMED, False, False), ("every:io.fsync", {"io.fsync"}, False, False),
    ("audit", ALL_TIMED, True, True)])
def test_latency_flag_names_the_timed_probes_and_whether_sampled(value, timed, sampled, audit):
    from tracehound.commands.run import _latency
    assert _latency(value) == (timed, sampled, audit)


@pytest.mark.parametrize("value", ["every:", "every:io.open", "sometimes", ""])
def test_a_latency_flag_that_names_no_probe_is_refused(value):
    res = th("run", "--latency", value)
    assert res.returncode == 2 and "--latency" in res.stderr and "every" in res.stderr


def test_bad_listen_address():
    one_line_error(th("run", "--listen", "localhost"), "--listen", "HOST:PORT")


def test_bad_hook_mode_is_rejected_by_parser():
    res = th("run", "--hook-mode", "magic")
    assert res.returncode == 2 and "invalid choice" in res.stderr


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to drop to an unprivileged user")
def test_not_root():
    one_line_error(th("run", user=65534), "root", "sudo")


@pytest.mark.skipif(os.geteuid() != 0, reason="the root check runs first; needs root to reach this one")
def test_missing_libbpf():
    one_line_error(th("run", env={"TRACEHOUND_LIBBPF": "libbpf-missing.so.9"}),
                   "libbpf-missing.so.9 not found", "apt-get install libbpf1")


@pytest.mark.skipif(os.geteuid() != 0, reason="the root check runs first; needs root to reach this one")
def test_kernel_without_btf():
    one_line_error(th("run", env={"TRACEHOUND_BTF": "/nonexistent/vmlinux"}),
                   "no BTF", "CONFIG_DEBUG_INFO_BTF")


@pytest.mark.skipif(os.geteuid() != 0, reason="the root check runs first; needs root to reach this one")
def test_port_in_use():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen()
    port = s.getsockname()[1]
    try:
        one_line_error(th("run", "--listen", f"127.0.0.1:{port}"), "address already in use",
                       "--listen")
    finally:
        s.close()


@pytest.mark.parametrize("histograms,latency,timed", [
    ("cgroup-mount", frozenset({"io.read", "io.fsync"}), {"read", "fsync"}),
    ("off", frozenset({"io.read", "io.write", "io.fsync"}), set())])
def test_the_io_probe_times_what_is_exported(histograms, latency, timed):
    """No latency histogram exported: no call is timed either."""
    from tracehound.config import AgentConfig
    from tracehound.host.mounts import MountTable
    from tracehound.subsystems.base import Context
    from tracehound.subsystems.io import IoSubsystem
    here = os.path.dirname(__file__)
    ctx = Context(AgentConfig(latency_histograms=histograms, latency=latency),
                  MountTable(os.path.join(here, "fixtures", "exposition", "mountinfo")), None)
    assert IoSubsystem(ctx).probe.config.latency == timed


@pytest.mark.parametrize("value", ["0", "1.5", "1000001", "fast"])
def test_a_sample_gap_out_of_range_is_refused(value):
    res = th("run", "--latency-sample-gap", value)
    assert res.returncode == 2
    assert "--latency-sample-gap" in res.stderr and "microseconds" in res.stderr


@pytest.mark.parametrize("source,gap_ns", [("tsc", 20_000), ("kvm-clock", 20_000),
                                            ("hpet", 100_000), ("acpi_pm", 100_000),
                                            (None, 20_000)])
def test_without_a_sample_gap_the_clock_source_sets_it(monkeypatch, source, gap_ns):
    """A clock read costs tens of ns from the CPU's counter, far more from a
    device: there the default gap is wider, and the agent says why."""
    from tracehound.config import AgentConfig
    from tracehound.host import clocksource
    from tracehound.host.mounts import MountTable
    from tracehound.subsystems.base import Context
    from tracehound.subsystems.io import IoSubsystem
    monkeypatch.setattr(clocksource, "current", lambda: source)
    here = os.path.dirname(__file__)
    ctx = Context(AgentConfig(), MountTable(os.path.join(here, "fixtures", "exposition",
                                                         "mountinfo")), None)
    io = IoSubsystem(ctx)
    assert io.probe.config.sample_gap_ns == gap_ns
    assert f"about one call per {gap_ns // 1000} us" in io.sampling
    assert (source or "unknown") in io.sampling


@pytest.mark.parametrize("sampled,gap_ns", [(True, 250_000), (False, 0)])
def test_the_sample_gap_reaches_the_io_probe_when_calls_are_sampled(sampled, gap_ns):
    """--latency every times every call: no gap reaches the kernel then."""
    from tracehound.config import AgentConfig
    from tracehound.host.mounts import MountTable
    from tracehound.subsystems.base import Context
    from tracehound.subsystems.io import IoSubsystem
    here = os.path.dirname(__file__)
    ctx = Context(AgentConfig(latency_sampled=sampled, latency_sample_gap_ns=250_000),
                  MountTable(os.path.join(here, "fixtures", "exposition", "mountinfo")), None)
    assert IoSubsystem(ctx).probe.config.sample_gap_ns == gap_ns
