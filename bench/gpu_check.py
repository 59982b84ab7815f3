"""scripts/gpu-check's driver, on a machine with an NVIDIA GPU (root):

1. the GPU test tier (`pytest tests/gpu`, junit);
2. the GPU faults of the chaos catalog, end to end against a running agent,
   each with its detection and MTTD (examples/gpu-*.yaml through
   bench/detection.py's run_once; gpu.xid with the real GPU's bus id);
3. what the agent exports for each GPU against `nvidia-smi -q -x`, field by
   field, moving values within a stated tolerance.

It writes bench/report/gpu.md (commit, machine, one table per part and each
part's outcome) and exits 1 if any check failed.

    python bench/gpu_check.py [--parts tests,faults,smi] [--device 0]
        [--interval 1] [--out bench/report/gpu.md]

scripts/gpu-check sets up the environment and calls this; run that.
"""
from __future__ import annotations

import argparse
import dataclasses
import datetime
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
import xml.etree.ElementTree as ET
from collections import Counter

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
REPORT = os.path.join(HERE, "report", "gpu.md")
PACK = os.path.join(ROOT, ".gpucheck")
MIB = 1 << 20
PARTS = ("tests", "faults", "smi")
# examples run in part 2, in this order (the burn first: its clocks under
# load tell whether the clock lock below means anything)
EXAMPLES = ("gpu-burn", "gpu-memory", "gpu-power-cap", "gpu-clock-lock", "gpu-xid")
FAULTS = ("gpu.burn", "gpu.memory", "gpu.power_cap", "gpu.clock_lock", "gpu.xid")
FAULT_OF = dict(zip(EXAMPLES, FAULTS))
# XID 14: the number NVIDIA keeps for an injected test error (severity info):
# a real GPU's bus id gets a line no drain automation acts on
TEST_XID = 14
# what the packed image has (scripts/gpu-check --pack fetches the rest)
IMAGE_HAS = ("torch", "cupy", "nvidia-ml-py", "prometheus-client", "pyyaml", "rich", "pytest",
             "requests", "hypothesis", "protobuf")
TESTS_TIMEOUT_S = 300
AGENT_READY_S = 90


# --------------------------------------------------------------------------
# nvidia-smi -q -x

def _number(text: str | None) -> float | None:
    """'34 C', '72.31 W', '81559 MiB', '0' -> float; 'N/A', '', None -> None."""
    if text is None:
        return None
    m = re.match(r"\s*(-?\d+(?:\.\d+)?)", text)
    return float(m.group(1)) if m else None


def _find_number(el, *paths) -> float | None:
    """The first of `paths` (ElementTree paths under el) holding a number."""
    for p in paths:
        for found in el.iterfind(p):
            v = _number(found.text)
            if v is not None:
                return v
    return None


def normalize_bus_id(text: str) -> str:
    """'00000000:18:00.0' (nvidia-smi, NVML) -> '0000:18:00.0' (sysfs, tracehound)."""
    text = (text or "").strip().lower()
    domain, sep, rest = text.partition(":")
    if sep and rest.count(":") == 1:
        return f"{domain.lstrip('0').rjust(4, '0')}:{rest}"
    return text


def _ecc_counts(gpu_el, scope: str) -> tuple[float, float] | None:
    """(corrected, uncorrected) of ecc_errors/<scope>, or None where N/A.

    Old drivers give single_bit/double_bit totals; newer ones SRAM and DRAM
    apart, and R550+ splits SRAM uncorrectable into parity and SEC-DED."""
    node = gpu_el.find(f"ecc_errors/{scope}")
    if node is None:
        return None
    if node.find("single_bit") is not None:
        corr = _number(node.findtext("single_bit/total"))
        unc = _number(node.findtext("double_bit/total"))
        return None if corr is None or unc is None else (corr, unc)
    corrected = uncorrected = 0.0
    seen = False
    for child in node:
        tag = child.tag
        if not tag.startswith(("sram_", "dram_")) or "threshold" in tag:
            continue
        v = _number(child.text)
        if v is None:
            return None
        seen = True
        if tag.endswith("_correctable"):
            corrected += v
        elif "_uncorrectable" in tag:
            uncorrected += v
    return (corrected, uncorrected) if seen else None


