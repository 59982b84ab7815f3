"""One server under test, alone in its process, so that its threads and
resident memory are its own (/proc/PID/status):

    python -m bench.http_server.serve agent|library LABEL_SETS [CERT KEY]

`agent` is the exporter the agent runs (tracehound.exporter.server.Exporter,
from this checkout's src/, which the benchmark puts first on PYTHONPATH, with its defaults: 64 connections, 10 s idle
deadline), with prometheus_client's WSGI app beside /metrics on /plain, so
that the server alone can be told from the renderer. `library` is
prometheus_client.start_http_server (ThreadingWSGIServer) over the same
registry. With CERT and KEY both serve HTTPS. Prints one JSON line (port),
then serves until its stdin closes.
"""
from __future__ import annotations

import json
import os
import random
import sys
import tempfile

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

DEVICES = ("nvme0n1", "nvme1n1", "sda")
OPS = ("read", "write", "fsync", "open")


def registry_of(label_sets: int, seed: int = 1) -> CollectorRegistry:
    """A node agent's kind of registry: per-cgroup I/O counters (60% of the
    label sets), per-pod GPU gauges (30%) and per-device latency histograms
    (10%), with kubepods cgroup paths as label values. The same seed gives
    the same series and values in both servers' processes."""
    rnd = random.Random(seed)
    registry = CollectorRegistry()
    io = Counter("bench_io_bytes", "Bytes moved, per cgroup, device and operation.",
                 ["cgroup", "device", "op"], registry=registry)
    gpu = Gauge("bench_gpu_memory_used_bytes", "GPU memory a pod's processes hold.",
                ["gpu", "uuid", "pod", "namespace"], registry=registry)
    lat = Histogram("bench_io_latency_seconds", "I/O latency, per cgroup and device.",
                    ["cgroup", "device"], registry=registry)

    def cgroup():
        return ("/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod"
                f"{rnd.getrandbits(128):032x}.slice/cri-containerd-{rnd.getrandbits(256):064x}"
                ".scope")

    n_io, n_gpu = label_sets * 6 // 10, label_sets * 3 // 10
    n_lat = label_sets - n_io - n_gpu
    groups = [cgroup() for _ in range(max(1, n_io // (len(DEVICES) * len(OPS)) + 1))]
    done = 0
    for cg in groups:
        for dev in DEVICES:
            for op in OPS:
                if done < n_io:
                    io.labels(cg, dev, op).inc(rnd.randrange(1 << 40))
                    done += 1
    for i in range(n_gpu):
        gpu.labels(str(i % 8), f"GPU-{rnd.getrandbits(128):032x}", f"train-{i // 8}-worker",
                   f"team-{i % 17}").set(rnd.randrange(1 << 36))
    for i in range(n_lat):
        h = lat.labels(groups[i % len(groups)], DEVICES[i % len(DEVICES)])
        for _ in range(20):
            h.observe(rnd.expovariate(500.0))
    return registry


def _agent(registry, tls):
    from prometheus_client import make_wsgi_app
    from tracehound.exporter import webconfig
    from tracehound.exporter.server import Exporter
    web = None
    if tls:
        cert, key = tls
        with tempfile.NamedTemporaryFile("w", suffix=".yml", delete=False) as f:
            f.write(f"tls_server_config:\n  cert_file: {cert}\n  key_file: {key}\n")
        web = webconfig.load(f.name)
        os.unlink(f.name)
    exporter = Exporter(registry, "127.0.0.1:0", {"/plain": make_wsgi_app(registry)},
                        web_config=web).start()
    exporter.set_ready(True)
    return exporter.port


def _library(registry, tls):
    from prometheus_client import start_http_server
    cert, key = tls or (None, None)
    httpd, _thread = start_http_server(0, addr="127.0.0.1", registry=registry,
                                       certfile=cert, keyfile=key)
    return httpd.server_port


def main(argv: list[str]) -> None:
    kind, label_sets = argv[0], int(argv[1])
    tls = (argv[2], argv[3]) if len(argv) >= 4 else None
    registry = registry_of(label_sets)
    port = {"agent": _agent, "library": _library}[kind](registry, tls)
    print(json.dumps({"port": port, "pid": os.getpid()}), flush=True)
    sys.stdin.read()             # serve until the benchmark closes our stdin (or dies)


if __name__ == "__main__":
    main(sys.argv[1:])
