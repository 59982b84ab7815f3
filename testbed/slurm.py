"""A real Slurm cluster on this one machine: one munged, one slurmctld and N
slurmd "nodes", each daemon in a network namespace of its own (and slurmctld
and every slurmd in a UTS namespace named after it), all from one generated
slurm.conf in one run directory.

    cluster = Cluster("/tmp/x", nodes=3)
    cluster.up()            # idle nodes, or an exception naming what failed
    cluster.scontrol("show", "node", "-o")
    cluster.down()          # nothing left: daemons, namespaces, links, routes, cgroups

Why this shape: Debian's Slurm is built with --enable-multiple-slurmd, so
the nodes' cgroups are slurm_<node> under each v1 controller (this host is
hybrid: cgroup/v1 is the plugin that works); `nsenter --net` keeps the
host's /sys (`ip netns exec` would remount it and hide the cgroup mounts).

The state (what was made, every daemon's pid) is a JSON file in the run
directory, written before each thing is made; `down` works from it in any
later process and is a no-op when there is nothing to undo.
"""
from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import signal
import subprocess
import time

from . import network

STATE = "cluster.json"
V1_ROOT = "/sys/fs/cgroup"
PARTITION = "batch"
MUNGED, SLURMCTLD, SLURMD = "/usr/sbin/munged", "/usr/sbin/slurmctld", "/usr/sbin/slurmd"
SCONTROL = "/usr/bin/scontrol"
# Memory is scheduled and enforced (CR_Core_Memory, ConstrainRAMSpace), so
# `srun --mem` kills for real: slurmd writes the job's allocation into its v1
# memory cgroup, which CR_Core leaves without a limit. What each simulated
# node says it has (the nodes share this host's memory; slurmd only checks
# that the host has at least this much), and what a job that names no --mem
# gets: room for several jobs and overlapping steps on a node at once.
NODE_MEMORY_MB = 16384
DEFAULT_JOB_MEMORY_MB = 2048


class ClusterError(RuntimeError):
    pass