def parse_smi(xml_text: str) -> dict:
    """`nvidia-smi -q -x` -> {"driver_version", "cuda_version", "gpus": {uuid: fields}};
    fields in base units (bytes, watts, hertz, degrees C), None where N/A."""
    root = ET.fromstring(xml_text)
    driver = (root.findtext("driver_version") or "").strip()
    out = {"driver_version": driver, "cuda_version": (root.findtext("cuda_version") or "").strip(),
           "gpus": {}}
    for g in root.findall("gpu"):
        uuid = (g.findtext("uuid") or "").strip()
        bus = g.findtext("pci/pci_bus_id") or g.get("id") or ""
        mem = lambda tag: _number(g.findtext(f"fb_memory_usage/{tag}"))  # noqa: E731
        mib = {t: mem(t) for t in ("total", "used", "reserved")}
        power = ("gpu_power_readings", "power_readings")
        ecc_mode = (g.findtext("ecc_mode/current_ecc") or g.findtext("ecc_mode/current")
                    or "").strip()
        fields = {
            "name": (g.findtext("product_name") or "").strip(),
            "pci_bus_id": normalize_bus_id(bus),
            "driver_version": driver,
            "memory_total_bytes": None if mib["total"] is None else mib["total"] * MIB,
            "memory_used_bytes": None if mib["used"] is None else mib["used"] * MIB,
            "memory_reserved_bytes": (mib["reserved"] or 0.0) * MIB,
            "temperature_gpu_c": _number(g.findtext("temperature/gpu_temp")),
            "temperature_memory_c": _number(g.findtext("temperature/memory_temp")),
            # NVML's power usage is the one-second average on Ampere and later
            # (instantaneous before): average first, where nvidia-smi splits them
            "power_draw_w": _find_number(g, *(f"{p}/{t}" for t in (
                "average_power_draw", "power_draw", "instant_power_draw") for p in power)),
            "power_limit_w": _find_number(g, *(f"{p}//{t}" for t in (
                "current_power_limit", "enforced_power_limit", "power_limit") for p in power)),
            "clock_sm_hz": _scale(_number(g.findtext("clocks/sm_clock")), 1e6),
            "clock_memory_hz": _scale(_number(g.findtext("clocks/mem_clock")), 1e6),
            "ecc_mode": ecc_mode or "N/A",
            "mig_mode": (g.findtext("mig_mode/current_mig") or "N/A").strip(),
        }
        for scope in ("volatile", "aggregate"):
            counts = _ecc_counts(g, scope) if ecc_mode == "Enabled" else None
            fields[f"ecc_{scope}_corrected"] = None if counts is None else counts[0]
            fields[f"ecc_{scope}_uncorrected"] = None if counts is None else counts[1]
        out["gpus"][uuid] = fields
    return out


def _scale(v: float | None, k: float) -> float | None:
    return None if v is None else v * k


# --------------------------------------------------------------------------
# what the agent exports

def parse_exposition(text: str) -> dict:
    """Prometheus text of the agent -> {uuid: fields} for every GPU it names
    in tracehound_gpu_info, fields keyed as parse_smi's."""
    from prometheus_client.parser import text_string_to_metric_families

    samples = [(s.name, s.labels, s.value) for fam in text_string_to_metric_families(text)
               for s in fam.samples if s.name.startswith("tracehound_gpu")]
    gpus: dict[str, dict] = {}
    for name, lbl, _ in samples:
        if name == "tracehound_gpu_info":
            gpus[lbl["uuid"]] = {"index": lbl.get("gpu", ""), "name": lbl.get("model", ""),
                                 "pci_bus_id": lbl.get("pci_bus_id", ""),
                                 "driver_version": lbl.get("driver_version", ""),
                                 "ecc_mode": "Disabled"}
    simple = {"tracehound_gpu_memory_total_bytes": "memory_total_bytes",
              "tracehound_gpu_memory_used_bytes": "memory_used_bytes",
              "tracehound_gpu_power_watts": "power_draw_w",
              "tracehound_gpu_power_limit_watts": "power_limit_w"}
    for name, lbl, v in samples:
        g = gpus.get(lbl.get("uuid"))
        if g is None:
            continue
        if name in simple:
            g[simple[name]] = v
        elif name == "tracehound_gpu_temperature_celsius":
            g[f"temperature_{lbl.get('sensor')}_c"] = v
        elif name == "tracehound_gpu_clock_hertz":
            g[f"clock_{lbl.get('clock')}_hz"] = v
        elif name == "tracehound_gpu_ecc_errors_total":
            # NVML answers ECC counters only where ECC is on
            g["ecc_mode"] = "Enabled"
            g[f"ecc_{lbl.get('scope')}_{lbl.get('type')}"] = v
        elif name == "tracehound_gpu_lost":
            g["lost"] = v
    return gpus


@dataclasses.dataclass(frozen=True)
class Field:
    key: str
    label: str
    unit: str = ""          # how values print: "MiB", "W", "MHz", "C", "" (as is)
    tolerance: object = 0   # number (absolute, base units), or f(smi fields) -> number
    moving: bool = False
    exact: bool = False     # text compared as is
    tol_text: str = ""

    def tol(self, smi: dict) -> float:
        return self.tolerance(smi) if callable(self.tolerance) else float(self.tolerance)


FIELDS = (
    Field("name", "name", exact=True, tol_text="same text"),
    Field("pci_bus_id", "PCI bus id", exact=True, tol_text="same text"),
    Field("driver_version", "driver version", exact=True, tol_text="same text"),
    Field("memory_total_bytes", "memory total", "MiB", MIB, tol_text="1 MiB"),
    # NVML's v1 "used" counts the driver's reservation; nvidia-smi shows it apart
    Field("memory_used_bytes", "memory used", "MiB",
          lambda s: (s.get("memory_reserved_bytes") or 0.0) + 64 * MIB, moving=True,
          tol_text="reserved + 64 MiB"),
    Field("temperature_gpu_c", "temperature (GPU)", "C", 3, moving=True, tol_text="3 C"),
    Field("temperature_memory_c", "temperature (memory)", "C", 3, moving=True, tol_text="3 C"),
    Field("power_draw_w", "power draw", "W",
          lambda s: max(25.0, 0.15 * (s.get("power_draw_w") or 0.0)), moving=True,
          tol_text="max(25 W, 15%)"),
    Field("power_limit_w", "power limit", "W", 1.0, tol_text="1 W"),
    Field("clock_sm_hz", "SM clock", "MHz",
          lambda s: max(150e6, 0.15 * (s.get("clock_sm_hz") or 0.0)), moving=True,
          tol_text="max(150 MHz, 15%)"),
    Field("clock_memory_hz", "memory clock", "MHz",
          lambda s: max(50e6, 0.05 * (s.get("clock_memory_hz") or 0.0)), moving=True,
          tol_text="max(50 MHz, 5%)"),
    Field("ecc_mode", "ECC mode", exact=True,
          tol_text="Enabled when the agent exports ECC counters"),
    Field("ecc_volatile_corrected", "ECC corrected (volatile)", moving=True, tol_text="exact"),
    Field("ecc_volatile_uncorrected", "ECC uncorrected (volatile)", moving=True,
          tol_text="exact"),
    Field("ecc_aggregate_corrected", "ECC corrected (aggregate)", moving=True, tol_text="exact"),
    Field("ecc_aggregate_uncorrected", "ECC uncorrected (aggregate)", moving=True,
          tol_text="exact"),
)


