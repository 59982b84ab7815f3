"""The chaos scaffold's writer: an experiment's fault goes in after
start_writer returns, so the writer must already be writing by then."""
import os
import uuid

import pytest

from tracehound.chaos import scaffold
from tracehound.chaos.faults.targets import cgroup_procs


def test_start_writer_returns_after_the_writers_first_write(tmp_path):
    cgroup = f"/thtest-writer-{uuid.uuid4().hex[:8]}"
    try:
        # one block, then an hour's pause: what is on disk at return is the first write
        started = scaffold.start_writer(cgroup, str(tmp_path), block_size=8192, direct=False,
                                        interval=3600)
        files = os.listdir(tmp_path)
        assert len(files) == 1
        assert os.path.getsize(tmp_path / files[0]) == 8192
        assert cgroup_procs(scaffold._cgroup_path(cgroup)) == [started["pid"]]
    finally:
        scaffold.stop_workload(cgroup, str(tmp_path))
    assert not os.path.exists(scaffold._cgroup_path(cgroup))


def test_a_writer_that_cannot_open_its_file_fails_start_writer_at_once(tmp_path):
    cgroup = f"/thtest-writer-{uuid.uuid4().hex[:8]}"
    try:
        with pytest.raises(RuntimeError, match="exited before its first write"):
            scaffold.start_writer(cgroup, str(tmp_path / "missing"), direct=False,
                                  ready_timeout=600)
    finally:
        scaffold.stop_workload(cgroup)
