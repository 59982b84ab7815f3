"""scripts/gpu-check's driver, on a machine with an NVIDIA GPU (root):

1. the GPU test tier (`pytest tests/gpu`, junit);
2. the GPU faults of the chaos catalog, end to end against a running agent,
   each with its detection and MTTD (examples/gpu-*.yaml through
   bench/detection/chaos.py's run_once; gpu.xid with the real GPU's bus id):
   bench/gpu/faults.py;
3. what the agent exports for each GPU against `nvidia-smi -q -x`, field by
   field, moving values within a stated tolerance: bench/gpu/smi.py.

It writes bench/report/gpu.md (bench/gpu/report.py: commit, machine, one
table per part and each part's outcome) and exits 1 if any check failed.
The agent both parts read is bench/gpu/agent.py's.

    python -m bench.gpu [--parts tests,faults,smi] [--device 0]
        [--interval 1] [--out bench/report/gpu.md]

scripts/gpu-check sets up the environment and calls this; run that.
"""
from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from collections import Counter

from bench.gpu.agent import Agent, serve_gpu_only
from bench.gpu.faults import part_faults
from bench.gpu.report import (PARTS, ROOT, Part, machine_stamp, markdown, new_part, parse_junit,
                              write_report)
from bench.gpu.smi import check_agent, parse_smi, smi_xml

REPORT = os.path.join(ROOT, "bench", "report", "gpu.md")
PART_NAMES = tuple(name for name, _ in PARTS)
# what the packed image has (scripts/gpu-check --pack fetches the rest)
IMAGE_HAS = ("torch", "cupy", "nvidia-ml-py", "prometheus-client", "pyyaml", "rich", "pytest",
             "requests", "hypothesis", "protobuf")
# test dependencies of tiers the GPU check does not run (the Kubernetes
# manifests' schemas: 22 MB the pack need not carry)
NOT_FOR_GPU = ("kubernetes-validate",)
TESTS_TIMEOUT_S = 300
# What a GPU machine may truly lack, so that a test of it skips there: the
# start of the skip's reason. Any other skip on a machine with a GPU (a
# library the image has, nvidia-smi, root, the GPU itself) is a failure.
HARDWARE_SKIPS = ("no GPU here has NVLink", "no NVLink throughput fields", "no MIG-capable GPU",
                  "NVML gives no per-process utilization")


def missing_dependencies(pyproject_text: str, have=IMAGE_HAS) -> list[str]:
    """pyproject.toml's runtime and test requirements the image lacks, as
    written there (name and version bounds)."""
    try:
        import tomllib
        data = tomllib.loads(pyproject_text)
        project = data.get("project", {})
        reqs = list(project.get("dependencies", []))
        reqs += list(project.get("optional-dependencies", {}).get("test", []))
    except ImportError:     # Python before 3.11: the two lists, read plainly
        reqs = []
        for key in ("dependencies", "test"):
            m = re.search(rf"^{key}\s*=\s*\[(.*?)\]", pyproject_text, re.S | re.M)
            reqs += re.findall(r'"([^"]+)"', m.group(1)) if m else []

    def norm(name: str) -> str:
        return re.sub(r"[-_.]+", "-", name).lower()

    known = {norm(n) for n in (*have, *NOT_FOR_GPU)}
    out = []
    for req in reqs:
        name = re.split(r"[<>=!~\[; ]", req.strip(), maxsplit=1)[0]
        if norm(name) not in known and req not in out:
            out.append(req)
    return out


def unexcused_skips(cases: list[dict]) -> list[dict]:
    """The skipped tests whose reason is not a feature of the GPU this
    machine lacks (HARDWARE_SKIPS)."""
    return [c for c in cases if c["outcome"] == "skipped"
            and not c["detail"].removeprefix("Skipped: ").startswith(HARDWARE_SKIPS)]


def part_tests(work: str, logs: dict) -> Part:
    """Part 1: `pytest tests/gpu`, one row per test from its junit."""
    part = new_part("tests", header=("test", "outcome", "time", "detail"))
    junit = os.path.join(work, "gpu-tests.xml")
    cmd = [sys.executable, "-m", "pytest", "tests/gpu", "-p", "no:cacheprovider", "-q", "-rA",
           f"--junitxml={junit}"]
    part.intro = f"`{' '.join(['python', *cmd[1:-1]])} --junitxml=...` (limit {TESTS_TIMEOUT_S} s)."
    t0 = time.monotonic()
    try:
        res = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True,
                             timeout=TESTS_TIMEOUT_S)
        code, output = res.returncode, res.stdout + res.stderr
    except subprocess.TimeoutExpired as exc:
        code = None
        output = ((exc.stdout or b"").decode(errors="replace") if isinstance(exc.stdout, bytes)
                  else exc.stdout or "")
    took = time.monotonic() - t0
    cases = []
    if os.path.exists(junit):
        with open(junit) as f:
            cases = parse_junit(f.read())
    part.rows = [(c["test"], c["outcome"], f"{c['seconds']:.1f} s", c["detail"]) for c in cases]
    counts = Counter(c["outcome"] for c in cases)
    ran = counts["passed"] + counts["failed"] + counts["error"]
    part.summary = ", ".join(f"{n} {k}" for k, n in sorted(counts.items())) or "no test ran"
    part.summary += f" ({took:.0f} s)"
    if code is None:
        part.notes.append(f"pytest ran past {TESTS_TIMEOUT_S} s and was stopped")
    unexcused = unexcused_skips(cases)
    ok = (code == 0 and ran > 0 and not counts["failed"] and not counts["error"]
          and not unexcused)
    if unexcused:
        part.notes.append("skipped on a machine with a GPU, for what the image or the machine "
                          "should have: " + "; ".join(c["test"] for c in unexcused))
    if code == 0 and ran == 0:
        part.notes.append("every test skipped: on a GPU machine that means the tier could not "
                          "reach the GPU (see the skip reasons)")
    part.outcome = "pass" if ok else "fail"
    if not ok:
        logs["pytest tests/gpu"] = output
    return part