def fmt(value, unit: str = "") -> str:
    if value is None:
        return "-"
    if isinstance(value, str):
        return value or "-"
    scale = {"MiB": MIB, "MHz": 1e6}.get(unit, 1)
    v = value / scale
    text = f"{v:.0f}" if unit in ("MiB", "MHz") or float(v).is_integer() else f"{v:.2f}"
    return f"{text} {unit}".strip()


def _fmt_tol(tol: float, unit: str) -> str:
    return fmt(tol, unit) if unit else f"{tol:g}"


def compare(reads: list[dict], smi: dict) -> list[dict]:
    """One row per GPU and field: the agent's value(s), nvidia-smi's, the
    tolerance and whether they agree ("yes", "no", or "n/a" where nvidia-smi
    has no value and the agent none either).

    `reads` are the agent's exports (parse_exposition) taken just before and
    just after nvidia-smi ran: a moving value agrees when nvidia-smi's lies
    within the span of the agent's readings, widened by the tolerance."""
    rows = []
    smi_gpus = smi["gpus"]
    uuids = list(dict.fromkeys([*smi_gpus, *(u for r in reads for u in r)]))
    for uuid in uuids:
        have = [r[uuid] for r in reads if uuid in r]
        theirs = smi_gpus.get(uuid)
        index = have[0].get("index", "?") if have else "?"
        if not have or theirs is None:
            rows.append({"gpu": index, "uuid": uuid, "field": "listed", "tracehound":
                         "yes" if have else "no", "nvidia_smi": "yes" if theirs else "no",
                         "tolerance": "both list it", "agree": "no"})
            continue
        rows.append({"gpu": index, "uuid": uuid, "field": "UUID", "tracehound": uuid,
                     "nvidia_smi": uuid, "tolerance": "same text", "agree": "yes"})
        if any(r.get("lost") for r in have):
            rows.append({"gpu": index, "uuid": uuid, "field": "lost", "tracehound": "1",
                         "nvidia_smi": "-", "tolerance": "0", "agree": "no"})
        for f in FIELDS:
            rows.append(_compare_field(f, index, uuid, [r.get(f.key) for r in have], theirs))
    return rows


def _compare_field(f: Field, index, uuid, ours: list, theirs: dict) -> dict:
    ref = theirs.get(f.key)
    row = {"gpu": index, "uuid": uuid, "field": f.label, "nvidia_smi": fmt(ref, f.unit),
           "tolerance": f.tol_text}
    values = [v for v in ours if v is not None]
    if f.exact:
        mine = values[0] if values else None
        row["tracehound"] = fmt(mine)
        if f.key == "ecc_mode" and ref in ("N/A", "Disabled"):
            row["agree"] = "yes" if mine == "Disabled" else "no"
        else:
            row["agree"] = "yes" if mine is not None and mine == ref else "no"
        return row
    if not values:
        row["tracehound"] = "-"
        row["agree"] = "n/a" if ref is None else "no"
        return row
    low, high = min(values), max(values)
    row["tracehound"] = fmt(low, f.unit) if low == high or not f.moving else \
        f"{fmt(low, f.unit)} .. {fmt(high, f.unit)}"
    if ref is None:
        row["agree"] = "n/a"
        return row
    tol = f.tol(theirs)
    row["tolerance"] = f"{f.tol_text} ({_fmt_tol(tol, f.unit)})" if callable(f.tolerance) \
        else f.tol_text
    row["agree"] = "yes" if low - tol <= ref <= high + tol else "no"
    return row


# --------------------------------------------------------------------------
# the test tier's junit

def parse_junit(xml_text: str) -> list[dict]:
    """[{test, outcome (passed|failed|error|skipped), seconds, detail}]"""
    rows = []
    root = ET.fromstring(xml_text)
    for case in root.iter("testcase"):
        outcome, detail = "passed", ""
        for tag in ("failure", "error", "skipped"):
            el = case.find(tag)
            if el is not None:
                outcome = {"failure": "failed"}.get(tag, tag)
                detail = (el.get("message") or el.text or "").strip()
                break
        cls = case.get("classname", "")
        module = cls.rsplit(".", 1)[-1] if cls else ""
        rows.append({"test": f"{module}::{case.get('name', '')}" if module else case.get("name"),
                     "outcome": outcome, "seconds": float(case.get("time") or 0.0),
                     "detail": _one_line(detail)})
    return rows


