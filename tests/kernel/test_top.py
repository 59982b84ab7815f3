"""`tracehound top` against the real agent: the live view driven in a real
terminal (tmux), and the one-shot JSON checked against the exporter's own
numbers."""
import http.server
import json
import math
import os
import re
import shlex
import signal
import subprocess
import sys
import threading
import time
import urllib.parse
import urllib.request
import uuid

import pytest

from tests.conftest import tracehound_cmd
from tests.kernel.conftest import (exec_in_cgroup, mount_of, require_tools, run_in_cgroup,
                                   series)

# Writes (or reads) 1 MiB in 64 KiB calls every 10 ms at offset 0 of a tmpfs
# file until killed: steady bandwidth without filling the file system.
LOOP = r"""
import os, sys, time
op, path = sys.argv[1], sys.argv[2]
fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
buf = b"x" * 65536
os.pwrite(fd, buf, 0)
end = time.monotonic() + 120
while time.monotonic() < end:
    for _ in range(16):
        os.pwrite(fd, buf, 0) if op == "write" else os.pread(fd, 65536, 0)
    time.sleep(0.01)
"""
OPS = {"writer": "write", "reader": "read"}


@pytest.fixture
def workloads(cgroup_root, tmpfs):
    """A writer and a reader, each looping in its own fresh cgroup under one
    uniquely named parent; yields (tag, writer cgroup, reader cgroup)."""
    tag = f"top-{uuid.uuid4().hex[:8]}"
    parent = f"/thtest/{tag}"
    groups = {name: f"{parent}/{name}" for name in ("writer", "reader")}
    procs = []
    try:
        for name, rel in groups.items():
            os.makedirs(cgroup_root + rel)
            path = os.path.join(tmpfs, f"{tag}-{name}")
            procs.append(subprocess.Popen(
                ["sh", "-c", 'echo $$ > "$0" && exec "$@"', cgroup_root + rel + "/cgroup.procs",
                 sys.executable, "-c", LOOP, OPS[name], path]))
        yield tag, groups["writer"], groups["reader"]
    finally:
        for p in procs:
            p.terminate()
            p.wait(timeout=10)
        for rel in [*groups.values(), parent]:
            for _ in range(50):
                try:
                    os.rmdir(cgroup_root + rel)
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    time.sleep(0.1)


class Tmux:
    """One private tmux server (its own socket) running a plain shell."""

    def __init__(self):
        self.socket = f"thtest-top-{uuid.uuid4().hex[:8]}"
        self.tmux("new-session", "-d", "-s", "top", "-x", "200", "-y", "50",
                  "env LANG=C.UTF-8 PS1='$ ' bash --norc --noprofile")
        self.socket_path = self.tmux("display-message", "-p", "#{socket_path}").strip()

    def tmux(self, *args) -> str:
        return subprocess.run(["tmux", "-L", self.socket, *args], capture_output=True,
                              text=True, check=True, timeout=10).stdout

    def type(self, text: str) -> None:
        self.tmux("send-keys", "-t", "top", "-l", text)

    def key(self, name: str) -> None:
        self.tmux("send-keys", "-t", "top", name)

    def screen(self) -> str:
        return self.tmux("capture-pane", "-p", "-t", "top")

    def wait_for(self, predicate, what: str, timeout: float = 20) -> str:
        deadline = time.monotonic() + timeout
        while True:
            text = self.screen()
            if predicate(text):
                return text
            if time.monotonic() > deadline:
                pytest.fail(f"screen never showed {what}:\n{text}")
            time.sleep(0.2)

    def shell_child(self) -> int:
        """pid of the command the pane's shell is running."""
        shell = int(self.tmux("list-panes", "-t", "top", "-F", "#{pane_pid}").strip())
        with open(f"/proc/{shell}/task/{shell}/children") as f:
            return int(f.read().split()[0])

    def close(self) -> None:
        subprocess.run(["tmux", "-L", self.socket, "kill-server"], capture_output=True, timeout=10)
        # the server leaves its socket file behind
        if self.socket_path and os.path.exists(self.socket_path):
            os.unlink(self.socket_path)


@pytest.fixture
def tmux():
    require_tools("tmux")
    t = Tmux()
    yield t
    t.close()


def cells(line: str) -> list[str]:
    return re.split(r"\s{2,}", line.strip())


def row_line(screen: str, name: str, fstype: str = "tmpfs"):
    """The I/O table line of a workload on a file system, or None."""
    for line in screen.splitlines():
        c = cells(line)
        if c and c[0] == name and len(c) == 9 and c[2].endswith(f"({fstype})"):
            return line
    return None


def line_index(screen: str, name: str) -> int:
    return screen.splitlines().index(row_line(screen, name))


