"""GPU faults: burn (matmul loop with a result check), memory exhaustion,
NCCL misconfiguration of a launched job (DCGM injection: gpu_dcgm.py).

Burn and memory run in a child process (python -m this module) carrying the
fault's marker in its environment, so a rollback, or a recovery after a
crash, finds and ends it. The child writes its progress to a JSON file that
the report reads.
"""
from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time

from . import Arg, Availability, Detection, Fault, FaultError, Prepared, names
from .proc import MARKER, kill_marked
from . import workload_cgroup
from .targets import cgroup_dir

NCCL_MODES = {
    "ib_disable": {"NCCL_IB_DISABLE": "1"},
    "wrong_ifname": {"NCCL_SOCKET_IFNAME": "tracehound-no-such-if0"},
    "tiny_ib_timeout": {"NCCL_IB_TIMEOUT": "1"},
}


def backend():
    """(name, module) of an importable array library with a CUDA device."""
    try:
        import torch
        if torch.cuda.is_available() and torch.cuda.device_count() > 0:
            return "torch", torch
    except ImportError:
        pass
    try:
        import cupy
        if cupy.cuda.runtime.getDeviceCount() > 0:
            return "cupy", cupy
    except Exception:  # ImportError, or CUDA errors without a driver
        pass
    return None, None


def _gpu_availability() -> Availability:
    name, _ = backend()
    if name is None:
        return Availability(False, "no PyTorch or CuPy with a CUDA device here")
    return Availability(True, f"{name} with a CUDA device")


def write_result(path: str, data: dict) -> None:
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(data, f)
    os.replace(tmp, path)


def burn(device: int, seconds: float, size: int, result_path: str) -> dict:
    """Multiply two random matrices until time is up, checking every result
    against the first one: a GPU that computes wrong answers under load is
    the fault this finds, not just heat."""
    name, lib = backend()
    if name is None:
        raise RuntimeError("no PyTorch or CuPy with a CUDA device")
    if name == "torch":
        dev = f"cuda:{device}"
        a, b = lib.randn(size, size, device=dev), lib.randn(size, size, device=dev)
        sync = lambda: lib.cuda.synchronize(dev)  # noqa: E731
    else:
        lib.cuda.Device(device).use()
        a, b = lib.random.rand(size, size), lib.random.rand(size, size)
        sync = lambda: lib.cuda.Device(device).synchronize()  # noqa: E731
    reference = a @ b
    sync()
    result = {"backend": name, "device": device, "size": size, "iterations": 0,
              "mismatches": 0}
    deadline = time.monotonic() + seconds
    last_write = 0.0
    while time.monotonic() < deadline:
        c = a @ b
        sync()
        result["iterations"] += 1
        if not lib.allclose(c, reference, rtol=1e-5, atol=1e-5):
            result["mismatches"] += 1
        if time.monotonic() - last_write > 1.0:
            write_result(result_path, result)
            last_write = time.monotonic()
    write_result(result_path, result)
    return result


def hold_memory(device: int, nbytes: int | None, fraction: float, result_path: str,
                seconds: float) -> dict:
    """Allocate and touch GPU memory, then hold it until killed or time is up."""
    name, lib = backend()
    if name is None:
        raise RuntimeError("no PyTorch or CuPy with a CUDA device")
    if name == "torch":
        free, _total = lib.cuda.mem_get_info(device)
        want = nbytes if nbytes else int(free * fraction)
        block = lib.empty(want, dtype=lib.uint8, device=f"cuda:{device}")
        block.fill_(1)
    else:
        lib.cuda.Device(device).use()
        free, _total = lib.cuda.runtime.memGetInfo()
        want = nbytes if nbytes else int(free * fraction)
        block = lib.ones(want, dtype=lib.uint8)
    result = {"backend": name, "device": device, "bytes_held": want, "free_before": free}
    write_result(result_path, result)
    time.sleep(seconds)
    del block
    return result


class ChildFault(Fault):
    """A fault carried out by a child process that rollback ends."""
    where = "gpu"

    def availability(self):
        return _gpu_availability()

    def _child(self, fault_id: str, task: str, params: dict, target: str) -> Prepared:
        avail = self.availability()
        if not avail.ok:
            raise FaultError(f"not available here: {avail.reason}")
        result = os.path.join(tempfile.gettempdir(), f"tracehound-chaos-{fault_id}.json")
        argv = [sys.executable, "-m", __name__, task, json.dumps({**params,
                                                                  "result_path": result})]
        return Prepared([target], {"argv": argv, "marker": fault_id, "result": result})

    def apply(self, state):
        env = dict(os.environ, **{MARKER: state["marker"]})
        proc = subprocess.Popen(state["argv"], env=env, start_new_session=True,
                                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL)
        return {"pid": proc.pid}

    def observe(self, state):
        try:
            with open(state["result"]) as f:
                return json.load(f)
        except (OSError, ValueError):
            return {}

    def rollback(self, state):
        kill_marked(state["marker"], state.get("pid"))
        for path in (state["result"], state["result"] + ".tmp"):
            try:
                os.unlink(path)
            except FileNotFoundError:
                pass
        return None


