"""Attach empty tp_btf programs to every syscall's entry and exit (the hooks
tracehound's tracepoint mode uses) and wait for SIGINT/SIGTERM.

What this costs is the floor of any syscall-level probe on this kernel: the
dispatch alone, with no work in the programs. With --exit-only just the
sys_exit program is attached: the floor of a probe that keeps no latency and
so needs no entry timestamp."""
import argparse
import signal
import sys
import threading

from tracehound.bpf.features import hookprobe_path
from tracehound.bpf.loader import BpfObject

ENTER, EXIT = "probe_tp_btf", "probe_tp_btf_exit"


def main() -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.overhead.empty_hooks",
                                 description=__doc__)
    ap.add_argument("--exit-only", action="store_true", help="attach only the sys_exit program")
    wanted = (EXIT,) if ap.parse_args().exit_only else (ENTER, EXIT)
    stop = threading.Event()
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    with BpfObject(hookprobe_path()) as obj:
        for name, prog in obj.programs.items():
            prog.autoload = name in wanted
        obj.load()
        obj.attach_all()
        print(f"attached {len(wanted)} empty programs", flush=True)
        stop.wait()
    return 0


if __name__ == "__main__":
    sys.exit(main())