def terminal_is_sane(screen: str, marker: str) -> bool:
    """`stty -a` printed after the marker shows canonical mode and echo back on."""
    after = screen.split(marker, 1)[1]
    return re.search(r"(?<![-\w])icanon\b", after) is not None and \
        re.search(r"(?<![-\w])echo\b", after) is not None


def assert_exited(tmux, marker: str, code: int, what: str) -> None:
    """top ended with `code` (the shell echoed MARKER=code, then ran
    `stty -a`), without a traceback, and left the terminal sane."""
    # `stty -a` prints its lines one by one: wait for the one with the local
    # modes (icanon or -icanon, then echo), not just its first line
    screen = tmux.wait_for(lambda s: f"{marker}=" in s and re.search(
        r"(?<![\w])-?icanon\b", s.split(f"{marker}=", 1)[1]) is not None, what)
    assert f"{marker}={code}" in screen and "Traceback" not in screen, screen
    assert terminal_is_sane(screen, f"{marker}={code}"), screen


def relaunch(tmux, top: str, marker: str, what: str) -> None:
    tmux.type(f"clear; {top}; echo {marker}=$?; stty -a")
    tmux.key("Enter")
    tmux.wait_for(lambda s: "tracehound top" in s and "WRITE/s" in s, what)


def test_live_view_in_a_terminal(agent, workloads, tmux):
    tag, writer, reader = workloads
    top = " ".join(shlex.quote(a) for a in tracehound_cmd() + ["top", "--url", agent.url])
    tmux.type(f"{top}; echo EXIT=$?; stty -a")
    tmux.key("Enter")

    # the writer's row appears with a non-zero write bandwidth (default sort: write)
    def writer_writes(text):
        line = row_line(text, writer)
        return line is not None and cells(line)[4] not in ("0 B", "")
    screen = tmux.wait_for(writer_writes, "the writer's row with write bandwidth")
    assert "WRITE/s ▼" in screen and "Traceback" not in screen

    # `/` narrows to this test's workloads while typing; Enter keeps the filter
    tmux.type("/" + tag)
    tmux.key("Enter")
    screen = tmux.wait_for(lambda s: f"filter: {tag}" in s and row_line(s, writer)
                           and row_line(s, reader), "the filtered rows")
    names = [cells(x)[0] for x in screen.splitlines() if re.search(r" \(\w+\)\s", x)]
    assert names and all(tag in n for n in names), screen

    # sort keys reorder the two rows
    tmux.type("r")
    screen = tmux.wait_for(lambda s: "READ/s ▼" in s and row_line(s, writer)
                           and row_line(s, reader), "the read sort")
    assert line_index(screen, reader) < line_index(screen, writer), screen
    tmux.type("w")
    screen = tmux.wait_for(lambda s: "WRITE/s ▼" in s and row_line(s, writer)
                           and row_line(s, reader), "the write sort")
    assert line_index(screen, writer) < line_index(screen, reader), screen

    # a narrower filter drops the reader
    tmux.type("/")
    tmux.key("BSpace")       # the filter being edited starts as the current one
    tmux.type(tag[-1] + "/writer")
    tmux.key("Enter")
    screen = tmux.wait_for(lambda s: f"filter: {tag}/writer" in s and row_line(s, writer),
                           "the writer-only filter")
    assert row_line(screen, reader) is None, screen

    # tab shows the other panels, "no data" where this host has no such metrics
    tmux.key("Tab")
    tmux.wait_for(lambda s: ("Jobs: none" in s or "CGROUPS" in s) and "WRITE/s ▼" not in s,
                  "the jobs panel")
    tmux.key("Tab")
    tmux.wait_for(lambda s: "RDMA objects" in s, "the RDMA panel")
    tmux.key("Tab")
    tmux.wait_for(lambda s: "GPU" in s and "WRITE/s" not in s, "the GPU panel")

    # q quits cleanly and leaves the terminal as it found it
    tmux.type("q")
    assert_exited(tmux, "EXIT", 0, "the exit status and stty output")

    # SIGTERM restores the terminal too
    relaunch(tmux, top, "EXIT2", "the second live view")
    os.kill(tmux.shell_child(), signal.SIGTERM)
    assert_exited(tmux, "EXIT2", 143, "the exit status after SIGTERM")

    # and so does Ctrl-C
    relaunch(tmux, top, "EXIT3", "the third live view")
    tmux.key("C-c")
    assert_exited(tmux, "EXIT3", 130, "the exit status after Ctrl-C")