def _one_line(text: str, limit: int = 160) -> str:
    text = " ".join((text or "").split())
    return text if len(text) <= limit else text[:limit - 3] + "..."


# --------------------------------------------------------------------------
# choices for the faults on the GPU at hand

def pick_power_cap(current_mw: int, low_mw: int, high_mw: int) -> tuple[int, str]:
    """(watts, note): a whole number of watts about 20% under the limit in
    force, inside the GPU's own range (the example's variable takes integers)."""
    want = max(low_mw, int(current_mw * 0.8))
    watts = math.ceil(want / 1000)
    if watts * 1000 > high_mw:
        watts = high_mw // 1000
    note = f"power limit {current_mw / 1000:g} W, range {low_mw / 1000:g}..{high_mw / 1000:g} W"
    if watts * 1000 >= current_mw:
        note += ": already at its floor, the cap cannot lower it (detection is trivially true)"
    return watts, note


def pick_clock_lock(supported_mhz) -> tuple[int, int] | None:
    """(min, max) MHz: from the lowest supported graphics clock up to the
    supported clock nearest 55% of the highest, so a loaded GPU must clock
    down to honour it. None without a list."""
    clocks = sorted({int(c) for c in supported_mhz or () if c})
    if not clocks:
        return None
    target = 0.55 * clocks[-1]
    top = min(clocks, key=lambda c: (abs(c - target), c))
    return clocks[0], max(top, clocks[0])


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

    known = {norm(n) for n in have}
    out = []
    for req in reqs:
        name = re.split(r"[<>=!~\[; ]", req.strip(), maxsplit=1)[0]
        if norm(name) not in known and req not in out:
            out.append(req)
    return out


# --------------------------------------------------------------------------
# the report

@dataclasses.dataclass
class Part:
    number: int
    title: str
    intro: str = ""
    header: tuple = ()
    rows: list = dataclasses.field(default_factory=list)     # lists of cells
    outcome: str = "not run"    # pass | fail | not run
    summary: str = ""
    notes: list = dataclasses.field(default_factory=list)
    extra: list = dataclasses.field(default_factory=list)    # more markdown lines


def _cell(text) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def table(header, rows) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(_cell(c) for c in row) + " |" for row in rows]
    return lines


def markdown(stamp: dict, parts: list[Part], logs: dict | None = None) -> str:
    failed = [p for p in parts if p.outcome == "fail"]
    lines = ["# GPU check", "",
             f"Generated by `scripts/gpu-check` (`bench/gpu_check.py`) on {stamp['date']}, "
             f"in {stamp['took_s']:.0f} s.", "",
             f"- commit: {stamp['commit']}",
             f"- GPU: {stamp['gpus']}",
             f"- driver: {stamp['driver']}",
             f"- kernel: {stamp['kernel']}",
             f"- CPUs: {stamp['cpus']}",
             f"- Python: {stamp['python']}",
             f"- agent: {stamp['agent']}", "",
             f"**Outcome: {'FAIL' if failed else 'PASS'}**"
             + (f" ({', '.join(f'part {p.number}' for p in failed)} failed)" if failed else ""),
             ""]
    lines += table(("part", "outcome", "checks"),
                   [(f"{p.number}. {p.title}", p.outcome, p.summary) for p in parts])
    lines.append("")
    for p in parts:
        lines += [f"## {p.number}. {p.title}: {p.outcome}", ""]
        if p.intro:
            lines += [p.intro, ""]
        if p.rows:
            lines += table(p.header, p.rows) + [""]
        lines += p.extra
        if p.extra:
            lines.append("")
        lines += [f"- {n}" for n in p.notes]
        if p.notes:
            lines.append("")
    if logs:
        lines += ["## Output of what failed", ""]
        for title, text in logs.items():
            lines += [f"### {title}", "", "```", text.rstrip()[-3000:], "```", ""]
    return "\n".join(lines).rstrip() + "\n"


def write_report(path: str, text: str) -> None:
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, path)