class Cluster:
    def __init__(self, run_dir: str, nodes: int = 3, prefix: str = "n",
                 health_program: str | None = None, health_interval: int = 2):
        self.run_dir = os.path.abspath(run_dir)
        self.count = nodes
        self.prefix = prefix
        self.health_program = health_program
        self.health_interval = health_interval
        self.state_path = os.path.join(self.run_dir, STATE)
        self.state = self._load()

    # -- names -----------------------------------------------------------

    @property
    def nodes(self) -> list[str]:
        return self.state.get("nodes") or [f"{self.prefix}{i}" for i in range(1, self.count + 1)]

    @property
    def conf(self) -> str:
        return os.path.join(self.run_dir, "slurm.conf")

    def netns(self, node: str) -> str:
        return self.state["netns_of"][node]

    def node_dir(self, node: str) -> str:
        return os.path.join(self.run_dir, node)

    def env(self) -> dict:
        """The environment Slurm's clients need on the host."""
        return {**os.environ, "SLURM_CONF": self.conf}

    # -- state -----------------------------------------------------------

    def _load(self) -> dict:
        try:
            with open(self.state_path) as f:
                return json.load(f)
        except FileNotFoundError:
            return {}

    def _save(self) -> None:
        tmp = self.state_path + ".tmp"
        with open(tmp, "w") as f:
            json.dump(self.state, f, indent=1)
        os.replace(tmp, self.state_path)

    def _journal(self, kind: str, value) -> None:
        self.state.setdefault(kind, []).append(value)
        self._save()

    def running(self) -> dict[str, bool]:
        return {name: _alive(pid, exe) for name, (pid, exe) in self.state.get("pids", {}).items()}

    # -- up ----------------------------------------------------------------

    def up(self, before_slurmd=None, timeout: float = 60) -> float:
        """Start everything; `before_slurmd(cluster)` runs once the nodes'
        namespaces exist (e.g. to start an agent in each). Returns the
        seconds from the first step to every node idle."""
        if self.state.get("pids") and all(self.running().values()):
            return 0.0
        if self.state:
            self.down()
        start = time.monotonic()
        made_run_dir = not os.path.isdir(self.run_dir)
        os.makedirs(self.run_dir, exist_ok=True)
        token = secrets.token_hex(3)
        subnet = network.pick_subnet(token)
        base = subnet.rsplit(".", 1)[0]
        self.state = {"token": token, "subnet": subnet, "nodes": self.nodes,
                      "host_addr": f"{base}.1", "ctld_addr": f"{base}.2",
                      "addr_of": {n: f"{base}.{10 + i}" for i, n in enumerate(self.nodes)},
                      "netns_of": {n: f"thsl-{token}-{n}" for n in self.nodes},
                      "ctld_netns": f"thsl-{token}-ctl", "pids": {},
                      # what `down` removes of the run directory: all of it
                      # where `up` made it, else what `up` wrote there
                      "made_run_dir": made_run_dir,
                      "written": ["munge", "ctld", *self.nodes, "slurm.conf", "cgroup.conf"]}
        self._save()
        try:
            self._network()
            self._write_config()
            self._start_munged()
            self._start_slurmctld()
            if before_slurmd is not None:
                before_slurmd(self)
            for node in self.nodes:
                self._start_slurmd(node)
            self.wait_nodes(lambda n: n["State"] == "IDLE", timeout)
        except BaseException:
            self.down()
            raise
        return time.monotonic() - start

    def _network(self) -> None:
        s = self.state
        bridge = f"thsl{s['token']}"
        network.add_blackhole(self._journal)
        network.make_bridge(self._journal, bridge, f"{s['host_addr']}/24")
        network.make_namespace(self._journal, s["ctld_netns"], bridge, f"{bridge}c",
                               f"{s['ctld_addr']}/24")
        for i, node in enumerate(self.nodes, 1):
            network.make_namespace(self._journal, self.netns(node), bridge, f"{bridge}{i}",
                                   f"{s['addr_of'][node]}/24")

    def _write_config(self) -> None:
        s, run = self.state, self.run_dir
        self._remove_written()      # a state save location of an earlier cluster: slurmctld refuses it
        for d in ("munge", "ctld/state", *self.nodes):
            os.makedirs(os.path.join(run, d), exist_ok=True)
        key = os.path.join(run, "munge", "munge.key")
        with open(os.open(key, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o400), "wb") as f:
            f.write(secrets.token_bytes(1024))
        lines = [
            f"ClusterName=th{s['token']}",
            f"SlurmctldHost=thctl({s['ctld_addr']})",
            "SlurmUser=root", "SlurmdUser=root",
            "AuthType=auth/munge", "CredType=cred/munge",
            f"AuthInfo=socket={run}/munge/munge.socket",
            f"StateSaveLocation={run}/ctld/state",
            f"SlurmctldPidFile={run}/ctld/slurmctld.pid",
            f"SlurmctldLogFile={run}/ctld/slurmctld.log",
            # %n: each slurmd of this host its own spool, pid and log
            f"SlurmdSpoolDir={run}/%n/spool",
            f"SlurmdPidFile={run}/%n/slurmd.pid",
            f"SlurmdLogFile={run}/%n/slurmd.log",
            "ProctrackType=proctrack/cgroup",
            "TaskPlugin=task/cgroup,task/affinity",
            "SelectType=select/cons_tres", "SelectTypeParameters=CR_Core_Memory",
            f"DefMemPerNode={DEFAULT_JOB_MEMORY_MB}",
            "SchedulerType=sched/backfill", "MpiDefault=none",
            "AccountingStorageType=accounting_storage/none", "JobCompType=jobcomp/none",
            # a node back from DOWN (slurmd restarted) serves again by itself
            "ReturnToService=2", "SlurmdTimeout=30", "MessageTimeout=5",
            "InactiveLimit=0", "KillWait=2", "MinJobAge=30",
        ]
        if self.health_program:
            lines += [f"HealthCheckProgram={self.health_program}",
                      f"HealthCheckInterval={self.health_interval}",
                      "HealthCheckNodeState=ANY,CYCLE"]
        cpus = os.cpu_count() or 1
        for node in self.nodes:
            lines.append(f"NodeName={node} NodeAddr={s['addr_of'][node]} NodeHostname={node} "
                         f"CPUs={cpus} RealMemory={NODE_MEMORY_MB} State=UNKNOWN")
        lines.append(f"PartitionName={PARTITION} Nodes=ALL Default=YES MaxTime=INFINITE State=UP")
        with open(self.conf, "w") as f:
            f.write("\n".join(lines) + "\n")
        with open(os.path.join(run, "cgroup.conf"), "w") as f:
            # this host is hybrid: only the v1 plugin finds its controllers
            f.write(f"CgroupPlugin=cgroup/v1\nCgroupMountpoint={V1_ROOT}\n"
                    # a task past its job's memory is OOM-killed in the job's
                    # memory cgroup (these hosts have no swap to limit)
                    "ConstrainCores=yes\nConstrainRAMSpace=yes\nConstrainDevices=no\n")

    def _spawn(self, name: str, argv: list[str], log: str) -> None:
        # The pid is journalled with the executable it must be, so a later
        # `down` never signals a process that merely reused the number.
        with open(log, "ab") as out:
            proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, start_new_session=True,
                                    env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin",
                                         "SLURM_CONF": self.conf})
        self.state["pids"][name] = (proc.pid, argv_exe(argv))
        self._save()

    def _start_munged(self) -> None:
        m = os.path.join(self.run_dir, "munge")
        self._spawn("munged", [MUNGED, "-F", "--force", f"--socket={m}/munge.socket",
                               f"--key-file={m}/munge.key", f"--pid-file={m}/munged.pid",
                               f"--seed-file={m}/munged.seed", f"--log-file={m}/munged.log"],
                    os.path.join(m, "stdout.log"))
        _poll(lambda: os.path.exists(f"{m}/munge.socket"), 20, "munged's socket",
              f"{m}/munged.log")

    def _in_namespaces(self, netns: str, host: str, argv: list[str]) -> list[str]:
        # the UTS namespace gives the daemon its node's hostname; exec keeps
        # the pid the daemon's own
        return ["nsenter", f"--net=/run/netns/{netns}", "unshare", "--uts", "sh", "-c",
                'hostname "$0" && exec "$@"', host, *argv]

    def _start_slurmctld(self) -> None:
        log = os.path.join(self.run_dir, "ctld", "stdout.log")
        self._spawn("slurmctld", self._in_namespaces(
            self.state["ctld_netns"], "thctl", [SLURMCTLD, "-D", "-i", "-f", self.conf]), log)
        _poll(lambda: self.scontrol("ping", check=False).returncode == 0, 30,
              "slurmctld answering", os.path.join(self.run_dir, "ctld", "slurmctld.log"))

    def _start_slurmd(self, node: str) -> None:
        log = os.path.join(self.node_dir(node), "stdout.log")
        self._spawn(f"slurmd-{node}", self._in_namespaces(
            self.netns(node), node, [SLURMD, "-D", "-N", node, "-f", self.conf]), log)

    # -- queries -----------------------------------------------------------

    def scontrol(self, *argv: str, check: bool = True) -> subprocess.CompletedProcess:
        return subprocess.run([SCONTROL, *argv], env=self.env(), check=check,
                              capture_output=True, text=True, timeout=30)

    def node_info(self) -> dict[str, dict]:
        """node -> its `scontrol show node -o` fields (State without flags
        split into State and Flags)."""
        out = {}
        for line in self.scontrol("show", "node", "-o").stdout.splitlines():
            fields = parse_node_line(line)
            if "NodeName" in fields:
                out[fields["NodeName"]] = fields
        return out

    def wait_nodes(self, predicate, timeout: float, what: str = "") -> dict[str, dict]:
        """Poll slurmctld until predicate(node fields) holds for every node."""
        deadline = time.monotonic() + timeout
        info = {}
        while time.monotonic() < deadline:
            info = self.node_info()
            if set(info) == set(self.nodes) and all(predicate(n) for n in info.values()):
                return info
            time.sleep(0.2)
        failing = {n: {k: i.get(k) for k in ("State", "Flags", "Reason", "Comment")}
                   for n, i in info.items() if not predicate(i)}
        raise ClusterError(f"nodes not {what or 'ready'} after {timeout:g} s: {failing}"
                           + (f"; missing: {sorted(set(self.nodes) - set(info))}"
                              if set(info) != set(self.nodes) else ""))

    # -- down --------------------------------------------------------------

    def stop(self, name: str, timeout: float = 20) -> None:
        """SIGTERM one daemon by its journalled pid, SIGKILL after timeout."""
        pid, exe = self.state.get("pids", {}).get(name, (None, None))
        if pid is None or not _alive(pid, exe):
            return
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout
        while _alive(pid, exe) and time.monotonic() < deadline:
            time.sleep(0.05)
        if _alive(pid, exe):
            os.kill(pid, signal.SIGKILL)
            _poll(lambda: not _alive(pid, exe), 10, f"{name} killed")

    def down(self) -> None:
        if not self.state:
            return
        names = list(self.state.get("pids", {}))
        # the nodes first (each ends its steps), then the controller, munged last
        order = sorted(names, key=lambda n: (n == "munged", n == "slurmctld"))
        for name in order:
            self.stop(name)
        network.remove(self.state.get("netns", []), self.state.get("links", []))
        network.remove_blackhole_if_unused()
        for node in self.state.get("nodes", []):
            remove_v1_cgroups(node)
        self._remove_written()
        os.unlink(self.state_path)
        if self.state.get("made_run_dir"):
            with contextlib.suppress(OSError):
                os.rmdir(self.run_dir)
        self.state = {}

    def _remove_written(self) -> None:
        for name in self.state.get("written", []):
            path = os.path.join(self.run_dir, name)
            if os.path.isdir(path) and not os.path.islink(path):
                shutil.rmtree(path, ignore_errors=True)
            elif os.path.lexists(path):
                os.unlink(path)


