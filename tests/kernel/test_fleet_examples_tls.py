"""A fleet example as shipped (examples/fleet/proc-kill.yaml, the one a
node runs inside its srun) against an agent that serves TLS with basic
authentication and otherwise the defaults a user gets: its steady-state
probe reads the agent as every client does (TRACEHOUND_CA_FILE, the
password), and the kill is counted where that agent counts. Without the
CA the same run fails its steady state: the probe really went through TLS."""
import glob
import json
import os
import subprocess
import tempfile

import pytest

from tests import tls_files
from tests.conftest import ROOT, tracehound_cmd
from tests.kernel.conftest import USERS_DEFAULTS, start_agent, stop_agent

EXAMPLE = os.path.join(ROOT, "examples", "fleet", "proc-kill.yaml")


@pytest.fixture(scope="module")
def tls_agent(hook_mode):
    tmp = tempfile.mkdtemp(prefix="thtest-fleet-tls-")
    tls = tls_files.make(tmp)
    config, password = tls.tls_with_password("server", "operator")
    agent = start_agent(hook_mode, *USERS_DEFAULTS, "--web.config.file", config)
    assert agent.url.startswith("https://"), agent.url
    yield {"TRACEHOUND_METRICS_URL": agent.url, "TRACEHOUND_CA_FILE": tls.ca,
           "TRACEHOUND_USERNAME": "operator", "TRACEHOUND_PASSWORD_FILE": password}
    stop_agent(agent)
    subprocess.run(["rm", "-rf", tmp])


def run_fleet_example(env: dict) -> tuple[subprocess.CompletedProcess, dict]:
    tmp = tempfile.mkdtemp(prefix="thtest-fleet-example-")
    try:
        done = subprocess.run(
            [*tracehound_cmd(), "chaos", "run", EXAMPLE, "--yes", "--allow-code",
             "--journal", f"{tmp}/journal", "--report", f"{tmp}/report", "--no-plot"],
            env={k: v for k, v in os.environ.items() if not k.startswith("TRACEHOUND_")}
            | {"SLURM_JOB_ID": f"tls{os.getpid()}", **env},
            capture_output=True, text=True, timeout=180)
        reports = glob.glob(f"{tmp}/report/*-journal.json")
        if not reports:
            return done, {}
        with open(reports[0]) as f:
            return done, json.load(f)
    finally:
        subprocess.run(["rm", "-rf", tmp])


def test_the_fleet_example_reads_a_tls_agent_as_shipped_and_sees_the_kill(tls_agent):
    done, record = run_fleet_example(tls_agent)
    assert done.returncode == 0, done.stdout + done.stderr
    before = record["steady_states"]["before"]
    assert before["met"] and [p["tolerance_met"] for p in before["probes"]] == [True], before
    (kill,) = [d for d in record["detections"] if d["probe"] == "tracehound-counts-the-kill"]
    assert kill["detected"] and kill["tracehound_signal"], kill


def test_without_the_ca_the_same_run_fails_its_steady_state(tls_agent):
    env = {k: v for k, v in tls_agent.items() if k != "TRACEHOUND_CA_FILE"}
    done, record = run_fleet_example(env)
    assert done.returncode != 0, done.stdout + done.stderr
    assert "agent-serves-metrics" in done.stdout + done.stderr
    assert not record.get("faults"), record.get("faults")     # nothing was applied
