"""Guest program: the agent on a pure cgroup v1 host (no cgroup2 mounted),
counting a Slurm v1 job by its freezer cgroup. Run as
``python3 tests/vm/cgroup_v1_guest.py RESULTS_DIR``.

In a mount namespace of its own (the rest of the boot keeps the guest's v2
tree): cgroup2 unmounted, only a v1 freezer hierarchy mounted, the job made
as slurmd's cgroup/v1 plugin makes it. One process of the job writes and
reads known sizes on a tmpfs; the agent must export exactly those bytes under
the job's id, and say it counts by v1 freezer on a v1 host (tracehound_cgroup_key_info;
doctor's line is the same CgroupLayout.describe, unit-tested).
Writes RESULTS_DIR/checks.json as each check is decided.
"""
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from guest_checks import Checks  # noqa: E402

JOB = "4242"
STEP = f"/slurm/uid_0/job_{JOB}/step_0"
WRITE, READ = 123_457, 65_537
CG = "/sys/fs/cgroup"


def sh(cmd: str) -> None:
    subprocess.run(["bash", "-c", cmd], check=True)


def only_v1() -> str:
    """cgroup2 off the table, one v1 freezer hierarchy in its place."""
    sh(f"mount --make-rprivate / && umount -l {CG} && mount -t tmpfs thv1 {CG} && "
       f"mkdir {CG}/freezer && mount -t cgroup -o freezer thv1-freezer {CG}/freezer")
    with open("/proc/self/mountinfo") as f:
        return "".join(line for line in f if "cgroup" in line)


def start_agent(out: list) -> tuple[subprocess.Popen, str]:
    exe = os.path.join(os.path.dirname(sys.executable), "tracehound")
    # auto: fentry on 6.1, the mode the host cannot load. The RDMA
    # application view (a scan of every process's maps) only costs start-up
    # time under emulation.
    proc = subprocess.Popen([exe, "run", "--listen", "127.0.0.1:0", "--instance", "vmv1",
                             "--rdma-app-view", "off"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    url = None
    for line in proc.stdout:
        out.append(line)
        # into the scenario's output as well: what a start that never ends
        # got to is the only clue a timeout leaves
        print(line, end="", flush=True)
        m = re.search(r"serving metrics on (http://\S+?/metrics)", line)
        if m:
            url = m.group(1)
            break
    # read on as it comes: the pipe must never fill and block the agent
    threading.Thread(target=lambda: out.extend(proc.stdout), daemon=True).start()
    return proc, url


def job_io(tmpfs: str) -> str:
    """One process joins the job's freezer cgroup, then writes and reads."""
    src = os.path.join(tmpfs, "in")
    with open(src, "wb") as f:
        f.write(b"r" * READ)
    prog = ("import os,sys\nopen(sys.argv[1],'w').write(str(os.getpid()))\n"
            "fd=os.open(sys.argv[2],os.O_WRONLY|os.O_CREAT|os.O_TRUNC);n=0\n"
            f"while n<{WRITE}: n+=os.write(fd,b'x'*min(65536,{WRITE}-n))\n"
            "os.close(fd);fd=os.open(sys.argv[3],os.O_RDONLY);m=0\n"
            "while True:\n k=len(os.read(fd,65536))\n if not k: break\n m+=k\n"
            "print(n,m)")
    return subprocess.run([sys.executable, "-c", prog, f"{CG}/freezer{STEP}/cgroup.procs",
                           os.path.join(tmpfs, "out"), src],
                          capture_output=True, text=True, check=True).stdout.strip()


def series(text: str, name: str, **labels) -> float | None:
    for line in text.splitlines():
        if line.startswith(name + "{") and all(f'{k}="{v}"' in line for k, v in labels.items()):
            return float(line.rsplit(" ", 1)[1])
    return None


def main(results: Path) -> int:
    c = Checks(results)
    t0 = time.monotonic()
    c.record("pure_v1", "cgroup2" not in (mounts := only_v1()), mounts)
    os.makedirs(f"{CG}/freezer{STEP}")
    tmpfs = tempfile.mkdtemp(prefix="thv1-")
    sh(f"mount -t tmpfs thv1-tmpfs {tmpfs}")
    out: list = []
    t1 = time.monotonic()
    proc, url = start_agent(out)
    c.timing("agent_start_s", time.monotonic() - t1)
    try:
        if not c.record("agent_starts", url is not None, "".join(out)):
            return 1
        c.record("job_io", job_io(tmpfs) == f"{WRITE} {READ}")
        with urllib.request.urlopen(url, timeout=60) as r:
            text = r.read().decode()
        labels = dict(cgroup=STEP, mountpoint=tmpfs, workload="slurm", job_id=JOB)
        got = (series(text, "tracehound_io_write_bytes_total", **labels),
               series(text, "tracehound_io_read_bytes_total", **labels))
        c.record("job_bytes_exact", got == (WRITE, READ),
                 f"{got}\n" + "\n".join(ln for ln in text.splitlines() if tmpfs in ln))
        c.record("key_metric", series(text, "tracehound_cgroup_key_info", key="freezer",
                                      layout="v1") == 1, "".join(out[:12]))
    finally:
        proc.terminate()
        proc.wait(timeout=60)
        for d in (STEP, f"/slurm/uid_0/job_{JOB}", "/slurm/uid_0", "/slurm"):
            os.rmdir(f"{CG}/freezer{d}")
    c.timing("scenario_s", time.monotonic() - t0)
    return 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1])))
