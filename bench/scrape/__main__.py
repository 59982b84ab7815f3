#!/usr/bin/env python3
"""What one Prometheus scrape of the tracehound agent costs as the number of
(cgroup, mount) series grows: wall time, bytes (text, gzip, protobuf), agent
CPU per scrape and memory; next to Debian's node_exporter and to an earlier
revision of the agent. Run as root:  python -m bench.scrape [--quick]

  NxM        real I/O: N cgroups x M private tmpfs mounts; one worker process
             hops through the cgroups and writes, reads (now and then
             fsyncs) a file on every mount, so every pair is a map entry
  fill NxM   the same entries written straight into the agent's io_stats
             map (bench/scrape/mapfill.py): sizes real I/O would take too long for
"""
from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import functools
import http.client
import os
import platform
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from urllib.parse import urlsplit

from bench.common import REPO, REPORT, commit, cpu_model, loadavg, sh, verdict
from bench.common import log as log_to
from bench.scrape.client import TEXT, cpu_seconds, get, memory_kb, scrape_series, size_of
from bench.scrape.mapfill import Workload, remove_cgroup, unmount_under
from bench.scrape.report import CG_PARENT, write_reports

from tracehound.host.mounts import MountTable
from tracehound.terminal_progress import steps

PYTHON = REPO / ".venv/bin/python"
TRACEHOUND = REPO / ".venv/bin/tracehound"
NODE_EXPORTER = "/usr/bin/prometheus-node-exporter"
# progress on stderr: stdout is left to what the run is asked to print
log = functools.partial(log_to, stream=sys.stderr)


class Service:
    """A server under test; its output is drained so a full pipe never stalls it."""

    def __init__(self, name: str, cmd: list, env: dict | None = None):
        self.name, self.cmd, self.env = name, [str(c) for c in cmd], env
        self.lines: list[str] = []
        self.proc: subprocess.Popen | None = None
        self.url = ""

    def start(self, url: str = "", ready: str = "/readyz", timeout: float = 90) -> "Service":
        self.proc = subprocess.Popen(self.cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     text=True, env=self.env, start_new_session=True)
        threading.Thread(target=self._drain, daemon=True).start()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and self.proc.poll() is None:
            self.url = url or next((m.group(1) for l in list(self.lines)
                                    if (m := re.search(r"serving metrics on (\S+)", l))), "")
            if self.url:
                with contextlib.suppress(OSError, http.client.HTTPException):
                    probe = self.url.rsplit("/", 1)[0] + ready if ready else self.url
                    if get(probe, {}, 10).status == 200:
                        return self
            time.sleep(0.1)
        self.stop()
        raise RuntimeError(f"{self.name} did not get ready:\n" + "\n".join(self.lines[-20:]))

    def _drain(self) -> None:
        for line in self.proc.stdout:
            self.lines.append(line.rstrip())

    @property
    def pid(self) -> int:
        return self.proc.pid

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()


def held_and_sigterm(agent: Service, n: int, timeout: float) -> dict:
    """A scrape while n idle connections are held open, then SIGTERM with them
    still held: the agent must neither stall nor hang on them."""
    u = urlsplit(agent.url)
    socks = [socket.create_connection((u.hostname, u.port), timeout=5) for _ in range(n)]
    try:
        r = get(agent.url, {"Accept": TEXT}, timeout)
        open_now = 0
        for s in socks:
            s.setblocking(False)
            try:
                open_now += s.recv(1, socket.MSG_PEEK) != b""
            except BlockingIOError:
                open_now += 1
        t0 = time.monotonic()
        agent.proc.send_signal(signal.SIGTERM)
        try:
            code, exit_s = agent.proc.wait(timeout=30), time.monotonic() - t0
        except subprocess.TimeoutExpired:
            code, exit_s = None, None
        return {"connections": n, "scrape_s": r.wall, "status": r.status,
                "open_at_sigterm": open_now, "exit_s": exit_s, "exit_code": code}
    finally:
        for s in socks:
            s.close()


# ---- runs ----------------------------------------------------------------------

