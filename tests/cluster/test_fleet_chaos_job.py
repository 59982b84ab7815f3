"""Fleet chaos inside a user's running job never harms the job: a real
2-node job whose every rank does I/O, targeted with --job, through an
abort, a Ctrl-C, and a SIGKILL of the launcher that leaves its node runs
alive, then `chaos recover --slurm`. Judged on the nodes: every rank alive
and running (not stopped) afterwards, the job still RUNNING in squeue, each
rank still writing."""
import glob
import os
import signal
import subprocess
import time
from pathlib import Path

from tests.cluster.test_fleet_chaos import (_is_node_run, cluster, fleet_argv,  # noqa: F401
                                            fleet_report, jobs, poll)
from tests.conftest import tracehound_cmd

# a rank of the user's job: says its pid, then writes and syncs 64 KiB a
# tenth of a second, counting each write in <dir>/<node>.n
WRITER = ("import os, sys, time\n"
          "node = os.uname().nodename\n"
          "path = os.path.join(sys.argv[1], node)\n"
          "open(path + '.tmp', 'w').write(str(os.getpid()))\n"
          "os.rename(path + '.tmp', path)\n"
          "n = 0\n"
          "with open(os.path.join(sys.argv[1], node + '.data'), 'wb') as f:\n"
          "    while True:\n"
          "        f.write(b'x' * 65536); f.flush(); os.fsync(f.fileno()); n += 1\n"
          "        open(path + '.n.tmp', 'w').write(str(n))\n"
          "        os.rename(path + '.n.tmp', path + '.n')\n"
          "        time.sleep(0.1)\n")


def squeue_state(cluster, job_id: str) -> str:
    return subprocess.run(["squeue", "-h", "-j", job_id, "-o", "%T"], env=cluster.env(),
                          capture_output=True, text=True, timeout=30).stdout.strip()


def writes(job, node: str) -> int:
    try:
        return int((job.dir / f"{node}.n").read_text())
    except (FileNotFoundError, ValueError):
        return 0


def assert_job_whole(cluster, job) -> None:
    """Every rank alive, not stopped, and writing again; the job RUNNING."""
    assert squeue_state(cluster, job.id) == "RUNNING"
    before = {n: writes(job, n) for n in job.nodes}
    poll(lambda: all(writes(job, n) > before[n] + 2 for n in job.nodes), "every rank writing",
         lambda: {n: (job.state(n), writes(job, n)) for n in job.nodes})
    states = {n: job.state(n) for n in job.nodes}
    assert all(s in ("S", "R", "D") for s in states.values()), states


def frozen(job, nodes) -> bool:
    return all(job.state(n) == "T" for n in nodes)


def test_an_abort_leaves_the_users_job_running_on_every_node(cluster, jobs, fleet_prometheus,
                                                             tmp_path):
    job = jobs(cluster.nodes[:2], tmp_path, "thfleet-abort", WRITER)
    # a condition that comes to hold while the fault is in
    at = time.time() + 6
    done = subprocess.run(fleet_argv(
        "job-proc-stop.yaml", tmp_path, "--job", job.id, "--max-parallel", "2",
        "--prometheus", fleet_prometheus, "--abort-when", f"vector(time()) > {at:.0f}",
        "--abort-interval", "0.5"), env={**cluster.env(), "CHAOS_HOLD_SECONDS": "120"},
        capture_output=True, text=True, timeout=300)
    assert done.returncode == 1, done.stdout + done.stderr
    report = fleet_report(tmp_path)
    assert report["status"] == "aborted" and sorted(report["landed"]) == job.nodes
    for node in job.nodes:
        info = report["nodes"][node]
        assert info["stopped"] and info["faults"][0]["rolled_back"] == "done", info
    assert_job_whole(cluster, job)


def test_ctrl_c_of_a_run_on_one_node_of_the_job_leaves_both_running(cluster, jobs, tmp_path):
    job = jobs(cluster.nodes[:2], tmp_path, "thfleet-ctrlc", WRITER)
    target, other = job.nodes
    launcher = subprocess.Popen(
        fleet_argv("job-proc-stop.yaml", tmp_path, "--job", job.id, "--nodes", target),
        env={**cluster.env(), "CHAOS_HOLD_SECONDS": "120"}, stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, text=True)
    poll(lambda: frozen(job, [target]), "the target node's rank stopped",
         lambda: {n: job.state(n) for n in job.nodes})
    assert job.state(other) in ("S", "R", "D")       # never targeted
    launcher.send_signal(signal.SIGINT)
    output = launcher.communicate(timeout=120)[0]
    assert launcher.returncode == 130, output
    info = fleet_report(tmp_path)["nodes"][target]
    assert info["stopped"] and not info["killed"] and info["step_id"], info
    assert info["step_id"].startswith(f"{job.id}.") and info["step_id"] != f"{job.id}.0"
    assert_job_whole(cluster, job)


