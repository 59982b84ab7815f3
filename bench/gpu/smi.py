"""Part 3 of scripts/gpu-check (bench/gpu): what the agent exports
for each GPU against `nvidia-smi -q -x`, field by field, moving values
within a stated tolerance (FIELDS)."""
from __future__ import annotations

import dataclasses
import re
import subprocess
import xml.etree.ElementTree as ET
from collections import Counter

from bench.gpu.agent import metric_samples
from bench.gpu.report import MIB, Part, fmt, new_part, one_line

# --------------------------------------------------------------------------
# nvidia-smi -q -x


def smi_xml() -> str:
    return subprocess.run(["nvidia-smi", "-q", "-x"], capture_output=True, text=True,
                          timeout=60, check=True).stdout


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


def _scale(v: float | None, k: float) -> float | None:
    return None if v is None else v * k


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
    # the agent's own normalization, so both sides spell a bus id alike
    from tracehound.host.topology import normalize_pci_bus_id

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
            "pci_bus_id": normalize_pci_bus_id(bus),
            "driver_version": driver,
            "memory_total_bytes": _scale(mib["total"], MIB),
            "memory_used_bytes": _scale(mib["used"], MIB),
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


# --------------------------------------------------------------------------
# what the agent exports

def parse_exposition(text: str) -> dict:
    """Prometheus text of the agent -> {uuid: fields} for every GPU it names
    in tracehound_gpu_info, fields keyed as parse_smi's."""
    samples = list(metric_samples(text, "tracehound_gpu"))
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


# --------------------------------------------------------------------------
# the comparison

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
            rows.append(_row(index, uuid, "listed", "yes" if have else "no",
                             "yes" if theirs else "no", "both list it", "no"))
            continue
        rows.append(_row(index, uuid, "UUID", uuid, uuid, "same text", "yes"))
        if any(r.get("lost") for r in have):
            rows.append(_row(index, uuid, "lost", "1", "-", "0", "no"))
        for f in FIELDS:
            rows.append(_compare_field(f, index, uuid, [r.get(f.key) for r in have], theirs))
    return rows


def _row(index, uuid, field, ours, theirs, tolerance, agree) -> dict:
    return {"gpu": index, "uuid": uuid, "field": field, "tracehound": ours,
            "nvidia_smi": theirs, "tolerance": tolerance, "agree": agree}


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
# the part

def part_smi(reads: list[dict], smi: dict) -> Part:
    part = new_part("smi", header=("GPU", "field", "tracehound", "nvidia-smi", "tolerance",
                                   "agree"))
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


def check_agent(agent) -> Part:
    """Part 3 against a running agent (bench.gpu.agent.Agent): read just before
    and just after nvidia-smi, so a moving value has a span to fall in."""
    try:
        first = parse_exposition(agent.scrape())
        smi_now = parse_smi(smi_xml())
        second = parse_exposition(agent.scrape())
        return part_smi([first, second], smi_now)
    except (OSError, subprocess.SubprocessError, ET.ParseError, ValueError) as exc:
        return new_part("smi").fail(one_line(f"could not compare: {exc}"))