class GpuBurn(ChildFault):
    name = "gpu.burn"
    summary = "matmul loop on one GPU with a result check (PyTorch or CuPy)"
    destructive = False
    args = {"device": Arg(int, "CUDA device index", default=0, minimum=0),
            "seconds": Arg(float, "how long to burn at most", default=60, minimum=1,
                           maximum=86400),
            "size": Arg(int, "matrix side", default=8192, minimum=64, maximum=65536)}

    def prepare(self, args, fault_id):
        return self._child(fault_id, "burn", {"device": args["device"], "size": args["size"],
                                              "seconds": args["seconds"]},
                           f"GPU {args['device']}")

    def detection(self, args, state=None):
        q = f'tracehound_gpu_utilization_ratio{{gpu="{args.get("device", 0)}",engine="gpu"}}'
        return Detection(query=q, signal="value", predicate="> 0.9", promql=q,
                         note="GPU utilization above 90%")


class GpuMemory(ChildFault):
    name = "gpu.memory"
    summary = "allocate and hold most of a GPU's free memory"
    args = {"device": Arg(int, "CUDA device index", default=0, minimum=0),
            "bytes": Arg(int, "bytes to hold (default: fraction of free memory)", minimum=1),
            "fraction": Arg(float, "share of free memory to hold", default=0.95,
                            minimum=0.01, maximum=1.0),
            "seconds": Arg(float, "hold at most this long", default=600, minimum=1,
                           maximum=86400)}

    def prepare(self, args, fault_id):
        return self._child(fault_id, "memory", {"device": args["device"],
                                                "nbytes": args.get("bytes"),
                                                "fraction": args["fraction"],
                                                "seconds": args["seconds"]},
                           f"GPU {args['device']}")

    def detection(self, args, state=None):
        q = f'tracehound_gpu_memory_used_bytes{{gpu="{args.get("device", 0)}"}}'
        return Detection(query=q, signal="increase", predicate="> 100000000",
                         promql=f"delta({q}[1m])",
                         note="frame-buffer memory in use grows by more than 100 MB")


NVIDIA_DRIVER = "/proc/driver/nvidia/version"


class NcclFault(Fault):
    name = "gpu.nccl"
    summary = "launch a job with NCCL misconfigured (IB off, wrong interface, tiny timeout)"
    destructive = False
    where = "gpu"
    args = {"command": Arg(list, "the job to launch, as an argument list", required=True),
            "mode": Arg(str, "which NCCL fault", required=True, choices=tuple(NCCL_MODES)),
            "env": Arg(dict, "more environment for the job"),
            "log": Arg(str, "file for the job's output", default=""),
            "cgroup": Arg(str, "cgroup v2 path (existing) the job runs in: detection looks "
                               "at its exits", grammar=names.cgroup_path)}

    def check(self, args):
        if not args["command"]:
            return ["command must not be empty"]
        return []

    def launches(self, args):
        command = args.get("command")
        return shlex.join(str(x) for x in command) if isinstance(command, list) else None

    def availability(self):
        # NCCL runs on NVIDIA GPUs only: without the driver a job has nothing to misconfigure
        if not os.path.exists(NVIDIA_DRIVER):
            return Availability(False, f"no NVIDIA driver here ({NVIDIA_DRIVER} is missing)")
        return Availability(True, "NVIDIA driver loaded")

    def prepare(self, args, fault_id):
        if not shutil.which(str(args["command"][0])):
            raise FaultError(f"{args['command'][0]} is not on PATH")
        env = {**NCCL_MODES[args["mode"]], **{k: str(v) for k, v in
                                             (args.get("env") or {}).items()}}
        log = args.get("log") or os.path.join(tempfile.gettempdir(),
                                              f"tracehound-chaos-{fault_id}.log")
        join = []
        if args.get("cgroup"):
            cgroup_dir(args["cgroup"])     # it exists, or the fault is refused here
            join = workload_cgroup.existing_procs(args["cgroup"])
        return Prepared([" ".join(map(str, args["command"]))],
                        {"argv": [str(x) for x in args["command"]], "env": env, "log": log,
                         "marker": fault_id, "join": join})

    def apply(self, state):
        env = dict(os.environ, **state["env"], **{MARKER: state["marker"]})
        argv = state["argv"]
        if state["join"]:
            # joins the cgroup (in each hierarchy an agent may key by) before
            # exec: no process of the job runs outside it
            argv = workload_cgroup.join_argv(state["join"], argv)
        with open(state["log"], "ab") as log:
            proc = subprocess.Popen(argv, env=env, start_new_session=True,
                                    stdin=subprocess.DEVNULL, stdout=log, stderr=log)
        return {"pid": proc.pid}

    def rollback(self, state):
        kill_marked(state["marker"], state.get("pid"))
        return None

    def detection(self, args, state=None):
        if not args.get("cgroup"):
            return Detection(note="give the job a cgroup: tracehound sees a misconfigured "
                                  "NCCL job by its processes' failed exits there")
        sel = f'{{cgroup="{args["cgroup"]}",reason=~"error|signal"}}'
        return Detection.counter_grows(
            "tracehound_process_exits_total" + sel,
            "the job's processes exit with an error or a signal (a hang instead is a "
            "job_stalled event once --stall-after passes)")


FAULTS = [GpuBurn(), GpuMemory(), NcclFault()]


def main(argv: list[str]) -> int:
    task, params = argv[0], json.loads(argv[1])
    if task == "burn":
        burn(params["device"], params["seconds"], params["size"], params["result_path"])
    elif task == "memory":
        hold_memory(params["device"], params.get("nbytes"), params["fraction"],
                    params["result_path"], params["seconds"])
    else:
        print(f"unknown task {task}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
