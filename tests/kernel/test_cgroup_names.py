"""The kernel's own name for a cgroup, taken at mkdir: a cgroup that is made
and removed before anything in the agent could look still has its path."""
import os
import uuid

import pytest

from tracehound.attribution.cgroups import CgroupResolver
from tracehound.probes.cgroup_names import CgroupNamesProbe

from .conftest import remove_cgroup


@pytest.fixture
def names():
    probe = CgroupNamesProbe("v2").start()
    assert probe.available, probe.reason
    yield probe
    probe.close()


def test_a_cgroup_gone_before_anyone_looked_keeps_its_name(names, cgroup_root):
    parent = f"/thtest/named-{uuid.uuid4().hex[:8]}"
    os.makedirs(cgroup_root + parent)
    try:
        # a user's name: spaces and bytes that are not UTF-8 come back as given
        rel = parent + "/step 0-" + os.fsdecode(b"\xff\xfe")
        os.mkdir(cgroup_root + rel)
        ino = os.stat(cgroup_root + rel).st_ino
        os.rmdir(cgroup_root + rel)
        assert names.lookup(ino) == rel
        # no watcher, and a rescan now could not place it: the kernel's name does
        resolver = CgroupResolver(cgroup_root)
        resolver.names = names.lookup
        resolver.new_scrape()
        assert resolver.path(ino) == rel
        assert resolver.removed(ino)
    finally:
        remove_cgroup(cgroup_root + parent)