def commit() -> str:
    try:
        sha = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short=12", "HEAD"],
                             capture_output=True, text=True, timeout=10, check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", ROOT, "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=30).stdout.strip()
        return sha + (" (with uncommitted changes)" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        pass
    try:        # a copy of the tree without .git: what --pack recorded
        with open(os.path.join(PACK, "COMMIT")) as f:
            return f.read().strip() + " (recorded by --pack)"
    except OSError:
        return "unknown (no git, no .gpucheck/COMMIT)"


def machine_stamp(smi: dict | None) -> dict:
    gpus = Counter(g["name"] for g in (smi or {}).get("gpus", {}).values())
    cpu = ""
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next((line.split(":", 1)[1].strip() for line in f
                        if line.startswith("model name")), "")
    except OSError:
        pass
    driver = (smi or {}).get("driver_version") or "unknown"
    if (smi or {}).get("cuda_version"):
        driver += f" (CUDA {smi['cuda_version']})"
    return {"date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
            "commit": commit(),
            "gpus": ", ".join(f"{n} x {name}" for name, n in gpus.items()) or "unknown",
            "driver": driver, "kernel": os.uname().release,
            "cpus": f"{os.cpu_count()}" + (f" ({cpu})" if cpu else ""),
            "python": f"{sys.executable} {sys.version.split()[0]}, "
                      + os.environ.get("TRACEHOUND_GPUCHECK_ENV", "as started"),
            "agent": "not started", "took_s": 0.0}


# --------------------------------------------------------------------------
# the agent

def tracehound_cmd() -> list[str]:
    sys.path.insert(0, HERE)
    from detection import tracehound
    return tracehound()


class Agent:
    """A tracehound agent on a free port: `tracehound run`, or where that
    will not start (no libbpf, no BTF, a kernel that refuses BPF), the same
    Agent with only the subsystems that need no BPF (gpu among them)."""

    def __init__(self, work: str):
        self.work = work
        self.proc: subprocess.Popen | None = None
        self.lines: list[str] = []
        self.url = ""
        self.mode = ""
        self.refused = ""

    def start(self) -> None:
        state = os.path.join(self.work, "agent-state")
        os.makedirs(state, exist_ok=True)
        full = tracehound_cmd() + ["run", "--listen", "127.0.0.1:0", "--state-dir", state]
        why = self._launch(full)
        if not why:
            self.mode = "tracehound run"
            return
        self.refused = why
        gpu_only = [sys.executable, os.path.abspath(__file__), "--serve-gpu-only",
                    "--state-dir", state]
        why2 = self._launch(gpu_only)
        if why2:
            raise RuntimeError(f"`tracehound run` did not start ({why}); the GPU-only agent "
                               f"did not either ({why2})")
        self.mode = "GPU-only agent (no BPF subsystems)"

    def _launch(self, cmd: list[str]) -> str:
        """"" once it serves, else why not (its last lines)."""
        self.lines = []
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     text=True, start_new_session=True, cwd=ROOT)
        threading.Thread(target=self._drain, args=(self.proc, self.lines), daemon=True).start()
        deadline = time.monotonic() + AGENT_READY_S
        while time.monotonic() < deadline:
            m = next((re.search(r"serving metrics on (\S+)", line) for line in self.lines
                      if "serving metrics on" in line), None)
            if m:
                self.url = m.group(1)
                # the status lines follow at once; let them arrive
                n = -1
                while n != len(self.lines):
                    n = len(self.lines)
                    time.sleep(0.5)
                return ""
            if self.proc.poll() is not None:
                time.sleep(0.2)
                return f"exited {self.proc.returncode}: " + _one_line(
                    " / ".join(self.lines[-4:]), 400)
            time.sleep(0.1)
        self.stop()
        return f"not serving after {AGENT_READY_S} s: " + _one_line(" / ".join(self.lines[-4:]))

    @staticmethod
    def _drain(proc, lines: list) -> None:
        for line in proc.stdout:
            lines.append(line.rstrip("\n"))

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()

    def scrape(self) -> str:
        with urllib.request.urlopen(self.url, timeout=10) as r:
            return r.read().decode()

    def gpu_line(self) -> str:
        """What the agent's gpu subsystem said at start-up."""
        return next((line.split("tracehound: ", 1)[-1] for line in self.lines
                     if line.startswith("tracehound: gpu: ")), "gpu: said nothing")

    def probes(self) -> tuple[list[str], list[str]]:
        """(probes loaded, as "name (mode)"; what did not load, with why)."""
        loaded = []
        try:
            from prometheus_client.parser import text_string_to_metric_families
            for fam in text_string_to_metric_families(self.scrape()):
                loaded += [f"{s.labels['probe']} ({s.labels['mode']})" for s in fam.samples
                           if s.name == "tracehound_probe_info"]
        except (OSError, ValueError):
            pass
        missing = [line.split("tracehound: ", 1)[-1] for line in self.lines
                   if "not available" in line or "not hooked" in line or "no TCP counters" in line]
        if self.refused:
            missing.insert(0, "every BPF probe: `tracehound run` refused to start "
                              f"({self.refused})")
        return loaded, missing


def serve_gpu_only(state_dir: str, listen: str = "127.0.0.1:0") -> int:
    """The agent with the subsystems that need no BPF, until SIGTERM."""
    from tracehound.agent import Agent as TracehoundAgent
    from tracehound.config import AgentConfig
    from tracehound.subsystems import SUBSYSTEMS

    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    os.makedirs(state_dir, exist_ok=True)
    subsystems = tuple(s for s in SUBSYSTEMS if not s.needs_bpf)
    agent = TracehoundAgent(AgentConfig(listen=listen, state_dir=state_dir),
                            subsystems=subsystems, stop=stop).start()
    try:
        print(f"tracehound: serving metrics on {agent.exporter.url}", flush=True)
        print(f"tracehound: subsystems {', '.join(s.name for s in subsystems)} only", flush=True)
        for s in agent.subsystems:
            for line in s.status_lines():
                print(f"tracehound: {line}", flush=True)
        stop.wait()
    finally:
        agent.stop()
    return 0


# --------------------------------------------------------------------------
# part 1: the GPU test tier

def part_tests(work: str, logs: dict) -> Part:
    part = Part(1, "GPU test tier (`pytest tests/gpu`)",
                header=("test", "outcome", "time", "detail"))
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
    ok = code == 0 and ran > 0 and not counts["failed"] and not counts["error"]
    if code == 0 and ran == 0:
        part.notes.append("every test skipped: on a GPU machine that means the tier could not "
                          "reach the GPU (see the skip reasons)")
    part.outcome = "pass" if ok else "fail"
    if not ok:
        logs["pytest tests/gpu"] = output[-3000:]
    return part


