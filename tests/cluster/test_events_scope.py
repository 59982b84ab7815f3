"""Each node's agent tells its own node's events only. All the simulated
nodes share one kernel, so every agent's exit probe sees every node's
crashes; --cgroup-scope /slurm_<node> (testbed/agents.py) is what keeps
another node's rank out of an agent's /events, as it keeps it out of the
agent's series."""
import json
import subprocess

from tests.cluster.test_fleet_chaos import cluster, jobs  # noqa: F401  (fixtures)
from tests.cluster.test_fleet_chaos import fleet_argv, run_fleet
from tests.cluster.test_job_io import poll


def crashes(cluster, node: str, job_id: str) -> list[dict]:
    """The job's process_crash events at NODE's agent, reached in its network namespace."""
    out = subprocess.run(["nsenter", f"--net=/run/netns/{cluster.netns(node)}", "--",
                          "curl", "-sf", "--max-time", "10",
                          f"http://127.0.0.1:9560/events?job_id={job_id}&kind=process_crash"],
                         capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, f"{node}'s agent: {out.stderr}"
    return json.loads(out.stdout)["events"]


def crash(cluster, job, tmp_path, name: str, nodes: list[str]) -> None:
    """A SEGV to the job's rank on each of NODES, as a crash of its own code."""
    done = run_fleet(cluster, fleet_argv("job-proc-kill.yaml", tmp_path / name, "--job", job.id,
                                         "--nodes", ",".join(nodes)),
                     env={"CHAOS_SIGNAL": "SEGV"})
    assert done.returncode == 0, done.stdout + done.stderr


def test_a_ranks_crash_is_an_event_of_its_own_nodes_agent_and_no_others(
        cluster, jobs, tmp_path):
    job = jobs(cluster.nodes, tmp_path, "thscope")
    first, second, _third = cluster.nodes     # the third rank lives on: the job goes on
    crash(cluster, job, tmp_path, "first", [first])
    [event] = poll(lambda: crashes(cluster, first, job.id) or None, f"the crash on {first}")
    assert (event["pid"], event["signal"]) == (job.pids[first], "SEGV"), event
    assert event["cgroup"].startswith(f"/slurm_{first}/"), event
    # then a crash on the second node: by the time its agent tells its own,
    # it has looked past the first one, which it would have told before
    crash(cluster, job, tmp_path, "second", [second])
    told = poll(lambda: crashes(cluster, second, job.id) or None, f"the crash on {second}")
    assert [(e["pid"], e["signal"]) for e in told] == [(job.pids[second], "SEGV")], told
    assert told[0]["cgroup"].startswith(f"/slurm_{second}/"), told