def parse_node_line(line: str) -> dict:
    """One `scontrol show node -o` line -> {key: value}; Reason runs to the
    next known key, as it may hold spaces."""
    fields, key = {}, None
    for word in line.split(" "):
        k, eq, v = word.partition("=")
        if eq and k and k[0].isupper() and k.isalnum() and not (key == "Reason" and
                                                                  not _reason_ends(k)):
            key = k
            fields[key] = v
        elif key is not None:
            fields[key] += " " + word
    if "State" in fields:
        state, *flags = fields["State"].split("+")
        fields["State"], fields["Flags"] = state, flags
    return fields


def _reason_ends(key: str) -> bool:
    # the fields scontrol prints after Reason=
    return key in ("Comment", "Extra", "ExtSensorsJoules", "AllocTRES", "CfgTRES")


def argv_exe(argv: list[str]) -> str:
    """The executable the spawned process ends up as (after nsenter/unshare/sh exec)."""
    return next((a for a in argv if a in (MUNGED, SLURMCTLD, SLURMD)), argv[0])


def _alive(pid: int, exe: str) -> bool:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            cmd = f.read().split(b"\0")
        with open(f"/proc/{pid}/stat") as f:
            zombie = f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return False
    if zombie:
        try:
            os.waitpid(pid, os.WNOHANG)     # ours: reap it
        except ChildProcessError:
            pass
        return False
    # between fork and exec the process is still the launcher (nsenter, sh)
    return exe.encode() in cmd or os.path.basename(cmd[0]).decode(errors="replace") in (
        "nsenter", "unshare", "sh")


def _poll(cond, timeout: float, what: str, log: str | None = None) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return
        time.sleep(0.05)
    tail = ""
    if log and os.path.exists(log):
        with open(log, errors="replace") as f:
            tail = "".join(f.readlines()[-20:])
    raise ClusterError(f"no {what} after {timeout:g} s\n{tail}")


def remove_v1_cgroups(node: str) -> None:
    """slurmd's slurm_<node> directories under every v1 controller, deepest first."""
    for controller in sorted(os.listdir(V1_ROOT)):
        top = os.path.join(V1_ROOT, controller, f"slurm_{node}")
        if not os.path.isdir(top):
            continue
        for dirpath, _dirs, _files in sorted(os.walk(top), key=lambda t: -len(t[0])):
            try:
                os.rmdir(dirpath)
            except OSError:
                pass
