"""The kernel's clock source as the agent reads it from sysfs: a name, or
nothing where the file is missing or holds something else."""
import pytest

from tracehound.host import clocksource


@pytest.mark.parametrize("text,name", [("tsc\n", "tsc"), ("hpet\n", "hpet"),
                                       ("kvm-clock\n", "kvm-clock"), ("", None),
                                       ("a b\n", None), ("x" * 200, None), ("\xff\xfe\n", None)])
def test_the_current_clock_source_is_a_name_or_nothing(tmp_path, text, name):
    f = tmp_path / "current_clocksource"
    f.write_bytes(text.encode("latin-1"))
    assert clocksource.current(str(f)) == name


def test_no_sysfs_file_is_no_clock_source(tmp_path):
    assert clocksource.current(str(tmp_path / "missing")) is None


def test_a_device_clock_widens_the_gap_and_a_cpu_counter_does_not():
    fast, why = clocksource.sample_gap_ns("tsc")
    slow, why_slow = clocksource.sample_gap_ns("hpet")
    assert slow > fast and "hpet" in why_slow and "slow" in why_slow and "slow" not in why
