"""Cgroups named as a hostile user with a delegated subtree may name them,
made for real in the cgroup v2 tree, with a real process in each doing I/O
and holding a TCP connection to a loopback listener: the running agent's
/metrics stays whole in every format, an agent started beside them becomes
ready, and `tracehound top` shows their names inert in a real terminal."""
import gzip
import os
import shlex
import shutil
import socket
import subprocess
import sys
import urllib.error
import urllib.request
import uuid

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.conftest import tracehound_cmd
from tests.kernel.conftest import remove_cgroup, start_agent, stop_agent
from tests.kernel.test_top import cells, tmux  # noqa: F401 - the tmux fixture
from tests.unit.test_protobuf import decode, label_dict
from tests.unit.waiting import wait_until

# Joins nothing itself (the shell that execs it did): connects to the port in
# argv[1], then writes 64 KiB to the file in argv[2] every 10 ms until killed.
BUSY = r"""
import os, socket, sys, time
conn = socket.create_connection(("127.0.0.1", int(sys.argv[1])))
fd = os.open(sys.argv[2], os.O_RDWR | os.O_CREAT, 0o644)
buf = b"x" * 65536
end = time.monotonic() + 120
while time.monotonic() < end:
    os.pwrite(fd, buf, 0)
    conn.sendall(b"x")
    time.sleep(0.01)
"""
OM = "application/openmetrics-text; version=1.0.0"
PROTOBUF = ("application/vnd.google.protobuf; proto=io.prometheus.client.MetricFamily; "
            "encoding=delimited")


@pytest.fixture
def listener():
    with socket.create_server(("127.0.0.1", 0), backlog=16) as srv:
        yield srv.getsockname()[1]


class HostileCgroup:
    """A cgroup at `raw` (bytes, below the v2 root) with BUSY running in it."""

    def __init__(self, root: bytes, raw: bytes, port: int, data: str):
        self.path = root + raw
        os.makedirs(self.path)
        self.proc = subprocess.Popen(
            [b"sh", b"-c", b'echo $$ > "$0" && exec "$@"', self.path + b"/cgroup.procs",
             os.fsencode(sys.executable), b"-c", BUSY.encode(), str(port).encode(),
             os.fsencode(data)])

    def close(self) -> None:
        self.proc.kill()
        self.proc.wait(timeout=20)
        remove_cgroup(self.path)


@pytest.fixture
def hostile_cgroups(cgroup_root, tmpfs, listener):
    """Yields a function making HostileCgroups below one parent, all removed
    (by their bytes) however the test ends; and the parent's relative path."""
    rel = f"/thtest/names-{uuid.uuid4().hex[:8]}"
    root = os.fsencode(cgroup_root)
    made = []

    def make(name: bytes) -> HostileCgroup:
        group = HostileCgroup(root + os.fsencode(rel) + b"/", name, listener,
                              os.path.join(tmpfs, f"{uuid.uuid4().hex[:8]}"))
        made.append(group)
        return group

    try:
        yield make, rel
    finally:
        for group in made:
            group.close()
        remove_cgroup(root + os.fsencode(rel))


def get(url: str, **headers) -> tuple[int, dict, bytes]:
    req = urllib.request.Request(url, headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, dict(r.headers), r.read()     # IncompleteRead: a cut body
    except urllib.error.HTTPError as exc:
        return exc.code, dict(exc.headers), exc.read()


def cgroups_in(text: str, family: str) -> set:
    return {s.labels.get("cgroup") for f in text_string_to_metric_families(text)
            if f.name == family for s in f.samples}


def test_a_cgroup_named_with_non_utf8_bytes_leaves_every_scrape_whole(agent, hostile_cgroups):
    make, rel = hostile_cgroups
    make(b"bad\xff\xfe")
    shown = f"{rel}/bad\ufffd\ufffd"

    def labelled() -> bool:
        text = get(agent.url)[2].decode("utf-8")
        return shown in cgroups_in(text, "tracehound_io_write_bytes") and \
            shown in cgroups_in(text, "tracehound_net_tcp_sockets")

    wait_until(labelled, f"{shown!r} labelling both its I/O and its socket")
    status, _, plain = get(agent.url)
    text = plain.decode("utf-8")
    families = [f.name for f in text_string_to_metric_families(text)]
    # whole: the scrape's own families come last, and none was left out
    assert status == 200 and families[-1] == "tracehound_scrape_samples", families[-3:]
    status, headers, packed = get(agent.url, **{"Accept-Encoding": "gzip"})
    assert status == 200 and headers.get("Content-Encoding") == "gzip"
    assert shown in cgroups_in(gzip.decompress(packed).decode("utf-8"),
                               "tracehound_io_write_bytes")
    status, _, om = get(agent.url, Accept=OM)
    assert status == 200 and om.decode("utf-8").endswith("# EOF\n")
    status, _, packed = get(agent.url, Accept=PROTOBUF)
    families = decode(packed)                  # each message whole, to the last byte
    assert status == 200 and families[-1].name == "tracehound_scrape_samples"
    assert shown in {label_dict(m).get("cgroup") for f in families
                     if f.name == "tracehound_io_write_bytes_total" for m in f.metric}
    res = subprocess.run([shutil.which("promtool") or "promtool", "check", "metrics"],
                         input=plain, capture_output=True, timeout=60)
    assert res.returncode == 0, res.stdout + res.stderr


def test_an_agent_started_beside_a_non_utf8_cgroup_becomes_ready(hook_mode, hostile_cgroups):
    """It watches every cgroup directory from its start, this one too."""
    make, rel = hostile_cgroups
    make(b"bad\xff\xfe")
    shown = f"{rel}/bad\ufffd\ufffd"
    second = start_agent(hook_mode)
    try:
        base = second.url.removesuffix("/metrics")
        wait_until(lambda: get(base + "/readyz")[0] == 200, "the second agent's readiness")
        wait_until(lambda: shown in cgroups_in(get(second.url)[2].decode("utf-8"),
                                               "tracehound_io_write_bytes"),
                   f"the second agent labelling {shown!r}")
    finally:
        stop_agent(second)


def test_top_shows_a_cgroup_named_with_a_carriage_return_and_escapes_inert(agent, tmux,
                                                                          hostile_cgroups):
    make, rel = hostile_cgroups
    make(b"cr\rname\x1b[2J\x1b[31mred")
    make(b"plain")
    tag = rel.rsplit("/", 1)[1]
    top = " ".join(shlex.quote(a) for a in tracehound_cmd() + [
        "top", "--url", agent.url, "--filter", tag, "--interval", "1"])
    tmux.type(f"clear; {top}")
    tmux.key("Enter")
    escaped = f"{rel}/cr\\rname\\x1b[2J\\x1b[31mred"

    def both_rows(screen: str) -> bool:
        names = [cells(line)[0] for line in screen.splitlines() if cells(line)]
        return escaped in names and f"{rel}/plain" in names

    screen = tmux.wait_for(both_rows, "both cgroups' rows, the hostile name escaped")
    # the header is still there (no clear-screen ran) and each row is one whole row
    assert "tracehound top" in screen.splitlines()[0], screen
    for line in screen.splitlines():
        if line.strip().startswith(rel):
            assert len(cells(line)) == 9, line
    tmux.key("q")
