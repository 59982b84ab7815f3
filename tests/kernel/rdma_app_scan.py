"""The RDMA probe's start-time scan for libibverbs, run as the agent runs it
(RdmaProbe._attach_app_view); prints what it attached and refused as JSON.
See test_rdma_app_scan.py.

    rdma_app_scan.py uprobes    the application programs loaded and attached
                                for real (this host has no RDMA core for the
                                others)
    rdma_app_scan.py recorded   the attaches recorded instead: the decisions
                                are the same, without detaching 30 uprobes
                                per library on exit (an RCU grace period each)
"""
import json
import os
import stat
import sys

from tracehound.probes.rdma import APP_PROGRAMS, RdmaProbe, RdmaProbeConfig


class RecordedLink:
    def destroy(self) -> None:
        pass


class RecordedProgram:
    def attach_uprobe(self, path: str, offset: int, retprobe: bool = False) -> RecordedLink:
        if not stat.S_ISREG(os.stat(path).st_mode):   # as the kernel would refuse it
            raise OSError(f"{path} is not a regular file")
        return RecordedLink()


class RecordedObject:
    """Stands for the loaded BPF object."""

    def __init__(self):
        self.links = []
        self.programs = {name: RecordedProgram() for name in APP_PROGRAMS}

    def close(self) -> None:
        pass


def main() -> None:
    probe = RdmaProbe(RdmaProbeConfig())
    if sys.argv[1:] == ["uprobes"]:
        probe._load_and_attach_once([], True)
    else:
        probe.obj = RecordedObject()
    try:
        probe._attach_app_view()
        print(json.dumps({"libraries": probe.app_libraries(), "links": len(probe.obj.links),
                          "refused": sorted(probe.app.refused.values())}), flush=True)
    finally:
        probe.close()


if __name__ == "__main__":
    main()
