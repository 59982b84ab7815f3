"""The gpu subsystem reads the kernel log whatever NVML says, reports an
unreadable one without failing, and saves its position on close."""
import os
from types import SimpleNamespace

import pytest

from tracehound.config import AgentConfig
from tracehound.detect.progress_board import ProgressBoard
from tracehound.subsystems import gpu as sub


def subsystem(tmp_path, monkeypatch, kmsg_path):
    monkeypatch.setattr(sub, "open_gpu_collector", lambda **kw: (None, "no NVIDIA driver"))
    monkeypatch.setattr(sub, "KMSG_PATH", kmsg_path)
    ctx = SimpleNamespace(config=AgentConfig(state_dir=str(tmp_path / "state")),
                          owners=SimpleNamespace(of_pid=lambda pid: {}, root="/"),
                          progress=ProgressBoard())
    return sub.GpuSubsystem(ctx)


def names(s) -> set[str]:
    return {f.name for c in s.collectors() for f in c.collect()}


def test_unreadable_kernel_log_is_reported_not_fatal(tmp_path, monkeypatch):
    s = subsystem(tmp_path, monkeypatch, str(tmp_path / "no-kmsg"))
    s.start()
    try:
        lines = s.status_lines()
        assert lines[0] == "gpu: no NVIDIA driver"
        assert lines[1].startswith("gpu kernel log: not available (cannot read ")
        assert "tracehound_gpu_kmsg_up" in names(s) and "tracehound_gpu_xid_errors" in names(s)
        assert [d.name for d in s.detectors()] == ["gpu_kmsg"]
    finally:
        s.close()
        s.close()


@pytest.mark.skipif(not os.access("/dev/kmsg", os.R_OK), reason="reading /dev/kmsg needs root")
def test_without_nvml_the_kernel_log_is_read_and_the_position_saved(tmp_path, monkeypatch):
    s = subsystem(tmp_path, monkeypatch, "/dev/kmsg")
    s.start()
    try:
        assert s._kmsg_watcher.wait_caught_up(30) and s._kmsg_watcher.running
        assert s.status_lines()[1].startswith("gpu kernel log: reading /dev/kmsg")
    finally:
        s.close()
    assert not s._kmsg_watcher.running
    assert os.path.exists(tmp_path / "state" / "kmsg-seq")