def start_agent(work: str, stamp: dict, logs: dict) -> Agent | None:
    """The agent for parts 2 and 3, said in the stamp; None if it did not start."""
    agent = Agent(work)
    try:
        agent.start()
        loaded, missing = agent.probes()
    except RuntimeError as exc:
        stamp["agent"] = f"did not start: {exc}"
        logs["agent"] = "\n".join(agent.lines[-40:]) or str(exc)
        return None
    except BaseException:
        agent.stop()    # interrupted while it started: leave no agent running
        raise
    stamp["agent"] = (f"{agent.mode} ({agent.gpu_line()}); BPF probes loaded: "
                      f"{', '.join(loaded) or 'none'}; not loaded: "
                      f"{'; '.join(missing) or 'none'}")
    return agent


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.gpu",
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("--parts", default=",".join(PART_NAMES),
                    help=f"comma-separated subset of {','.join(PART_NAMES)}")
    ap.add_argument("--device", type=int, default=0, help="NVML index of the GPU the faults use")
    ap.add_argument("--interval", type=float, default=1.0,
                    help="seconds between the detection probes' readings")
    ap.add_argument("--out", default=REPORT)
    ap.add_argument("--serve-gpu-only", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--state-dir", default="", help=argparse.SUPPRESS)
    ap.add_argument("--missing-deps", metavar="PYPROJECT", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.serve_gpu_only:
        return serve_gpu_only(args.state_dir or tempfile.mkdtemp(prefix="tracehound-state-"))
    if args.missing_deps:
        with open(args.missing_deps) as f:
            print("\n".join(missing_dependencies(f.read())))
        return 0
    wanted = [p.strip() for p in args.parts.split(",") if p.strip()]
    unknown = [p for p in wanted if p not in PART_NAMES]
    if unknown:
        ap.error(f"unknown part(s) {', '.join(unknown)}: choose from {', '.join(PART_NAMES)}")
    # CUDA then numbers GPUs as NVML does: the burn runs on the GPU the agent labels
    os.environ["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"
    os.environ.pop("CUDA_VISIBLE_DEVICES", None)
    started = time.monotonic()
    logs: dict[str, str] = {}
    try:
        smi = parse_smi(smi_xml())
    except (OSError, subprocess.SubprocessError, ET.ParseError) as exc:
        smi = None
        logs["nvidia-smi -q -x"] = str(exc)
    stamp = machine_stamp(smi)
    parts = {name: new_part(name) for name in PART_NAMES}
    work = tempfile.mkdtemp(prefix="tracehound-gpucheck-")
    agent = None
    try:
        if "tests" in wanted:
            print("gpu-check: part 1, pytest tests/gpu", flush=True)
            parts["tests"] = part_tests(work, logs)
        if "faults" in wanted or "smi" in wanted:
            agent = start_agent(work, stamp, logs)
        if "smi" in wanted:
            # before the faults: the GPU idle and as its owner set it
            print("gpu-check: part 3, tracehound against nvidia-smi -q -x", flush=True)
            parts["smi"] = (check_agent(agent) if agent is not None else
                            parts["smi"].fail("no agent to read"))
        if "faults" in wanted:
            print("gpu-check: part 2, GPU faults against the agent", flush=True)
            parts["faults"] = (part_faults(agent, args.device, args.interval, work, logs)
                               if agent is not None else
                               parts["faults"].fail("no agent to detect the faults"))
    finally:
        if agent is not None:
            agent.stop()
        shutil.rmtree(work, ignore_errors=True)
    stamp["took_s"] = time.monotonic() - started
    ordered = [parts[name] for name in PART_NAMES]
    if smi is None:
        parts["smi"].notes.append("nvidia-smi -q -x did not answer at the start")
    write_report(args.out, markdown(stamp, ordered, logs))
    failed = [p for p in ordered if p.outcome == "fail"]
    for p in ordered:
        print(f"gpu-check: part {p.number} {p.title}: {p.outcome}"
              + (f" ({p.summary})" if p.summary else ""))
    print(f"gpu-check: {'FAIL' if failed else 'PASS'} in {stamp['took_s']:.0f} s; "
          f"report {os.path.relpath(args.out, ROOT)}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
