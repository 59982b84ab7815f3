"""How long reading a 5 MB exposition of the agent's takes: prometheus_client's
parser against exporter/text_parse.py, the one `tracehound top` and the chaos
detection probe use (top refreshes every second).

    .venv/bin/python -m bench.parse_exposition
"""
import time

from prometheus_client.parser import text_string_to_metric_families

from tracehound.exporter.exposition import TEXT, render
from tracehound.exporter.rows import Blocks, HistogramRows, Log2Histogram, ValueRows
from tracehound.exporter.text_parse import parse
from tracehound.top.rates import parse_metrics

CGROUPS = 900          # about 5 MB with four counters and one latency histogram


def exposition() -> str:
    blocks = Blocks(("cgroup", "mountpoint", "fstype", "workload", "job_id"))
    rows = [blocks.get((f"/system.slice/slurmstepd.scope/job_{i}/step_0/user/task_0",
                        "/scratch", "lustre", "slurm", str(i))) for i in range(CGROUPS)]
    fams = [ValueRows(f"tracehound_io_{op}", "x", "counter", rows, list(range(CGROUPS)))
            for op in ("read_bytes", "write_bytes", "read_requests", "write_requests")]
    fams.append(HistogramRows("tracehound_io_read_latency_seconds", "x", rows,
                              [[i % 7] * 32 for i in range(CGROUPS)], [0.5] * CGROUPS,
                              Log2Histogram(32, 1e-9, 10)))
    return b"".join(render(fams, TEXT)).decode()


def best_of_3(f) -> float:
    times = []
    for _ in range(3):
        start = time.perf_counter()
        f()
        times.append(time.perf_counter() - start)
    return min(times)


def main() -> None:
    text = exposition()
    print(f"{len(text) / 1e6:.1f} MB, {text.count(chr(10))} lines")
    print(f"prometheus_client parser  {best_of_3(lambda: list(text_string_to_metric_families(text))):.3f} s")
    print(f"text_parse.parse          {best_of_3(lambda: parse(text)):.3f} s")
    print(f"top's parse_metrics       {best_of_3(lambda: parse_metrics(text, 0.0)):.3f} s")


if __name__ == "__main__":
    main()