# --------------------------------------------------------------------------
# part 2: the GPU faults

def gpu_settings(device: int) -> dict:
    """What the faults need from NVML about GPU `device`: bus id, power
    limits, supported clocks, processes and memory in use."""
    import pynvml as nv
    from tracehound.host.topology import normalize_pci_bus_id

    nv.nvmlInit()
    try:
        h = nv.nvmlDeviceGetHandleByIndex(device)
        out = {"bus_id": normalize_pci_bus_id(nv.nvmlDeviceGetPciInfo(h).busId)}
        try:
            low, high = nv.nvmlDeviceGetPowerManagementLimitConstraints(h)
            out["power"] = (int(nv.nvmlDeviceGetPowerManagementLimit(h)), int(low), int(high))
        except nv.NVMLError as exc:
            out["power_error"] = str(exc)
        try:
            clocks = set()
            for m in nv.nvmlDeviceGetSupportedMemoryClocks(h):
                clocks.update(nv.nvmlDeviceGetSupportedGraphicsClocks(h, m))
            out["graphics_clocks"] = sorted(clocks)
        except nv.NVMLError as exc:
            out["clock_error"] = str(exc)
        out["memory_used"] = int(nv.nvmlDeviceGetMemoryInfo(h).used)
        try:
            out["processes"] = len(nv.nvmlDeviceGetComputeRunningProcesses(h))
        except nv.NVMLError:
            out["processes"] = None
        return out
    finally:
        nv.nvmlShutdown()


def fault_env(device: int, settings: dict, notes: list) -> dict:
    env = {"CHAOS_GPU": str(device), "CHAOS_GPU_PCI": settings["bus_id"],
           "CHAOS_XID": str(TEST_XID), "CHAOS_BURN_SECONDS": "45",
           "CHAOS_GPU_MEMORY_FRACTION": "0.9", "CHAOS_GPU_MEMORY_SECONDS": "60"}
    notes.append(f"GPU {device}, bus id {settings['bus_id']} (NVML): gpu.xid writes XID "
                 f"{TEST_XID} (NVIDIA's injected test error, severity info) for it")
    if "power" in settings:
        watts, note = pick_power_cap(*settings["power"])
        env["CHAOS_GPU_WATTS"] = str(watts)
        notes.append(f"gpu.power_cap to {watts} W ({note})")
    else:
        notes.append(f"power limits unreadable ({settings.get('power_error')}): gpu.power_cap "
                     "runs with the example's default")
    lock = pick_clock_lock(settings.get("graphics_clocks"))
    if lock:
        env["CHAOS_GPU_MIN_MHZ"], env["CHAOS_GPU_MAX_MHZ"] = str(lock[0]), str(lock[1])
        notes.append(f"gpu.clock_lock to {lock[0]}..{lock[1]} MHz (supported graphics clocks "
                     f"{settings['graphics_clocks'][0]}..{settings['graphics_clocks'][-1]} MHz)")
    else:
        notes.append(f"supported clocks unreadable ({settings.get('clock_error')}): "
                     "gpu.clock_lock runs with the example's default")
    return env


class Sampler:
    """Reads the agent every second while the faults run: what it showed
    for one GPU (utilization, SM clock, memory used, power limit)."""
    KEYS = {"tracehound_gpu_utilization_ratio": ("util", {"engine": "gpu"}),
            "tracehound_gpu_clock_hertz": ("sm", {"clock": "sm"}),
            "tracehound_gpu_memory_used_bytes": ("mem", {}),
            "tracehound_gpu_power_limit_watts": ("limit", {}),
            "tracehound_gpu_power_watts": ("power", {})}

    def __init__(self, agent: Agent, device: int):
        self.agent, self.device = agent, str(device)
        self.points: list[tuple[float, dict]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self):
        self._thread.start()
        return self

    def stop(self):
        self._stop.set()
        self._thread.join(10)

    def _run(self):
        from prometheus_client.parser import text_string_to_metric_families
        while not self._stop.is_set():
            try:
                got = {}
                for fam in text_string_to_metric_families(self.agent.scrape()):
                    for s in fam.samples:
                        key = self.KEYS.get(s.name)
                        if key and s.labels.get("gpu") == self.device and all(
                                s.labels.get(k) == v for k, v in key[1].items()):
                            got[key[0]] = s.value
                self.points.append((time.monotonic(), got))
            except (OSError, ValueError):
                pass
            self._stop.wait(1.0)

    def span(self, t0: float, t1: float, key: str) -> tuple[float, float] | None:
        vals = [p[key] for t, p in self.points if t0 <= t <= t1 and key in p]
        return (min(vals), max(vals)) if vals else None


def _span_text(span, unit: str, scale: float = 1.0) -> str:
    if span is None:
        return "-"
    lo, hi = (v / scale for v in span)
    f = (lambda v: f"{v:.0f}") if scale != 1.0 or unit == "%" else (lambda v: f"{v:g}")
    return f"{f(lo)} {unit}" if f(lo) == f(hi) else f"{f(lo)}..{f(hi)} {unit}"


