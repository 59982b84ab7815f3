"""A cgroup path of 3.7 KiB (15 nested names of 250 bytes, as anyone with a
delegated subtree makes) does I/O under the real agent, scraped by a real
Prometheus configured with label_value_length_limit 1024, which refuses a
scrape with a longer value whole: the node stays up in Prometheus, and the
I/O is counted under the path's shortened form."""
import os

from testbed import prometheus as prometheus_server
from tests.kernel.conftest import remove_cgroup, run_in_cgroup
from tracehound.clients.prometheus import query, regex_literal, wait_for
from tracehound.utf8 import MAX_LABEL_BYTES, label_value


def test_a_path_longer_than_prometheus_allows_keeps_the_node_scraped(agent, cgroup_root, cgroup,
                                                                      tmpfs, tmp_path):
    deep = cgroup + "".join(f"/{i:03d}" + "d" * 246 for i in range(15))
    os.makedirs(cgroup_root + deep)
    path = os.path.join(tmpfs, f"long-{os.path.basename(cgroup)}")
    target = agent.url.removeprefix("http://").removesuffix("/metrics")
    config = {"global": {"scrape_interval": "1s", "scrape_timeout": "1s"},
              "scrape_configs": [{"job_name": "agent", "label_value_length_limit": 1024,
                                  "static_configs": [{"targets": [target]}]}]}
    try:
        run_in_cgroup(cgroup_root, deep, [["write", path, 100_000, 65536]])
        with prometheus_server.serving(tmp_path, config) as url:
            shown = label_value(deep)
            assert len(deep) > 3_700 and len(shown.encode()) <= MAX_LABEL_BYTES
            wait_for(url, f"tracehound_io_write_bytes_total{{cgroup=~{regex_literal(shown)}}}"
                          " == 100000", timeout=60)
            assert [s.value for s in query(url, 'up{job="agent"}')] == [1.0]
    finally:
        if os.path.exists(path):
            os.unlink(path)
        for depth in range(15, 0, -1):
            remove_cgroup(cgroup_root + cgroup + "".join(
                f"/{i:03d}" + "d" * 246 for i in range(depth)))
