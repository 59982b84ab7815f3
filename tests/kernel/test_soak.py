"""A busy, healthy node raises no anomaly: fio, a TCP job, short jobs coming
and going and a CPU load run under an agent whose stall rule is at its most
eager (--stall-after 5 over every /thsoak cgroup), and not one event comes
out. bench/soak.py runs the same mix for ten minutes."""
from tests.kernel.conftest import require_tools, start_agent, stop_agent
from testbed.soak_mix import AGENT_FLAGS, SoakMix, watch_events

SOAK_S = 60
WARMUP_S = 5


def test_a_busy_healthy_node_raises_no_anomaly(hook_mode, tmp_path):
    require_tools("fio", "stress-ng")      # the workload mix
    # a kernel log position of its own: lines other runs wrote to the kernel
    # log before it started are no event of this node's workload
    agent = start_agent(hook_mode, *AGENT_FLAGS, "--state-dir", str(tmp_path))
    try:
        with SoakMix() as mix:
            watch_events(agent.url, WARMUP_S)
            events = watch_events(agent.url, SOAK_S)
            metrics = agent.scrape()
        assert events == [], events
        # the mix was real, and the rules were looking at it
        assert mix.short_jobs >= SOAK_S // 6          # one every 3 s, each taking a moment
        value = lambda name, **labels: sum(v for (n, ls), v in metrics.items()  # noqa: E731
                                           if n == name and set(labels.items()) <= ls)
        assert value("tracehound_io_write_bytes_total", cgroup="/thsoak/fio") > 0
        assert value("tracehound_net_tcp_sockets", cgroup="/thsoak/tcp") >= 1
        assert value("tracehound_cgroup_cpu_seconds_total", cgroup="/thsoak/cpu") > 1
        assert value("tracehound_stall_watched_workloads") >= 3
    finally:
        stop_agent(agent)