def measure(args, impl: str, tree: Path, wl: Workload, kind: str, max_series: int | None,
            extras: bool = False, histograms: str | None = None) -> dict:
    entries = wl.n * wl.m
    max_entries = 2 * entries + 1024 if kind == "io" else entries + 10000
    cmd = [TRACEHOUND, "run", "--listen", "127.0.0.1:0", "--max-entries", max_entries]
    cmd += ["--max-series", max_series] if max_series else []
    cmd += ["--latency-histograms", histograms] if histograms else []
    # the workload's cgroups are made in the v2 tree: on a hybrid host the
    # agent's own choice would count by a v1 hierarchy, where they are one
    cmd += ["--cgroup-key", "v2"] if impl == "new" else []
    rec = {"impl": impl, "kind": kind, "size": f"{wl.n}x{wl.m}", "cgroups": wl.n, "mounts": wl.m,
           "max_entries": max_entries, "max_series": max_series, "latency_histograms": histograms,
           "command": " ".join(map(str, cmd[1:]))}
    agent = Service(f"tracehound ({impl})", cmd, dict(os.environ, PYTHONPATH=str(tree / "src")))
    try:
        log(f"{impl} {kind} {rec['size']}: starting the agent")
        agent.start()
        log(f"{impl} {kind} {rec['size']}: " + ("running the I/O worker" if kind == "io" else
                                                 f"writing {entries} map entries"))
        rec["workload"] = wl.drive_io() if kind == "io" else wl.fill(tree, agent.pid)
        log(f"{impl} {kind} {rec['size']}: warm-up + {args.scrapes} scrapes")
        rec.update(scrape_series(agent.url, agent.pid, args.scrapes, args.scrape_timeout))
        if extras and "error" not in rec:
            log(f"{impl} {rec['size']}: {args.held} idle connections, scrape, SIGTERM")
            rec["held"] = held_and_sigterm(agent, args.held, args.scrape_timeout)
    except (RuntimeError, OSError, subprocess.SubprocessError) as e:
        # a failed case is reported and the others still run
        tail = (getattr(e, "stderr", None) or "").strip()
        rec["error"] = f"{e}".strip() + (f": {tail.splitlines()[-1]}" if tail else "")
    finally:
        agent.stop()
        rec["agent_tail"] = agent.lines[-3:]
    return rec


def peer(args) -> dict:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ne = Service("node_exporter", [args.node_exporter, f"--web.listen-address=127.0.0.1:{port}"])
    try:
        ne.start(url=f"http://127.0.0.1:{port}/metrics", ready="")
        version = subprocess.run([args.node_exporter, "--version"], capture_output=True, text=True)
        rec = {"impl": "node_exporter", "command": " ".join(ne.cmd),
               "version": re.search(r"version (\S+)", version.stdout + version.stderr).group(1)}
        rec.update(scrape_series(ne.url, ne.pid, args.scrapes, args.scrape_timeout))
        return rec
    finally:
        ne.stop()


def idle(args, tree: Path, wl: Workload) -> dict:
    """CPU share of the agent over minutes, scraped at a fixed interval."""
    entries = wl.n * wl.m
    agent = Service("tracehound (idle)", [TRACEHOUND, "run", "--listen", "127.0.0.1:0",
                                          "--max-entries", 2 * entries + 1024],
                    dict(os.environ, PYTHONPATH=str(tree / "src")))
    try:
        agent.start()
        wl.drive_io()
        get(agent.url, {"Accept": TEXT}, args.scrape_timeout)
        walls, t0, cpu0 = [], time.monotonic(), cpu_seconds(agent.pid)
        end = t0 + args.idle_minutes * 60
        while time.monotonic() < end:
            walls.append(get(agent.url, {"Accept": TEXT, "Accept-Encoding": "gzip"},
                             args.scrape_timeout).wall)
            time.sleep(max(0.0, min(end, t0 + len(walls) * args.idle_interval) - time.monotonic()))
        cpu = cpu_seconds(agent.pid) - cpu0
        return {"size": f"{wl.n}x{wl.m}", "minutes": args.idle_minutes,
                "interval_s": args.idle_interval, "scrapes": len(walls),
                "scrape_median_s": statistics.median(walls), "cpu_s": cpu,
                "cpu_pct": 100 * cpu / (time.monotonic() - t0), **memory_kb(agent.pid)}
    finally:
        agent.stop()


