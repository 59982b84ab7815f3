"""A real Prometheus for the tests and benchmarks (Debian's
/usr/bin/prometheus): started on a free port with the caller's
configuration, its output kept in a log beside it, and stopped afterwards."""
import json
import os
import socket
import subprocess
import time
import urllib.request
from contextlib import contextmanager
from typing import Iterator

import pytest
import yaml

from tracehound.clients.prometheus import DetectionTimeout, wait_ready

PROMETHEUS = "/usr/bin/prometheus"
STARTS = 5


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def require() -> None:
    if not os.access(PROMETHEUS, os.X_OK):
        pytest.fail(f"{PROMETHEUS} is missing: apt-get install prometheus "
                    "(scripts/install --dev does)")


def launch(directory, config: dict, port: int, flags=()) -> subprocess.Popen:
    """Start it without waiting for it: the configuration goes to
    DIRECTORY/prometheus.yml, its output to DIRECTORY/prometheus.log;
    `flags` are more command-line flags (e.g. --enable-feature=...)."""
    path = os.path.join(directory, "prometheus.yml")
    with open(path, "w") as f:
        yaml.safe_dump(config, f)
    with open(os.path.join(directory, "prometheus.log"), "w") as log:
        return subprocess.Popen([PROMETHEUS, f"--config.file={path}",
                                 f"--storage.tsdb.path={os.path.join(directory, 'data')}",
                                 f"--web.listen-address=127.0.0.1:{port}", "--log.level=warn", *flags],
                                stdout=log, stderr=subprocess.STDOUT)


def answers_for(url: str, config_path: str) -> bool:
    """Whether the Prometheus at URL is the one started with CONFIG_PATH:
    a port picked free may be taken by another program before ours binds it,
    and then someone else's server would answer /-/ready."""
    try:
        with urllib.request.urlopen(url + "/api/v1/status/flags", timeout=5) as r:
            return json.load(r)["data"].get("config.file") == config_path
    except (OSError, ValueError, KeyError):
        return False


@contextmanager
def serving(directory, config: dict, flags=()) -> Iterator[str]:
    """Its URL once it answers /-/ready and is ours (the test fails with its
    log if it never is); stopped when the block ends. A port another program
    took first (picked free, then taken before ours bound it) is given up for
    another, up to STARTS times."""
    require()
    path = os.path.join(directory, "prometheus.yml")
    for _attempt in range(STARTS):
        port = free_port()
        proc = launch(directory, config, port, flags)
        url = f"http://127.0.0.1:{port}"
        deadline, answered, ours = time.monotonic() + 60, False, False
        while proc.poll() is None and time.monotonic() < deadline and not answered:
            try:
                wait_ready(url, timeout=1)
            except DetectionTimeout:
                continue
            answered, ours = True, answers_for(url, path)
        if ours and proc.poll() is None:
            break
        proc.terminate()
        proc.wait(timeout=30)
        with open(os.path.join(directory, "prometheus.log")) as f:
            log = f.read()
        # another program on the port (ours could not bind it, or another
        # server answered there): try another port; anything else is a failure
        if not (answered or "address already in use" in log):
            pytest.fail(f"Prometheus did not start:\n{log}")
    else:
        pytest.fail(f"Prometheus found no free port of its own in {STARTS} tries")
    try:
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=30)
