"""The run's report: its Markdown and signal picture without a plotting
library, and a JSON journal that keeps what happened, not whole scrapes."""
import json
import os
import sys
from xml.etree import ElementTree

from tracehound.chaos import report

RECORD = {"title": "T", "description": "d", "run_id": "r", "status": "completed",
          "start": "now", "duration": 1.0, "source": "f", "journal": "j",
          "steady_states": {}, "faults": [], "detections": [], "runs": [],
          "rollbacks": [], "timeline": []}


def test_report_without_matplotlib(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    record = dict(RECORD)
    paths = report.write(record, str(tmp_path))
    assert "plot" not in paths
    assert "No plot: matplotlib is not installed" in open(paths["markdown"]).read()


def test_a_report_draws_each_signal_against_its_threshold_without_matplotlib(
        tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    detection = {"probe": "slow <writes>", "fault": "io.throttle", "source": "agent",
                 "query": "q", "signal": "mean", "predicate": "> 0.01", "detected": True,
                 "tracehound_signal": True, "mttd_seconds": 2.0, "value": 0.2, "before": 0.002,
                 "note": "", "samples": [[1.0, 0.004], [2.0, 0.2]]}
    record = dict(RECORD, detections=[detection])
    paths = report.write(record, str(tmp_path))
    assert "plot" not in paths
    text = open(paths["markdown"]).read()
    assert f"({os.path.basename(paths['signals'])})" in text
    svg = ElementTree.parse(paths["signals"]).getroot()
    ns = "{http://www.w3.org/2000/svg}"

    def one(kind, cls):
        [el] = [e for e in svg.iter(ns + kind) if e.get("class") == cls]
        return el
    points = [tuple(map(float, p.split(","))) for p in one("polyline", "signal").get("points").split()]
    threshold = float(one("line", "threshold").get("y1"))
    before = float(one("circle", "before").get("cy"))
    hit = one("circle", "detected")
    # up is larger: the reading under the fault above the threshold, before it and
    # the first reading below, the detecting reading where the line ends
    assert points[1][1] < threshold < before and points[0][1] < before
    assert (float(hit.get("cx")), float(hit.get("cy"))) == points[1]
    assert "slow &lt;writes&gt;" in open(paths["signals"]).read()


def test_the_journal_keeps_the_start_of_a_long_output_and_its_length(tmp_path):
    """A steady-state probe of /metrics answers a whole scrape (megabytes on
    a busy node), three times a run: the journal keeps its head and size."""
    scrape = "tracehound_io_read_bytes_total 1\n" * 20000
    run = {"name": "agent-serves-metrics", "type": "probe", "provider": "http",
           "phase": "hypothesis-before", "start": 0.0, "end": 0.1, "duration": 0.1,
           "status": "succeeded", "output": {"status": 200, "headers": {"Content-Type": "text/plain"}, "body": scrape}}
    record = dict(RECORD, runs=[run])
    paths = report.write(record, str(tmp_path), plot=False)
    assert os.path.getsize(paths["journal"]) < 20000 < len(scrape)
    kept = json.load(open(paths["journal"]))["runs"][0]["output"]
    assert kept["status"] == 200 and kept["headers"] == {"Content-Type": "text/plain"}
    assert kept["body"].startswith(scrape[:report.KEPT_CHARS])
    assert kept["body"].endswith(f"({len(scrape):,} characters; the rest is not kept)")
    # what the run returned is left as it was
    assert run["output"]["body"] == scrape