def export(rev: str, dest: Path) -> Path:
    """A revision's tree with its probes built, beside the working tree."""
    dest.mkdir()
    archive = subprocess.Popen(["git", "-C", REPO, "archive", rev], stdout=subprocess.PIPE)
    subprocess.run(["tar", "-x", "-C", dest], stdin=archive.stdout, check=True)
    if archive.wait():
        raise RuntimeError(f"git archive {rev} failed")
    sh(["make", "-C", dest / "src/tracehound/probes"])
    return dest


def revision(rev: str) -> str:
    try:
        return sh(["git", "-C", REPO, "rev-parse", "--short=12", rev]).strip()
    except subprocess.CalledProcessError:
        return f"unknown ({rev} is not a commit of {REPO})"


def facts(args) -> dict:
    mem = re.search(r"MemTotal:\s+(\d+)", Path("/proc/meminfo").read_text())
    return {"date": dt.datetime.now().astimezone().isoformat(timespec="seconds"),
            "cpu": cpu_model() or "?", "nproc": os.cpu_count(),
            "memory_gib": round(int(mem.group(1)) / 2**20, 1), "kernel": platform.release(),
            "python": platform.python_version(), "agent_tree": str(args.tree),
            # the code's commit, as every report stamps it: commits of reports alone do not move it
            "agent_revision": commit(args.tree),
            "baseline_revision": None if args.no_baseline else revision(args.baseline_rev),
            "loadavg_start": loadavg()}