def test_a_killed_launcher_whose_node_runs_live_on_is_recovered_for_real(cluster, jobs,
                                                                         tmp_path):
    job = jobs(cluster.nodes[:2], tmp_path, "thfleet-orphan", WRITER)
    launcher = subprocess.Popen(
        fleet_argv("job-proc-stop.yaml", tmp_path, "--job", job.id, "--max-parallel", "2"),
        env={**cluster.env(), "CHAOS_HOLD_SECONDS": "300"}, stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL, start_new_session=True)
    poll(lambda: frozen(job, job.nodes), "the job stopped on both nodes")
    # the launcher alone dies: its sruns and the node runs live on, holding the fault
    fleet_journal = glob.glob(str(tmp_path / "journal" / "fleet" / "*.jsonl"))[0]
    poll(lambda: Path(fleet_journal).read_text().count('"event": "step"') == 2,
         "both node runs' steps journalled")
    launcher.kill()
    launcher.wait()
    assert frozen(job, job.nodes)
    journal = str(tmp_path / "journal")
    done = subprocess.run([*tracehound_cmd(), "chaos", "recover", "--slurm", "--journal",
                           journal], env=cluster.env(), capture_output=True, text=True,
                          timeout=400)
    assert done.returncode == 0, done.stdout + done.stderr
    for node in job.nodes:
        line = next(ln for ln in done.stdout.splitlines() if f": {node}: " in ln)
        # alive when recover looked: stopped by its step's id (or ended as it was)
        assert ": recovered: its run (step " in line and "was alive: stopped it" in line, line
    assert_job_whole(cluster, job)
    again = subprocess.run([*tracehound_cmd(), "chaos", "recover", "--slurm", "--journal",
                            journal], env=cluster.env(), capture_output=True, text=True,
                           timeout=120)
    assert again.returncode == 0 and "nothing to recover" in again.stdout, again.stdout
    assert not [p for p in os.listdir("/proc") if p.isdigit() and _is_node_run(p, job.id)]


def plain_argv(experiment: str, tmp_path, *extra: str) -> list[str]:
    """fleet_argv without its --max-share 100: the defaults a user gets."""
    argv = fleet_argv(experiment, tmp_path, *extra)
    i = argv.index("--max-share")
    return argv[:i] + argv[i + 2:]


def test_a_share_beyond_max_share_is_refused_and_nothing_launched(cluster, tmp_path):
    done = subprocess.run(plain_argv("proc-kill.yaml", tmp_path, "--percent", "67",
                                     "--allow-code"),
                          env=cluster.env(), capture_output=True, text=True, timeout=120)
    assert done.returncode == 1, done.stdout + done.stderr
    assert ("is above the blast-radius limit --max-share 10%" in done.stderr
            and "nothing was launched" in done.stderr), done.stderr
    assert not glob.glob(str(tmp_path / "journal" / "fleet" / "*.jsonl"))
    assert not glob.glob(str(tmp_path / "reports" / "fleet-*"))


def test_an_abort_condition_that_cannot_be_read_stops_the_run(cluster, fleet_prometheus,
                                                              tmp_path):
    done = subprocess.run(fleet_argv(
        "proc-kill.yaml", tmp_path, "--nodes", ",".join(cluster.nodes), "--allow-code",
        "--prometheus", fleet_prometheus, "--abort-when", "sum(rate(x[5m]"),
        env=cluster.env(), capture_output=True, text=True, timeout=120)
    assert done.returncode == 1, done.stdout + done.stderr
    report = fleet_report(tmp_path)
    assert report["status"] == "aborted" and report["landed"] == []
    assert report["stop_reason"].startswith("the abort condition could not be checked")


def test_the_nodes_of_a_wave_run_together_and_the_next_waits_out_the_pause(cluster, tmp_path):
    pause = 4.0
    done = subprocess.run(fleet_argv(
        "proc-kill.yaml", tmp_path, "--nodes", ",".join(cluster.nodes), "--allow-code",
        "--max-parallel", "2", "--wave-pause", str(pause)),
        env={**cluster.env(), "CHAOS_HOLD_SECONDS": "3"}, capture_output=True, text=True,
        timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    report = fleet_report(tmp_path)
    first, second, third = cluster.nodes
    runs = {n: report["nodes"][n] for n in cluster.nodes}
    assert all(r["status"] == "completed" for r in runs.values()), runs
    # wall-clock moments the launcher took from its own srun processes
    times = {n: (r["launched_at"], r["ended_at"]) for n, r in runs.items()}
    # the first wave: each node launched before the other ended
    assert times[second][0] < times[first][1] and times[first][0] < times[second][1]
    # the second wave: after both ended, and the pause
    assert times[third][0] >= max(times[first][1], times[second][1]) + pause

