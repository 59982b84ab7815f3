"""Stop signals that arrive while the command line is still being built."""
import os
import signal

import pytest

from tracehound import cli
from tracehound.signals import HeldSignals


@pytest.fixture(autouse=True)
def python_sigint():
    """SIGINT with Python's own handler, as an interactive run has it: a test
    run started in the background by a non-interactive shell inherits it
    ignored, and an ignored signal is (rightly) never delivered."""
    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, before)


def test_a_signal_before_hand_over_reaches_the_handler_at_once():
    before = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    held = HeldSignals()
    try:
        os.kill(os.getpid(), signal.SIGTERM)       # would end the test run unheld
        got = []
        held.hand_over(got.append)
        assert got == [signal.SIGTERM]
        os.kill(os.getpid(), signal.SIGINT)
        assert got == [signal.SIGTERM, signal.SIGINT]
    finally:
        for s, handler in before.items():
            signal.signal(s, handler)


def test_release_restores_the_handlers_and_delivers_the_held_signal():
    before = signal.getsignal(signal.SIGINT)
    held = HeldSignals()
    os.kill(os.getpid(), signal.SIGINT)
    assert held.received == signal.SIGINT
    with pytest.raises(KeyboardInterrupt):
        held.release()
    assert signal.getsignal(signal.SIGINT) is before


def test_ctrl_c_while_the_parser_is_built_is_exit_130_for_other_commands(monkeypatch, capsys):
    real = cli.build_parser

    def interrupted_build(modules=None):
        os.kill(os.getpid(), signal.SIGINT)        # held: no KeyboardInterrupt here
        return real(modules)
    monkeypatch.setattr(cli, "build_parser", interrupted_build)
    ran = []
    monkeypatch.setattr("tracehound.chaos.cli.cmd_list", lambda args: ran.append(args) or 0)
    assert cli.main(["chaos", "list"]) == 130
    assert ran == [] and signal.getsignal(signal.SIGINT) is signal.default_int_handler