def main() -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.scrape",
                                 description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="smoke test: 50x2, fill 500x2, 3 scrapes")
    ap.add_argument("--out", type=Path, default=REPORT)
    ap.add_argument("--tree", type=Path, default=REPO, help="source tree of the agent measured")
    ap.add_argument("--sizes", help="real-I/O sizes NxM, comma-separated (default 200x4,1000x4,2000x4)")
    ap.add_argument("--fill", help="map-fill size NxM (default 10000x8)")
    ap.add_argument("--no-fill", action="store_true")
    ap.add_argument("--scrapes", type=int, help="timed scrapes per size (default 5, quick 3)")
    ap.add_argument("--scrape-timeout", type=float, default=120.0, metavar="S")
    ap.add_argument("--baseline-rev", default="87c4a80")
    ap.add_argument("--no-baseline", action="store_true")
    ap.add_argument("--baseline-sizes", help="sizes the baseline runs: NxM of --sizes, 'fill' "
                    "(default: all real-I/O sizes and fill; quick: the first size)")
    ap.add_argument("--held", type=int, default=50, help="idle connections held open")
    ap.add_argument("--idle-minutes", type=float, default=0, help="0: skip the idle-CPU run")
    ap.add_argument("--idle-size", default="500x4")
    ap.add_argument("--idle-interval", type=float, default=15.0)
    ap.add_argument("--node-exporter", default=NODE_EXPORTER)
    ap.add_argument("--histograms", default="mount", metavar="WHERE,...",
                    help="also run the largest real-I/O size with --latency-histograms WHERE "
                         "(default mount; '' for none)")
    args = ap.parse_args()
    args.histograms = [h for h in args.histograms.split(",") if h]
    sizes = [size_of(s) for s in (args.sizes or ("50x2" if args.quick else "200x4,1000x4,2000x4")).split(",")]
    fill_size = None if args.no_fill else size_of(args.fill or ("500x2" if args.quick else "10000x8"))
    args.scrapes = args.scrapes or (3 if args.quick else 5)
    base_sizes = set(args.baseline_sizes.split(",") if args.baseline_sizes else
                     [f"{n}x{m}" for n, m in sizes[:1 if args.quick else None]]
                     + ([] if args.quick else ["fill"]))
    args.tree = args.tree.resolve()
    if os.geteuid() != 0:
        sys.exit("run as root: loading BPF, mounting tmpfs and making cgroups need it")
    cg_root = MountTable().cgroup2_root()
    if cg_root is None:
        sys.exit("no cgroup v2 hierarchy mounted")

    def bail(signum, _frame):
        raise KeyboardInterrupt(f"signal {signum}")
    signal.signal(signal.SIGTERM, bail)
    signal.signal(signal.SIGHUP, bail)

    started = time.monotonic()
    cg_parent = Path(cg_root) / CG_PARENT
    remove_cgroup(cg_parent)  # what a killed run left
    with contextlib.ExitStack() as stack:
        tmp = Path(tempfile.mkdtemp(prefix="thb-"))
        stack.callback(shutil.rmtree, tmp, ignore_errors=True)
        stack.callback(remove_cgroup, cg_parent)
        stack.callback(unmount_under, tmp)
        if not Path("/sys/kernel/tracing/events").is_dir():
            sh(["mount", "-t", "tracefs", "nodev", "/sys/kernel/tracing"])
            stack.callback(subprocess.run, ["umount", "/sys/kernel/tracing"])
        impls = {"new": args.tree}
        sh(["make", "-C", args.tree / "src/tracehound/probes"])
        if not args.no_baseline:
            log(f"exporting and building baseline {args.baseline_rev}")
            impls["baseline"] = export(args.baseline_rev, tmp / "baseline")
        machine = facts(args)
        # the measured tree's own default, which the bench itself may not import
        default_series = int(sh([PYTHON, "-c", "from tracehound import defaults; print(defaults.MAX_SERIES)"],
                                env=dict(os.environ, PYTHONPATH=str(args.tree / "src"))))
        plan = [("io", n, m, ms, impl, None) for n, m in sizes
                for impl in impls if impl == "new" or f"{n}x{m}" in base_sizes
                for ms in [n * m + 100 if n * m + 100 > default_series else None]]
        for h in args.histograms:
            # the largest real-I/O size again, latency histograms kept with fewer labels
            n, m = sizes[-1]
            plan.append(("io", n, m, n * m + 100 if n * m + 100 > default_series else None, "new", h))
        if fill_size:
            n, m = fill_size
            plan += [("fill", n, m, None, "new", None), ("fill", n, m, n * m + 10000, "new", None)]
            plan += ([("fill", n, m, None, "baseline", None)]
                     if "baseline" in impls and "fill" in base_sizes else [])
        runs, extras = [], {}
        with steps(len(plan) + 1 + (args.idle_minutes > 0), "scrape cost") as bar:
            ne = peer(args) if shutil.which(args.node_exporter) else {"error": "not installed"}
            bar.advance(f"node_exporter: {ne.get('samples', '?')} samples")
            for (kind, n, m) in dict.fromkeys(p[:3] for p in plan):
                with Workload(cg_parent, tmp, n, m) as wl:
                    for k, _, _, ms, impl, h in [p for p in plan if p[:3] == (kind, n, m)]:
                        first = kind == "io" and (n, m) == sizes[0] and impl == "new" and not h
                        runs.append(r := measure(args, impl, impls[impl], wl, kind, ms,
                                                 extras=first, histograms=h))
                        walls = r.get("walls")
                        bar.advance(f"{impl} {kind} {n}x{m}" + (f": median {statistics.median(walls):.3f} s, "
                                    f"{r['text_bytes'][-1] / 1e6:.1f} MB" if walls else f": {r.get('error')}"))
            if args.idle_minutes > 0:
                n, m = size_of(args.idle_size)
                log(f"idle CPU: {n}x{m}, a scrape every {args.idle_interval:g} s for {args.idle_minutes:g} min")
                with Workload(cg_parent, tmp, n, m) as wl:
                    extras["idle"] = idle(args, args.tree, wl)
                bar.advance(f"idle: {extras['idle']['cpu_pct']:.2f} % of a core")
        machine["loadavg_end"] = Path("/proc/loadavg").read_text().split()[:3]
        res = {"settings": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
               "sizes": [f"{n}x{m}" for n, m in sizes], "fill": fill_size and "%dx%d" % fill_size,
               "default_max_series": default_series, "machine": machine, "runs": runs,
               "peer": ne, "extras": extras, "elapsed_s": round(time.monotonic() - started)}
        for target, got, ok in write_reports(args.out, res):
            log(f"{verdict(ok)} {target}: {got}")
        log(f"report in {args.out}/scrape.md ({res['elapsed_s']} s)")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt as e:
        log(f"interrupted ({e or 'SIGINT'}); agents stopped, mounts and cgroups removed")
        sys.exit(130)
    except (RuntimeError, subprocess.CalledProcessError) as e:
        log(f"failed: {e}" + (f"\n{e.stderr}" if getattr(e, "stderr", None) else ""))
        sys.exit(1)