def part_faults(agent: Agent, device: int, interval: float, work: str, logs: dict) -> Part:
    sys.path.insert(0, HERE)
    import detection

    part = Part(2, "GPU faults against a running agent",
                header=("fault", "example", "detection probe", "detected", "MTTD", "signal",
                        "outcome"))
    part.intro = (f"Each example of `examples/` runs once through `tracehound chaos run` against "
                  f"the agent ({agent.mode}); its detection probes read the agent every "
                  f"{interval:g} s. MTTD is from the moment the fault was applied to the first "
                  "reading that showed it. A fault passes when every tracehound detection "
                  "probe of its example saw it.")
    try:
        settings = gpu_settings(device)
    except Exception as exc:    # noqa: BLE001 - the report says it, the part fails
        part.outcome, part.summary = "fail", f"NVML could not describe GPU {device}: {exc}"
        return part
    env = fault_env(device, settings, part.notes)
    sampler = Sampler(agent, device).start()
    windows, seen = [], set()
    try:
        for name in EXAMPLES:
            t0 = time.monotonic()
            try:
                rows = detection.run_once(agent.url, name, interval, work,
                                          tag=f"gpucheck-{os.getpid()}", env=env)
                error = ""
            except Exception as exc:    # noqa: BLE001 - a failed run is a failed check
                rows, error = [], str(exc)
            windows.append((name, t0, time.monotonic()))
            log = os.path.join(work, f"{name}.log")
            for r in rows:
                seen.add(r["fault"])
                mttd = f"{r['mttd_s']:.2f} s" if r["detected"] and r["mttd_s"] is not None else "-"
                part.rows.append((r["fault"], f"{name}.yaml", r["probe"],
                                  "yes" if r["detected"] else "NO", mttd, f"`{r['signal']}`",
                                  "pass" if r["detected"] else "fail"))
            if error or not rows or not all(r["detected"] for r in rows):
                text = error
                if os.path.exists(log):
                    with open(log) as f:
                        text = f.read()
                logs[f"chaos run {name}.yaml"] = text[-3000:]
                if not rows:
                    part.rows.append((FAULT_OF[name], f"{name}.yaml", "-", "NO", "-", "-",
                                      "fail: " + why_not_run(text)))
            print(f"gpu-check: {name}: " + (", ".join(
                f"{r['probe']} {'yes' if r['detected'] else 'NO'}"
                + (f" {r['mttd_s']:.2f}s" if r["detected"] and r["mttd_s"] is not None else "")
                for r in rows) or "failed") + f" ({time.monotonic() - t0:.0f} s)", flush=True)
    finally:
        sampler.stop()
    # what the agent showed while each example ran
    obs = []
    for name, t0, t1 in windows:
        obs.append((f"{name}.yaml", _span_text(_scale_span(sampler.span(t0, t1, "util"), 100), "%"),
                    _span_text(sampler.span(t0, t1, "sm"), "MHz", 1e6),
                    _span_text(sampler.span(t0, t1, "mem"), "MiB", MIB),
                    _span_text(sampler.span(t0, t1, "limit"), "W"),
                    _span_text(sampler.span(t0, t1, "power"), "W")))
    part.extra += [f"What the agent showed for GPU {device} while each example ran (read every "
                   "second):", ""]
    part.extra += table(("example", "utilization", "SM clock", "memory used", "power limit",
                         "power"), obs)
    burn = next(((t0, t1) for n, t0, t1 in windows if n == "gpu-burn"), None)
    if burn and env.get("CHAOS_GPU_MAX_MHZ"):
        loaded = sampler.span(*burn, "sm")
        cap = float(env["CHAOS_GPU_MAX_MHZ"]) * 1e6
        if loaded is None or loaded[1] <= cap:
            part.notes.append("the SM clock under gpu.burn alone never rose above the clock "
                              "lock's maximum: the clock-lock detection says little here")
    # the rollbacks left the GPU as found
    checks = []
    try:
        # a killed process's context goes a moment after it does
        deadline = time.monotonic() + 15
        while True:
            after = gpu_settings(device)
            if time.monotonic() > deadline or (
                    after["memory_used"] <= settings["memory_used"] + 1024 * MIB
                    and (after.get("processes") or 0) <= (settings.get("processes") or 0)):
                break
            time.sleep(1)
        if "power" in settings and "power" in after:
            b, a = settings["power"][0], after["power"][0]
            checks.append(("power limit back after gpu.power_cap", f"{b / 1000:g} W",
                           f"{a / 1000:g} W", "yes" if abs(a - b) <= 1000 else "no"))
        b, a = settings["memory_used"], after["memory_used"]
        checks.append(("memory freed after gpu.memory and gpu.burn", fmt(b, "MiB"),
                       fmt(a, "MiB"), "yes" if a <= b + 1024 * MIB else "no"))
        if settings.get("processes") is not None and after.get("processes") is not None:
            checks.append(("no fault process left on the GPU", str(settings["processes"]),
                           str(after["processes"]),
                           "yes" if after["processes"] <= settings["processes"] else "no"))
    except Exception as exc:    # noqa: BLE001
        checks.append(("NVML after the faults", "-", str(exc), "no"))
    part.extra += ["", "After the rollbacks (NVML, before and after part 2):", ""]
    part.extra += table(("check", "before", "after", "agree"), checks)
    missing = [f for f in FAULTS if f not in seen]
    for f in missing:
        part.notes.append(f"{f}: no detection row came back (see the output below)")
    failed = [r for r in part.rows if r[-1] != "pass"] + [c for c in checks if c[-1] != "yes"]
    part.outcome = "fail" if failed or missing else "pass"
    detected = sum(1 for r in part.rows if r[-1] == "pass")
    part.summary = (f"{detected}/{len(part.rows)} detection probes saw their fault, "
                    f"{len(FAULTS) - len(missing)}/{len(FAULTS)} faults ran; "
                    f"rollback checks {sum(c[-1] == 'yes' for c in checks)}/{len(checks)}")
    return part


