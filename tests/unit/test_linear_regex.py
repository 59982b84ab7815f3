"""--stall-cgroups is matched by RE2 against paths any user names: RE2's
syntax is what the flag accepts (a backreference is refused when the flag is
read, with RE2's reason), and a path that is not UTF-8 is matched as the
agent shows it."""
import subprocess
import sys

import pytest

from tracehound.linear_regex import LinearPattern


def test_a_pattern_is_matched_against_the_whole_path():
    p = LinearPattern("/batch/.*")
    assert p.fullmatch("/batch/a") and not p.fullmatch("/x/batch/a")
    assert p.fullmatch("/batch/bad\udcff")                 # a byte that is not UTF-8
    # ...matched as the label shows it: one U+FFFD for the byte
    assert LinearPattern("/batch/bad.").fullmatch("/batch/bad\udcff")
    assert LinearPattern("/batch/bad\ufffd").fullmatch("/batch/bad\udcff")


def test_a_pattern_rising_exponentially_under_backtracking_answers():
    # Python's re takes about 2^n steps here; RE2 answers in one pass
    assert not LinearPattern("(a|aa)*c").fullmatch("a" * 4000)


def test_a_pattern_re2_cannot_run_is_refused_with_its_reason():
    with pytest.raises(ValueError, match="not a regular expression RE2 accepts: .*\\\\1"):
        LinearPattern(r"(a)\1")


def test_the_agent_refuses_such_a_pattern_before_starting():
    done = subprocess.run([sys.executable, "-m", "tracehound", "run", "--stall-cgroups",
                           r"(a)\1"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "--stall-cgroups" in done.stderr \
        and "RE2 accepts" in done.stderr, done.stderr[-2000:]
