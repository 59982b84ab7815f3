"""Attach two empty tp_btf programs to every syscall's entry and exit (the
hooks tracehound's tracepoint mode uses) and wait for SIGINT/SIGTERM.

What this costs is the floor of any syscall-level probe on this kernel: the
dispatch alone, with no work in the programs."""
import signal
import sys
import threading

from tracehound.bpf.features import hookprobe_path
from tracehound.bpf.loader import BpfObject

PROGRAMS = ("probe_tp_btf", "probe_tp_btf_exit")


def main() -> int:
    stop = threading.Event()
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    with BpfObject(hookprobe_path()) as obj:
        for name, prog in obj.programs.items():
            prog.autoload = name in PROGRAMS
        obj.load()
        obj.attach_all()
        print(f"attached {len(PROGRAMS)} empty programs", flush=True)
        stop.wait()
    return 0


if __name__ == "__main__":
    sys.exit(main())