def why_not_run(output: str) -> str:
    """The line of `tracehound chaos run`'s output that says why it stopped."""
    lines = [ln.strip() for ln in output.splitlines() if ln.strip()]
    useful = [ln for ln in lines if not ln.endswith("nothing was run")
              and not ln.startswith(("Traceback", "File "))]
    line = (useful or lines or ["no detection probe ran"])[-1]
    # "/tmp/.../gpu-burn.json: burn-the-gpu: gpu.burn is not available here: ..."
    line = re.sub(r"^/\S+\.json: ", "", line)
    return _one_line(line)


def _scale_span(span, k):
    return None if span is None else (span[0] * k, span[1] * k)


# --------------------------------------------------------------------------
# part 3: the agent against nvidia-smi

def smi_xml() -> str:
    return subprocess.run(["nvidia-smi", "-q", "-x"], capture_output=True, text=True,
                          timeout=60, check=True).stdout


def part_smi(reads: list[dict], smi: dict) -> Part:
    part = Part(3, "tracehound against `nvidia-smi -q -x`",
                header=("GPU", "field", "tracehound", "nvidia-smi", "tolerance", "agree"))
    part.intro = ("The agent's /metrics read just before and just after `nvidia-smi -q -x` "
                  "(parsed with the standard library). A moving value agrees when nvidia-smi's "
                  "lies within the span of the two readings widened by the tolerance; n/a: "
                  "nvidia-smi shows no value (N/A) and the agent exports none.")
    rows = compare(reads, smi)
    part.rows = [(r["gpu"], r["field"], r["tracehound"], r["nvidia_smi"], r["tolerance"],
                  r["agree"]) for r in rows]
    counts = Counter(r["agree"] for r in rows)
    ok = rows and not counts["no"] and smi["gpus"]
    part.outcome = "pass" if ok else "fail"
    part.summary = (f"{counts['yes']} agree, {counts['no']} disagree, {counts['n/a']} n/a "
                    f"over {len(smi['gpus'])} GPU(s)")
    for uuid, g in smi["gpus"].items():
        if g.get("mig_mode") == "Enabled":
            part.notes.append(f"{uuid}: MIG is on (memory and utilization are per instance)")
    return part


# --------------------------------------------------------------------------

def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--parts", default=",".join(PARTS),
                    help=f"comma-separated subset of {','.join(PARTS)}")
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
    unknown = [p for p in wanted if p not in PARTS]
    if unknown:
        ap.error(f"unknown part(s) {', '.join(unknown)}: choose from {', '.join(PARTS)}")
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
    parts = {n: Part(i + 1, t) for i, (n, t) in enumerate(
        (("tests", "GPU test tier (`pytest tests/gpu`)"),
         ("faults", "GPU faults against a running agent"),
         ("smi", "tracehound against `nvidia-smi -q -x`")))}
    work = tempfile.mkdtemp(prefix="tracehound-gpucheck-")
    agent = None
    try:
        if "tests" in wanted:
            print("gpu-check: part 1, pytest tests/gpu", flush=True)
            parts["tests"] = part_tests(work, logs)
        if "faults" in wanted or "smi" in wanted:
            agent = Agent(work)
            try:
                agent.start()
                loaded, missing = agent.probes()
                stamp["agent"] = (f"{agent.mode} ({agent.gpu_line()}); BPF probes loaded: "
                                  f"{', '.join(loaded) or 'none'}; not loaded: "
                                  f"{'; '.join(missing) or 'none'}")
            except RuntimeError as exc:
                stamp["agent"] = f"did not start: {exc}"
                logs["agent"] = "\n".join(agent.lines[-40:]) or str(exc)
                agent = None
        if "smi" in wanted:
            # before the faults: the GPU idle and as its owner set it
            print("gpu-check: part 3, tracehound against nvidia-smi -q -x", flush=True)
            p = parts["smi"]
            if agent is None:
                p.outcome, p.summary = "fail", "no agent to read"
            else:
                try:
                    first = parse_exposition(agent.scrape())
                    smi_now = parse_smi(smi_xml())
                    second = parse_exposition(agent.scrape())
                    parts["smi"] = part_smi([first, second], smi_now)
                except (OSError, subprocess.SubprocessError, ET.ParseError, ValueError) as exc:
                    p.outcome, p.summary = "fail", _one_line(f"could not compare: {exc}")
        if "faults" in wanted:
            print("gpu-check: part 2, GPU faults against the agent", flush=True)
            if agent is None:
                p = parts["faults"]
                p.outcome, p.summary = "fail", "no agent to detect the faults"
            else:
                parts["faults"] = part_faults(agent, args.device, args.interval, work, logs)
    finally:
        if agent is not None:
            agent.stop()
        shutil.rmtree(work, ignore_errors=True)
    stamp["took_s"] = time.monotonic() - started
    ordered = [parts["tests"], parts["faults"], parts["smi"]]
    if smi is None:
        ordered[2].notes.append("nvidia-smi -q -x did not answer at the start")
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