class ScrapeProxy:
    """Relays scrapes to the agent and, right after relaying the first, runs
    a known write in the cgroup: the write lands between the two scrapes
    `top --once` takes, and nothing else runs in that cgroup."""

    def __init__(self, agent_url, on_first):
        self.bodies, self.errors = [], []
        proxy = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                with urllib.request.urlopen(agent_url, timeout=10) as r:
                    body = r.read()
                proxy.bodies.append(body.decode())
                if len(proxy.bodies) == 1:
                    try:
                        on_first()
                    except Exception as exc:  # reported by the test, not lost in this thread
                        proxy.errors.append(exc)
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/metrics"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


def scraped_total(text: str, name: str, **labels) -> float:
    from prometheus_client.parser import text_string_to_metric_families
    metrics = {(s.name, frozenset(s.labels.items())): s.value
               for fam in text_string_to_metric_families(text) for s in fam.samples}
    return series(metrics, name, **labels)


def top_once_around(agent, cgroup: str, made: str, work):
    """`top --once --json` for `cgroup` through a ScrapeProxy that runs `work`
    between its two scrapes; removes the file `made` afterwards."""
    proxy = ScrapeProxy(agent.url, work)
    try:
        res = subprocess.run(tracehound_cmd() + ["top", "--url", proxy.url, "--once", "--json",
                                                 "--interval", "2", "--filter", cgroup],
                             capture_output=True, text=True, timeout=60)
    finally:
        proxy.close()
        if os.path.exists(made):
            os.unlink(made)
    return proxy, res


def test_once_json_matches_the_exporter(agent, cgroup_root, cgroup, tmpfs):
    size, chunk = 5 * 2**20 + 4321, 65536
    path = os.path.join(tmpfs, f"top-once-{uuid.uuid4().hex[:8]}")
    mnt = mount_of(tmpfs)
    proxy, res = top_once_around(agent, cgroup, path, lambda: run_in_cgroup(
        cgroup_root, cgroup, [["write", path, size, chunk]]))
    assert not proxy.errors, proxy.errors
    assert res.returncode == 0, res.stderr
    doc = json.loads(res.stdout)
    assert len(proxy.bodies) == 2
    rows = [r for r in doc["io"] if r["mountpoint"] == mnt]
    assert len(rows) == 1, doc["io"]
    row = rows[0]
    assert (row["kind"], row["name"], row["cgroups"], row["fstype"]) == \
        ("cgroup", cgroup, [cgroup], "tmpfs")

    lb = {"cgroup": cgroup, "mountpoint": mnt}
    before, after = (scraped_total(b, "tracehound_io_write_bytes_total", **lb)
                     for b in proxy.bodies)
    direct = agent.scrape()
    # the exporter saw exactly the known write between the two scrapes...
    assert (before, after) == (0, size)
    assert series(direct, "tracehound_io_write_bytes_total", **lb) == size
    # ...and top's rate times its interval gives it back
    seconds = doc["interval_seconds"]
    assert row["write_bytes_per_second"] * seconds == pytest.approx(size, rel=1e-9)
    assert row["write_bytes_total"] == size and row["read_bytes_total"] == 0
    calls = -(-size // chunk)
    assert row["write_ops_per_second"] * seconds == pytest.approx(calls, rel=1e-9)
    assert row["read_bytes_per_second"] == 0 and row["errors_per_second"] == 0
    p50, p99 = row["latency_p50_seconds"], row["write_latency_p99_seconds"]
    assert p50 is not None and 0 < p50 <= p99 < math.inf


def test_a_dd_loop_shows_no_errors(agent, cgroup_root, cgroup, tmpfs):
    """Programs starting up fail name lookups by the dozen (libraries, locale
    and config files): counted as not found, they are no errors in top."""
    out = os.path.join(tmpfs, f"top-dd-{uuid.uuid4().hex[:8]}")
    loop = (f'for i in $(seq 20); do dd if=/dev/zero of={out} bs=4k count=4 2>/dev/null; '
            f'cat {out}.missing 2>/dev/null; done; true')
    proxy, res = top_once_around(agent, cgroup, out, lambda: exec_in_cgroup(
        cgroup_root, cgroup, ["sh", "-c", loop]))
    assert not proxy.errors and res.returncode == 0, (proxy.errors, res.stderr)
    m = agent.scrape()
    # cat's open of the missing file, 20 times; dd's own start-up may add more
    assert series(m, "tracehound_io_open_not_found_total", cgroup=cgroup) >= 20
    for op in ("open", "read", "write"):
        assert series(m, f"tracehound_io_{op}_errors_total", cgroup=cgroup) == 0, op
    assert series(m, "tracehound_io_write_bytes_total", cgroup=cgroup,
                  mountpoint=mount_of(tmpfs)) == 20 * 16384
    rows = json.loads(res.stdout)["io"]
    assert rows and all(r["errors_per_second"] == 0 for r in rows), rows
