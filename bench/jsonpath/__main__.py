"""Why chaos tolerances read JSON paths with chaos/jsonpath.py, not jsonpath-ng:
the same paths over the same documents through both, in one run. Counts the
paths whose answers differ, and times what a `tracehound chaos` run pays:
importing the reader in a fresh interpreter, and parsing and matching each
path once.

    .venv/bin/pip install jsonpath-ng     # not a dependency of tracehound
    .venv/bin/python -m bench.jsonpath [--rounds 7]

Writes report/jsonpath.{md,json}.
"""
from __future__ import annotations

import argparse
import importlib.metadata
import json
import statistics
import subprocess
import sys
import time

from bench.common import REPO, REPORT, log, stamp
from tracehound.chaos import jsonpath

# an HTTP probe's body and a /events answer, as tolerances see them
DOCS = {
    "items": {"items": [{"name": f"n{i}", "n": i, "tags": {"zone": f"z{i % 3}"}}
                        for i in range(50)], "ready": True},
    "events": {"events": [{"kind": "rdma_error_burst", "op": "reg_mr", "count": i,
                           "cgroup": f"/slurm/job_{i}"} for i in range(200)]},
}
PATHS = ["$.ready", "$.items[*].name", "$.items[0].tags.zone", "$.items[-1].n",
         "$.items[2:5].name", "$['items'][*]['n']", "$..zone", "$.items.*",
         "$.items[?(@.n > 40)].name", "$.items[?(@.tags.zone == 'z1')].n",
         "$.events[?(@.op == 'reg_mr')].count", "$..count"]


def ng_match(parse, path: str, doc) -> list:
    return [m.value for m in parse(path).find(doc)]


def import_ms(module: str) -> float:
    """Median wall time of `import MODULE` in a fresh interpreter, less the
    interpreter's own start (5 runs each)."""
    def run(code: str) -> float:
        started = time.perf_counter()
        subprocess.run([sys.executable, "-c", code], check=True, capture_output=True,
                       env={"PYTHONPATH": str(REPO / "src")})
        return time.perf_counter() - started
    bare = statistics.median(run("pass") for _ in range(5))
    return round((statistics.median(run(f"import {module}") for _ in range(5)) - bare) * 1000, 1)


def shown(ms: float) -> str:
    """An import's time; one within the interpreter's own start-up noise as such."""
    return f"{ms}" if ms >= 1 else "< 1 (within start-up noise)"


def main() -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.jsonpath",
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=7)
    args = ap.parse_args()
    try:
        from jsonpath_ng.ext import parse as ng_parse
        ng_version = importlib.metadata.version("jsonpath-ng")
    except ImportError:
        log("jsonpath-ng is not installed: .venv/bin/pip install jsonpath-ng")
        return 2
    differ, failed = [], []
    for path in PATHS:
        for name, doc in DOCS.items():
            ours = jsonpath.match(path, doc)
            try:
                theirs = ng_match(ng_parse, path, doc)
            except Exception as exc:  # noqa: BLE001 - counted: the library refuses it
                failed.append(f"{path}: {type(exc).__name__}")
                break
            if ours != theirs:
                differ.append(f"{path} on {name}: {len(ours)} against {len(theirs)} values")
    times: dict[str, list[float]] = {"tracehound": [], "jsonpath-ng": []}
    for _ in range(args.rounds):
        for name, run in (("tracehound", lambda p, d: jsonpath.match(p, d)),
                          ("jsonpath-ng", lambda p, d: ng_match(ng_parse, p, d))):
            started = time.perf_counter()
            for path in PATHS:
                for doc in DOCS.values():
                    try:
                        run(path, doc)
                    except Exception:  # noqa: BLE001 - counted above
                        pass
            times[name].append((time.perf_counter() - started) / (len(PATHS) * len(DOCS)))
    per = {n: round(statistics.median(t) * 1e6, 1) for n, t in times.items()}
    imports = {"tracehound": import_ms("tracehound.chaos.jsonpath"),
               "jsonpath-ng": import_ms("jsonpath_ng.ext")}
    res = {"stamp": stamp(), "jsonpath_ng": ng_version, "paths": PATHS, "differ": differ,
           "refused_by_library": failed, "us_per_parse_and_match": per, "import_ms": imports}
    REPORT.mkdir(parents=True, exist_ok=True)
    (REPORT / "jsonpath.json").write_text(json.dumps(res, indent=2) + "\n")
    st = res["stamp"]
    lines = ["# JSON paths of chaos tolerances: chaos/jsonpath.py against jsonpath-ng", "",
             f"{st['machine']}; commit {st['commit']}; {st['date']}; jsonpath-ng {ng_version} "
             f"(its `ext` parser, which has filters). {len(PATHS)} paths of the forms tolerances "
             f"use, over {len(DOCS)} documents; {args.rounds} rounds.", "",
             "| | tracehound | jsonpath-ng |", "|---|---:|---:|",
             f"| parse and match one path, µs (median) | {per['tracehound']} | "
             f"{per['jsonpath-ng']} |",
             f"| import in a fresh interpreter, ms | {shown(imports['tracehound'])} | "
             f"{shown(imports['jsonpath-ng'])} |", "",
             f"Answers that differ: {len(differ)}" + (": " + "; ".join(differ) if differ else "")
             + ". Paths the library refuses: " + (", ".join(failed) or "none") + "."]
    (REPORT / "jsonpath.md").write_text("\n".join(lines) + "\n")
    log(f"wrote {REPORT / 'jsonpath.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
