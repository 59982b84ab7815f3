"""How fast tracehound itself sees each fault of the catalog: every example
experiment this machine can run, several times, against a real agent.

Each tracehound detection probe of an example reads the agent every
--interval seconds (5 by default: what a Prometheus scraping every 5 s would
see, at the luckiest phase; an unlucky phase adds up to one interval). The
report gives per fault and probe: detected in how many runs, MTTD median and
max, and the signal that saw it.

    python bench/detection.py [--runs 3] [--interval 5] [--tier host]
        [--only proc-kill,net-loss] [--json bench/report/detection-host.json]

Needs root, stress-ng, iproute2. `--tier vm` is what tests/vm runs inside the
guest (netem and RDMA examples included); the report merges both JSON files
when present.
"""
from __future__ import annotations

import argparse
import glob
import importlib.util
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid

import yaml

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
from common import machine  # noqa: E402
from tracer import Tool  # noqa: E402

EXAMPLES = os.path.join(ROOT, "examples")
REPORT = os.path.join(HERE, "report")
# what runs where: the host kernel has no sch_netem and no RDMA device
TIERS = {
    "host": ["net-loss", "net-corrupt", "proc-kill", "proc-stop", "proc-stress-cpu", "proc-stress-memory",
             "proc-stress-io", "io-throttle", "io-fill", "gpu-xid"],
    # the RDMA and device-mapper faults need scaffolding the VM tier's own
    # tests build (tests/vm/test_vm_chaos.py reports their MTTD)
    "vm": ["net-loss", "net-corrupt", "net-delay", "proc-kill", "proc-stop", "proc-stress-cpu",
           "proc-stress-memory"],
}
# faults no example can run here, and why (one line each, in the report)
NOT_RUN = {
    "gpu.burn, gpu.memory": "need a GPU: run on a GPU node (tests/gpu)",
    "gpu.nccl": "needs NCCL and GPUs; its detection is the job's failed exits in its cgroup "
                "(tracehound_process_exits_total{reason=~\"error|signal\"}) or job_stalled",
    "gpu.dcgm_inject": "injects into DCGM's cache only; tracehound reads NVML and the kernel "
                       "log, so no tracehound signal can exist: its detection asks "
                       "dcgm-exporter's DCGM_FI_* series through Prometheus, on a node with DCGM",
    "gpu.power_cap, gpu.clock_lock": "need a GPU whose NVML lets root set limits "
                                     "(tests/gpu); seen in tracehound_gpu_power_limit_watts and "
                                     "tracehound_gpu_clock_hertz",
}
STALL_FLAGS = ["--stall-after", "5", "--stall-cgroups", "/tracehound-chaos-.*"]


def tracehound() -> list[str]:
    """The CLI beside this interpreter; else this interpreter's own package
    (`python -m tracehound`, e.g. run from the source tree on PYTHONPATH);
    else whatever `tracehound` is on PATH."""
    exe = os.path.join(os.path.dirname(sys.executable), "tracehound")
    if os.path.exists(exe):
        return [exe]
    if importlib.util.find_spec("tracehound") is not None:
        return [sys.executable, "-m", "tracehound"]
    return [shutil.which("tracehound") or "tracehound"]


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


def start_prometheus(agent_url: str, interval: float, work: str):
    """A real Prometheus scraping the agent every `interval` seconds."""
    sys.path.insert(0, ROOT)
    from tests.prometheus_server import free_port, launch
    from tracehound.clients.prometheus import wait_ready
    target = agent_url.split("//", 1)[1].split("/", 1)[0]
    config = {"global": {"scrape_interval": f"{interval:g}s",
                         "evaluation_interval": f"{interval:g}s"},
              "scrape_configs": [{"job_name": "tracehound", "static_configs":
                                  [{"targets": [target]}]}]}
    port = free_port()
    proc = launch(work, config, port)
    url = f"http://127.0.0.1:{port}"
    wait_ready(url, timeout=60)
    return proc, url


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


def summarize(rows: list[dict]) -> list[dict]:
    out = []
    for key in dict.fromkeys((r["example"], r["probe"]) for r in rows):
        runs = [r for r in rows if (r["example"], r["probe"]) == key]
        mttd = [r["mttd_s"] for r in runs if r["detected"] and r["mttd_s"] is not None]
        out.append({"example": key[0], "probe": key[1], "fault": runs[0]["fault"],
                    "runs": len(runs), "detected": sum(r["detected"] for r in runs),
                    "mttd_median_s": round(statistics.median(mttd), 2) if mttd else None,
                    "mttd_max_s": round(max(mttd), 2) if mttd else None,
                    "signal": runs[0]["signal"], "note": runs[0]["note"],
                    "machine": runs[0].get("machine", "")})
    return out


