"""A real Prometheus for the tests and benchmarks (Debian's
/usr/bin/prometheus): started on a free port with the caller's
configuration, its output kept in a log beside it, and stopped afterwards."""
import os
import socket
import subprocess
from contextlib import contextmanager
from typing import Iterator

import pytest
import yaml

from tracehound.clients.prometheus import DetectionTimeout, wait_ready

PROMETHEUS = "/usr/bin/prometheus"


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


@contextmanager
def serving(directory, config: dict, flags=()) -> Iterator[str]:
    """Its URL once it answers /-/ready (the test fails with its log if it
    never does); stopped when the block ends."""
    require()
    port = free_port()
    proc = launch(directory, config, port, flags)
    url = f"http://127.0.0.1:{port}"
    try:
        try:
            wait_ready(url, timeout=60)
        except DetectionTimeout:
            with open(os.path.join(directory, "prometheus.log")) as f:
                pytest.fail(f"Prometheus did not start:\n{f.read()}")
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=30)
