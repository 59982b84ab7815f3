"""The one way a probe's object comes up (bpf/lifecycle.py): a failure at any
step after the open leaves nothing of it in the kernel, and a probe the agent
can run without keeps the refusal as its reason."""
import os

import pytest

from tracehound.bpf.lifecycle import OptionalProbe, open_loaded
from tracehound.errors import TracehoundError
from tracehound.probes import object_path


def bpf_fds() -> list[str]:
    """This process's descriptors of BPF programs, maps and links (a classic
    tracepoint's link is a perf event)."""
    out = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue        # the descriptor listdir itself used
        if target.startswith(("anon_inode:bpf", "anon_inode:[perf_event]")):
            out.append(target)
    return out


class Refused(Exception):
    pass


@pytest.mark.parametrize("step", ["prepare", "ready"])
def test_a_failure_after_open_closes_the_object(step):
    before = sorted(bpf_fds())
    seen = {}

    def fail(obj, *maps):
        seen["loaded"] = obj.loaded
        raise Refused(step)
    with pytest.raises(Refused):
        open_loaded(object_path("cgroup_names"), maps=("cgroup_names",),
                    **{step: fail})
    # ready runs after the kernel took the programs and maps: they are gone
    assert seen["loaded"] == (step == "ready")
    assert sorted(bpf_fds()) == before


def test_a_loaded_object_holds_its_maps_and_links_until_closed():
    before = sorted(bpf_fds())
    obj, maps = open_loaded(object_path("cgroup_names"), maps=("cgroup_names",))
    try:
        assert set(maps) == {"cgroup_names"} and obj.links
        held = bpf_fds()
        assert any("bpf-prog" in t for t in held) and any("perf_event" in t for t in held)
    finally:
        obj.close()
    assert sorted(bpf_fds()) == before


class Probe(OptionalProbe):
    def __init__(self, error):
        self.error, self.closed = error, 0

    def _start(self):
        raise self.error

    def close(self):
        self.closed += 1


def test_an_optional_probe_keeps_the_first_line_of_its_refusal():
    probe = Probe(TracehoundError("no cgroup/cgroup_mkdir trace event\ndetail")).start()
    assert (probe.available, probe.reason, probe.closed) == \
        (False, "no cgroup/cgroup_mkdir trace event", 1)
    assert Probe(PermissionError()).start().reason == "PermissionError"
    # a bug is not a refusal: it reaches the caller
    with pytest.raises(ZeroDivisionError):
        Probe(ZeroDivisionError("x")).start()