def markdown(results: dict, interval: float) -> str:
    lines = ["# Detection: does tracehound see the faults it injects, and how fast?", "",
             "Generated by `bench/detection.py` (host) and the VM tier's run of it. Each "
             "example experiment of `examples/` that the machine can run is run several "
             f"times against a real agent (`tracehound run {' '.join(STALL_FLAGS)}`), once "
             f"with the probes reading the agent every {interval:g} s (the luckiest phase of a "
             f"{interval:g} s scrape) and once through a real Prometheus scraping it every "
             f"{interval:g} s. MTTD is from the moment the fault was applied to the first "
             f"reading that showed it; the bar is MTTD <= {2 * interval:g} s (two scrape "
             "intervals). An events probe (`job_stalled`) waits for the agent's "
             "`--stall-after` (5 s here) by design, then for the next reading.", ""]
    for tier, data in results.items():
        how = (f"a real Prometheus scraping the agent every {data['interval_s']:g} s, asked "
               "every second with the fault's PromQL (events probes read the agent)"
               if data.get("prometheus") else
               f"the probes read the agent every {data['interval_s']:g} s")
        mixed = len({s.get("machine", "") for s in data["summary"]}) > 1
        lines += [f"## {tier.removesuffix('-prometheus')}: {data['machine']}", "", how + ".", "",
                  "| fault | probe | detected | MTTD median | MTTD max | signal |"
                  + (" machine |" if mixed else ""),
                  "|---|---|---|---|---|---|" + ("---|" if mixed else "")]
        for s in data["summary"]:
            med = "-" if s["mttd_median_s"] is None else f"{s['mttd_median_s']:.2f} s"
            mx = "-" if s["mttd_max_s"] is None else f"{s['mttd_max_s']:.2f} s"
            lines.append(f"| {s['fault']} | {s['probe']} | {s['detected']}/{s['runs']} | {med} "
                         f"| {mx} | `{s['signal']}` |" + (f" {s['machine']} |" if mixed else ""))
        lines.append("")
    lines += ["## Not run here", ""]
    lines += [f"- **{fault}**: {why}" for fault, why in NOT_RUN.items()]
    return "\n".join(lines) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--interval", type=float, default=5.0)
    ap.add_argument("--tier", choices=tuple(TIERS), default="host")
    ap.add_argument("--only", default="", help="comma-separated example names")
    ap.add_argument("--prometheus", action="store_true",
                    help="ask a real Prometheus scraping the agent every --interval seconds "
                         "(the faults' PromQL) instead of reading the agent")
    ap.add_argument("--json", default="")
    args = ap.parse_args()
    names = [n for n in TIERS[args.tier] if not args.only or n in args.only.split(",")]
    agent = Tool("tracehound", tracehound() + ["run", "--listen", "127.0.0.1:0", *STALL_FLAGS],
                 ready="serving metrics on")
    agent.start()
    url = next(line.split("serving metrics on ", 1)[1].strip() for line in agent.lines
               if "serving metrics on" in line)
    rows: list[dict] = []
    work = tempfile.mkdtemp(prefix="tracehound-detection-")
    prom, prom_url = start_prometheus(url, args.interval, work) if args.prometheus else (None, None)
    try:
        for name in names:
            for i in range(args.runs):
                t0 = time.monotonic()
                got = run_once(url, name, args.interval, work, prom_url,
                               tag=f"{i + 1}-{uuid.uuid4().hex[:6]}")
                rows += got
                print(f"{name} run {i + 1}: " + ", ".join(
                    f"{r['probe']} {'yes' if r['detected'] else 'NO'}"
                    + (f" {r['mttd_s']:.2f}s" if r['detected'] else "") for r in got)
                    + f" ({time.monotonic() - t0:.0f} s)", flush=True)
    finally:
        if prom is not None:
            prom.terminate()
            prom.wait(timeout=30)
        agent.stop()
        shutil.rmtree(work, ignore_errors=True)
    key = args.tier + ("-prometheus" if args.prometheus else "")
    path = args.json or os.path.join(REPORT, f"detection-{key}.json")
    here = machine()
    for r in rows:
        r["machine"] = here
    if args.only and os.path.exists(path):
        # --only reruns some examples: the others keep their rows, each
        # with the machine it ran on
        with open(path) as f:
            old = json.load(f)
        rows = [{"machine": old["machine"], **r} for r in old["rows"]
                if r["example"] not in names] + rows
    machines = list(dict.fromkeys(r["machine"] for r in rows))
    data = {"machine": "; ".join(machines), "interval_s": args.interval, "rows": rows,
            "summary": summarize(rows), "prometheus": args.prometheus}
    with open(path, "w") as f:
        json.dump(data, f, indent=1)
    results = {}
    for tier in TIERS:
        for suffix in ("", "-prometheus"):
            p = os.path.join(REPORT, f"detection-{tier}{suffix}.json")
            if os.path.exists(p):
                with open(p) as f:
                    results[tier + suffix] = json.load(f)
    with open(os.path.join(REPORT, "detection.md"), "w") as f:
        f.write(markdown(results, args.interval))
    missed = [s for s in data["summary"] if s["detected"] < s["runs"]]
    for s in missed:
        print(f"MISSED: {s['example']} {s['probe']}: {s['detected']}/{s['runs']} {s['note']}")
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
