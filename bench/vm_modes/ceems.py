"""CEEMS's VFS programs for bench/vm_modes, built on the host by CEEMS's own
Makefile, and the holders that keep them, or the empty programs of the floor,
loaded in the guest (`python -m bench.vm_modes --hold KIND`) until told to stop."""
from __future__ import annotations

import json
import os
import re
import shutil
import signal
import struct
import subprocess
import threading
from pathlib import Path

from bench.common import sh

BPF_TRACE_FENTRY, BPF_TRACE_FEXIT = 24, 25
CGROUP2_SUPER_MAGIC, CGROUP_SUPER_MAGIC = 0x63677270, 0x27E0EB


def build_ceems(src: Path, dest: Path) -> dict:
    """CEEMS's VFS objects, built by its own Makefile in a copy of its tree.
    Its README asks for clang >= 18: older clang emits code that the 6.1
    verifier rejects (a map value pointer out of bounds in the path walk)."""
    if not (src / "Makefile").exists():
        return {"note": f"CEEMS source not found at {src}"}
    cands = [(f"clang-{v}", f"llc-{v}") for v in range(25, 17, -1)] + [("clang", "llc")]
    tools = next(((c, l) for c, l in cands if shutil.which(c) and shutil.which(l)
                  and int(re.search(r"version (\d+)", sh([c, "--version"])).group(1)) >= 18), None)
    if not tools:
        return {"note": "CEEMS needs clang >= 18 (its README) and none is installed "
                        "(apt-get install clang-19 llvm-19)"}
    shutil.copytree(src, dest, ignore=shutil.ignore_patterns("objs", "deps"))
    for d, _, files in os.walk(dest):  # the shared tree is read-only; make writes in the copy
        os.chmod(d, 0o755)
        for f in files:
            os.chmod(os.path.join(d, f), 0o644)
    r = subprocess.run(["make", "-C", str(dest), "-j2", f"CLANG={tools[0]}", f"LLC={tools[1]}"],
                       capture_output=True, text=True)
    if r.returncode:
        return {"note": f"CEEMS make failed:\n{(r.stdout + r.stderr)[-1500:]}"}
    return {"objs": str(dest / "objs"), "clang": sh([tools[0], "--version"]).splitlines()[0],
            "make": f"make CLANG={tools[0]} LLC={tools[1]}"}

def hold(kind: str, obj_path: str | None) -> int:
    import ctypes
    from tracehound.bpf import libbpf
    from tracehound.bpf.features import hookprobe_path
    from tracehound.bpf.loader import BpfObject
    from tracehound.errors import ProbeError
    stop, objs, failed = threading.Event(), [], []
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    try:
        if kind == "empty-tp":
            o = BpfObject(hookprobe_path())
            objs.append(o)
            for name, p in o.programs.items():
                p.autoload = name in ("probe_tp_btf", "probe_tp_btf_exit")
            o.load()
            o.attach_all()
        elif kind == "empty-fentry":
            # hookprobe.bpf.c's empty fentry program, one copy per hook; libbpf
            # turns a copy into fexit before load, so no fexit twin is needed
            fn = libbpf.lib().bpf_program__set_expected_attach_type
            fn.argtypes, fn.restype = [ctypes.c_void_p, ctypes.c_int], ctypes.c_int
            for target in ("vfs_read", "vfs_write"):
                for attach_type in (BPF_TRACE_FENTRY, BPF_TRACE_FEXIT):
                    o = BpfObject(hookprobe_path())
                    objs.append(o)
                    for name, p in o.programs.items():
                        p.autoload = name == "probe_fentry"
                    p = o.programs["probe_fentry"]
                    if fn(p._ptr, attach_type):
                        raise RuntimeError("libbpf cannot change the attach type")
                    p.set_attach_target(target)
                    o.load()
                    o.attach_all()
        else:
            o = BpfObject(obj_path)
            objs.append(o)
            o.load()
            # what CEEMS's exporter writes before attaching: cgroup v2 means
            # bpf_get_current_cgroup_id(); v1 the css of its active controller
            if Path("/sys/fs/cgroup/cgroup.controllers").exists():
                conf = struct.pack("<QQ", 0, CGROUP2_SUPER_MAGIC)
            else:
                names = [l.split()[0] for l in Path("/proc/cgroups").read_text().splitlines()
                         if not l.startswith("#")]
                conf = struct.pack("<QQ", names.index("memory") if "memory" in names else 0,
                                   CGROUP_SUPER_MAGIC)
            o.map("conf_map").update(struct.pack("<I", 0), conf)
            for p in o.programs.values():  # like the exporter: a hook that fails is skipped
                try:
                    o.links.append(p.attach())
                except ProbeError as e:
                    failed.append(f"{p.name}: {e}")
            signal.signal(signal.SIGUSR1, lambda *_: print("counts " + json.dumps(read_ceems(o)),
                                                           flush=True))
        links = sum(len(o.links) for o in objs)
        print(f"attached {links} programs" + (f"; failed: {failed}" if failed else ""), flush=True)
        stop.wait()
    finally:
        for o in objs:
            o.close()
    return 0


def read_ceems(o) -> dict:
    """CEEMS's accumulators: (cgroup id, mount path) -> bytes, calls, errors for
    read and write; cgroup id -> calls, errors for open, create, unlink."""
    out = {}
    for op in ("read", "write"):
        out[op] = [[struct.unpack_from("<I", k)[0], k[4:].split(b"\0")[0].decode(errors="replace"),
                    *struct.unpack("<QQQ", v)] for k, v in o.map(f"{op}_accumulator").items()]
    for op in ("open", "create", "unlink"):
        out[op] = [[struct.unpack("<I", k)[0], *struct.unpack("<QQ", v)]
                   for k, v in o.map(f"{op}_accumulator").items()]
    return out

