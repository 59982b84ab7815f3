"""The accuracy half of bench/explain: clean jobs on nodes that just got over
a fatal XID, every job asked again minutes after it ended, and the scores
the triage literature reports: top-1, recall and precision of the findings
over the fault jobs and the clean ones together.

A finding is true when it names the fault's node with one of the fault's
rules (faults.FAULTS); every other finding, on a fault job or a clean one,
is false.
"""
from __future__ import annotations

import shutil
import tempfile

from bench.explain.faults import (FAULTS, detail, end_job, job_writing, others, rank_of,
                                  start_job, top_line)
from tracehound import conditions
from tracehound.clients import prometheus

# any GPU condition of any node: the clean jobs start once none holds
UNFIT = ('max(tracehound_gpu_health{condition=~"'
         + "|".join(c.gauge for c in conditions.GPU if c.gauge) + '"})')


def clean_jobs(cluster, url: str, explain, until, work: str, count: int) -> list[dict]:
    """COUNT healthy four-node jobs, one after another, once no node is unfit
    from the fault half's fatal XID any more: each asked while it runs."""
    until(lambda: all(s.value == 0 for s in prometheus.query(url, UNFIT)),
          "the fatal XID's unfitness cleared", timeout=900)
    data = tempfile.mkdtemp(prefix="thbench-clean-", dir="/var/tmp")
    rows = []
    try:
        for i in range(count):
            name = f"thbench-clean-{i}"
            proc = start_job(cluster, name, data, work, 21000 + i)
            try:
                job = job_writing(cluster, url, explain, until, name)
                answer = explain(url, job)
                rows.append({"job": job, "findings": [f"{f.rule}@{f.node}"
                                                      for f in answer.findings],
                             "seconds": answer.seconds, "span_source": answer.span_source,
                             "detail": detail(answer)})
            finally:
                end_job(cluster, name, proc)
            print(f"clean job {job}: {len(rows[-1]['findings'])} finding(s)", flush=True)
    finally:
        shutil.rmtree(data, ignore_errors=True)
    return rows


def ask_again(url: str, explain, result: dict) -> list[dict]:
    """Every job of the run, asked again at its end: minutes after it ended."""
    jobs = [("soak", r["job"]) for r in result["rows"] if r.get("when") == "ended"]
    jobs += [("fault", r["job"]) for r in result["faults"]]
    jobs += [("clean", r["job"]) for r in result["clean"]]
    rows = []
    for kind, job in jobs:
        answer = explain(url, job)
        row = {"kind": kind, "job": job, "span_source": answer.span_source,
               "seconds": answer.seconds, "nodes": len(answer.nodes),
               "ended_by": answer.ended_by, "detail": detail(answer)}
        if kind == "fault":
            fault = next(r for r in result["faults"] if r["job"] == job)
            row.update(fault=fault["fault"], rank=rank_of(answer, fault["rules"], fault["node"]),
                       others=others(answer, fault["rules"], fault["node"]),
                       top=top_line(answer))
        else:
            row["findings"] = [f"{f.rule}@{f.node}" for f in answer.findings]
        rows.append(row)
    return rows


def scores(result: dict) -> dict:
    faults, late = result["faults"], result["late"]
    clean_live = [r for r in result["rows"]] + result["clean"]
    clean_late = [r for r in late if r["kind"] != "fault"]
    late_faults = [r for r in late if r["kind"] == "fault"]
    true = sum(r["rank"] is not None for r in faults)
    false = (sum(len(r["others"]) for r in faults)
             + sum(len(r["findings"]) for r in clean_live + clean_late))
    top1 = sum(r["rank"] == 1 for r in faults)
    recall = true / len(faults) if faults else None
    precision = true / (true + false) if true + false else None
    f1 = (2 * precision * recall / (precision + recall)
          if precision and recall else 0.0)
    clean_findings = sum(len(r["findings"]) for r in clean_live + clean_late)
    return {"faults": len(faults), "top1": top1, "found": true,
            "top1_after_end": sum(r["rank"] == 1 for r in late_faults),
            "clean_answers": len(clean_live) + len(clean_late),
            "clean_jobs": len({r["job"] for r in clean_live}),
            "clean_findings": clean_findings, "false_findings": false,
            "recall": recall, "precision": precision, "f1": round(f1, 3),
            "late_series_answers": sum(r["span_source"] == "series" for r in late),
            "ok": bool(faults) and top1 == len(faults) and clean_findings == 0
            and all(r["rank"] == 1 for r in late_faults)}


def _s(x) -> str:
    return "-" if x is None else f"{x:.2f} s"


def markdown(result: dict, a: dict, scrape: float) -> list[str]:
    late = {r["job"]: r for r in result["late"]}
    out = ["## Faults: is the top line the true cause?", "",
           f"Each of the {len(FAULTS)} faults on one node of a fresh four-node job of "
           f"checkpointing ranks; the rank of the true cause once the "
           f"fault is over, how long after the fault it first ranked first (scrape interval "
           f"{scrape:g} s), and the same job asked again at the end of the run.", "",
           "| fault | node | rank | first after | intervals | answer | rank after it ended "
           "(span from) | other findings | the top line |",
           "|---|---|---|---|---|---|---|---|---|"]
    for r in result["faults"]:
        after = r["ranked_first_s"]
        again = late.get(r["job"], {})
        out.append(f"| {r['fault']} | {r['node']} | {r['rank'] or 'absent'} | {_s(after)} | "
                   + (f"{after / scrape:.1f}" if after is not None else "-")
                   + f" | {_s(r['answer_s'])} | {again.get('rank') or 'absent'} "
                   f"({again.get('span_source', '-')}) | {', '.join(r['others']) or '-'} | "
                   f"{r['top'] or '-'} |")
    clean = result["clean"]
    out += ["", f"Then {len(clean)} clean jobs on the same nodes, each started once the fatal "
            "XID's unfitness had cleared on its node: "
            f"{sum(len(r['findings']) for r in clean)} finding(s) while they ran.", "",
            "## Scores", "",
            "| | figure |", "|---|---|",
            f"| faults whose true cause is the top line | **{a['top1']} of {a['faults']}** |",
            f"| the same, asked again after the job ended | {a['top1_after_end']} of "
            f"{a['faults']} |",
            f"| findings on clean jobs ({a['clean_jobs']} jobs, {a['clean_answers']} answers: "
            f"running, ended, asked again later) | **{a['clean_findings']}** |",
            f"| answers asked late whose span came from the series (Slurm had forgotten the "
            f"job) | {a['late_series_answers']} of {len(result['late'])} |",
            f"| recall (faults found at all) | {a['recall']:.2f} |" if a["recall"] is not None
            else "| recall | - |",
            f"| precision (true findings / all findings) | {a['precision']:.2f} |"
            if a["precision"] is not None else "| precision | - |",
            f"| F1 | {a['f1']:.2f} (Minder, a peer triage system: 0.89) |", ""]
    return out
