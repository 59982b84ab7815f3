"""gpu.dcgm_inject: a value injected into DCGM's field cache, held there.

DCGM's host engine keeps injected values in its cache like sampled ones,
so a later real sample, or the cache's ageing, replaces them within
seconds. The fault injects once in apply() (a failure surfaces there), then
a child process (python -m this module, carrying the fault's marker)
re-injects every `interval` seconds until rollback ends it or `seconds`
pass. Rollback stops the child and injects the value read before the fault
(or the `restore` given): DCGM cannot clear an injection.

tracehound reads NVML, not DCGM's cache: it cannot see an injection. The
detection asks dcgm-exporter's series through Prometheus instead, which is
what checks that the DCGM path (engine, exporter, alerts) works.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

from . import Arg, Availability, Detection, FaultError, Prepared
from .gpu import ChildFault, write_result
from .targets import run_cmd

# DCGM field id -> dcgm-exporter metric, for the fields worth injecting
EXPORTER_NAMES = {
    100: "DCGM_FI_DEV_SM_CLOCK", 140: "DCGM_FI_DEV_MEMORY_TEMP", 150: "DCGM_FI_DEV_GPU_TEMP",
    155: "DCGM_FI_DEV_POWER_USAGE", 203: "DCGM_FI_DEV_GPU_UTIL", 230: "DCGM_FI_DEV_XID_ERRORS",
    251: "DCGM_FI_DEV_FB_FREE", 252: "DCGM_FI_DEV_FB_USED",
    310: "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL", 312: "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL",
    393: "DCGM_FI_DEV_ROW_REMAP_FAILURE",
}
NOT_VISIBLE = ("tracehound (NVML) cannot see a value injected into DCGM's cache; "
               "this asks dcgm-exporter through Prometheus")


def engine_reason() -> str:
    """"" when dcgmi reaches a running host engine, else why not."""
    if not shutil.which("dcgmi"):
        return "dcgmi (DCGM) is not installed here"
    try:
        out = subprocess.run(["dcgmi", "discovery", "-l"], capture_output=True, text=True,
                             timeout=10)
    except subprocess.TimeoutExpired:
        return "dcgmi discovery -l did not answer in 10 s (nv-hostengine hung?)"
    if out.returncode != 0:
        lines = (out.stderr or out.stdout).strip().splitlines()
        return ("DCGM host engine not reachable (is nv-hostengine running?): "
                + (lines[-1] if lines else f"dcgmi exit {out.returncode}"))
    return ""


def read_field(gpu: int, field: int) -> str | None:
    """The field's current value as `dcgmi dmon` prints it; None when DCGM
    has none (N/A) or the output is not understood."""
    out = run_cmd(["dcgmi", "dmon", "-i", str(gpu), "-e", str(field), "-c", "1"])
    for line in out.stdout.splitlines():
        parts = line.split()
        if len(parts) >= 3 and parts[0] == "GPU" and parts[1] == str(gpu):
            return None if parts[-1] in ("N/A", "-") else parts[-1]
    return None


def inject(gpu: int, field: int, value) -> None:
    run_cmd(["dcgmi", "test", "--inject", "--gpuid", str(gpu), "-f", str(field),
             "-v", str(value)])


class DcgmInject(ChildFault):
    """The re-injecting child is a ChildFault's: marked, observed through
    its result file, ended by rollback."""
    name = "gpu.dcgm_inject"
    summary = "inject a DCGM field value and hold it (dcgmi test --inject, re-injected)"
    args = {"gpu": Arg(int, "GPU id in DCGM", default=0, minimum=0),
            "field": Arg(int, "DCGM field id (e.g. 230 = XID errors)", required=True,
                         minimum=1),
            "value": Arg((int, float, str), "value to inject", required=True),
            "restore": Arg((int, float, str), "value injected on rollback (default: the "
                                              "field's value read before the fault)"),
            "interval": Arg(float, "re-inject this often, seconds (before DCGM's cache "
                                   "replaces the value)", default=5, minimum=0.05,
                            maximum=3600),
            "seconds": Arg(float, "re-inject at most this long", default=600, minimum=1,
                           maximum=86400),
            "metric": Arg(str, "dcgm-exporter metric of the field, for detection (known "
                               "for common fields)")}

    def availability(self):
        reason = engine_reason()
        return Availability(not reason, reason or "DCGM host engine answers")

    def prepare(self, args, fault_id):
        reason = engine_reason()
        if reason:
            raise FaultError(f"not available here: {reason}")
        restore = args.get("restore")
        if restore is None:
            restore = read_field(args["gpu"], args["field"])
            if restore is None:
                raise FaultError(f"DCGM has no value of field {args['field']} on GPU "
                                 f"{args['gpu']} to put back: give restore")
        result = os.path.join(tempfile.gettempdir(), f"tracehound-chaos-{fault_id}.json")
        params = {"gpu": args["gpu"], "field": args["field"], "value": args["value"],
                  "interval": args["interval"], "seconds": args["seconds"], "result": result}
        return Prepared([f"DCGM gpu {args['gpu']} field {args['field']}"],
                        {**params, "restore": restore, "marker": fault_id, "result": result,
                         "argv": [sys.executable, "-m", __name__, json.dumps(params)]},
                        notes=[NOT_VISIBLE])

    def apply(self, state):
        # once here, so a refused injection fails the step; the child holds it after
        inject(state["gpu"], state["field"], state["value"])
        return super().apply(state)

    def rollback(self, state):
        # the child first: a re-injection after the restore would undo it
        super().rollback(state)
        inject(state["gpu"], state["field"], state["restore"])
        return None

    def detection(self, args, state=None):
        metric = args.get("metric") or EXPORTER_NAMES.get(args.get("field"))
        if metric is None:
            return Detection(note=NOT_VISIBLE + "; give metric (the dcgm-exporter name of "
                                                "the field) to ask it")
        value = args.get("value")
        number = isinstance(value, (int, float)) and not isinstance(value, bool)
        return Detection(promql=f'{metric}{{gpu="{args.get("gpu", 0)}"}}',
                         predicate=f"== {value}" if number else "> 0", note=NOT_VISIBLE)


FAULTS = [DcgmInject()]


def reinject(gpu: int, field: int, value, interval: float, seconds: float, result: str,
             clock=time.monotonic, sleep=time.sleep) -> int:
    """Inject every `interval` s for `seconds`, on a fixed schedule (a slow
    dcgmi delays one injection, not all later ones; missed slots are
    skipped, not made up in a burst); the count goes to `result`."""
    start = clock()
    deadline = start + seconds
    count, slot = 0, 1
    while True:
        next_at = start + slot * interval
        if next_at >= deadline:
            return count
        sleep(max(0.0, next_at - clock()))
        try:
            inject(gpu, field, value)
            count += 1
        except FaultError:
            pass        # one refused injection (engine busy) is retried next time
        write_result(result, {"reinjections": count})
        slot = max(slot + 1, int((clock() - start) / interval) + 1)


if __name__ == "__main__":
    p = json.loads(sys.argv[1])
    reinject(p["gpu"], p["field"], p["value"], p["interval"], p["seconds"], p["result"])
