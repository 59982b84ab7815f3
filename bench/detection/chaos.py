"""One example experiment of examples/ run once against a running agent,
its tracehound detection probes reading the agent (or a Prometheus that
scrapes it) at a given interval: bench/detection's runs, and the GPU faults
of bench/gpu."""
from __future__ import annotations

import glob
import json
import os
import random
import shutil
import subprocess

import yaml

from bench.common import REPO, tracehound

EXAMPLES = os.path.join(REPO, "examples")


def with_interval(doc: dict, interval: float, prometheus: str | None = None) -> dict:
    """Every tracehound detection probe reads at `interval` seconds, or asks
    `prometheus` (which scrapes the agent every `interval`) every second with
    the fault's own PromQL; timeouts stay at least six intervals long. Events
    probes keep reading the agent: Prometheus does not hold its events."""
    for act in doc.get("method", []):
        detect = (act.get("provider") or {}).get("detect")
        if not isinstance(detect, dict) or detect.get("source", "agent") not in ("agent",
                                                                                  "events"):
            continue
        timeout = detect.get("timeout", 5)
        detect["timeout"] = max(timeout if isinstance(timeout, (int, float)) else 20,
                                6 * interval)
        detect["interval"] = interval
        if prometheus and detect.get("source", "agent") == "agent":
            detect.update(source="prometheus", url=prometheus, interval=1.0)
            detect.pop("window", None)
    return doc


def run_once(url: str, name: str, interval: float, work: str,
             prometheus: str | None = None, tag: str = "",
             env: dict | None = None) -> list[dict]:
    """Run examples/<name>.yaml once against the agent at `url`; one row per
    tracehound detection probe. `env` is laid over the run's environment
    (e.g. CHAOS_GPU_PCI: a real GPU's bus id instead of a random one)."""
    with open(os.path.join(EXAMPLES, f"{name}.yaml")) as f:
        doc = with_interval(yaml.safe_load(f), interval, prometheus)
    path = os.path.join(work, f"{name}.json")
    with open(path, "w") as f:
        json.dump(doc, f)
    out_dir = os.path.join(work, f"{name}-report")
    # Each run's own cgroup and scratch mount: a Prometheus window (increase
    # over a minute) must not find the previous run's fault in the same series.
    env = {**os.environ, "TRACEHOUND_METRICS_URL": url, "CHAOS_HOLD_SECONDS": "1",
           "CHAOS_STALL_TIMEOUT": str(max(20, 4 * interval)),
           "CHAOS_CGROUP": f"/tracehound-chaos-{name}-{tag}",
           "CHAOS_SCRATCH_DIR": f"/run/tracehound-chaos-{name}-{tag}",
           # gpu.xid: a bus id of its own per run (no real GPU has one this
           # high), for the same reason; the kernel ring keeps earlier runs' lines
           "CHAOS_GPU_PCI": f"0000:{random.randrange(0x80, 0xff):02x}:{random.randrange(32):02x}.0",
           **(env or {})}
    log = os.path.join(work, f"{name}.log")
    with open(log, "w") as out:
        subprocess.run(tracehound() + ["chaos", "run", path, "--yes", "--allow-code", "--journal",
                                       os.path.join(work, f"{name}-journal"), "--report", out_dir],
                       env=env, stdout=out, stderr=subprocess.STDOUT, timeout=600)
    reports = glob.glob(os.path.join(out_dir, "*-journal.json"))
    if not reports:
        with open(log) as f:
            raise RuntimeError(f"{name}: no report\n{f.read()[-2000:]}")
    with open(reports[0]) as f:
        record = json.load(f)
    shutil.rmtree(out_dir, ignore_errors=True)
    rows = []
    for d in record["detections"]:
        if not d.get("tracehound_signal") and not d["probe"].startswith("tracehound-"):
            continue        # a ground-truth probe (ping, cpu.stat)
        rows.append({"example": name, "probe": d["probe"], "fault": d.get("fault"),
                     "detected": bool(d["detected"]), "mttd_s": d.get("mttd_seconds"),
                     "signal": d.get("query") or "", "note": d.get("note", "")})
    return rows
