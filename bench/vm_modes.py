"""Per-event cost of each hook mode, measured inside Debian's 6.1 kernel.

The host kernel only offers the tracepoint mode, so fentry and kprobe costs
can only be compared in the VM tier's emulated machine: compare the modes
with each other, never with host figures. Run as root after scripts/vm-setup:

    .venv/bin/python bench/vm_modes.py        # writes bench/report/vm-modes.{json,md}
"""
import json
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
REPORT = REPO / "bench" / "report"
MODES = ("fentry", "kprobe", "tracepoint")
PREFIXES = ("fe_", "fx_", "kp_", "kr_", "tp_")


def guest(out: Path) -> None:
    """Runs inside the VM: one agent per mode, bpf_stats on, fio on tmpfs."""
    tmp = Path("/tmp/vm-modes")
    tmp.mkdir(exist_ok=True)
    subprocess.run(["mount", "-t", "tmpfs", "x", str(tmp)], check=True)
    data = tmp / "f"
    subprocess.run(["fio", "--name=lay", f"--filename={data}", "--size=64M", "--rw=write",
                    "--bs=1M", "--output-format=terse"], check=True, capture_output=True)
    Path("/proc/sys/kernel/bpf_stats_enabled").write_text("1")
    results = {}
    for mode in MODES:
        print(f"vm-modes: {mode}", flush=True)
        agent = subprocess.Popen([str(REPO / ".venv/bin/tracehound"), "run", "--hook-mode", mode,
                                  "--listen", "127.0.0.1:0"], stdout=subprocess.PIPE, text=True)
        while "io.rename" not in (agent.stdout.readline() or "io.rename"):
            pass
        time.sleep(1)
        before = progs()
        fio = subprocess.run(["fio", "--name=r", f"--filename={data}", "--size=64M", "--bs=4k",
                              "--rw=randread", "--ioengine=psync", "--time_based", "--runtime=5",
                              "--output-format=json"], check=True, capture_output=True, text=True)
        after = progs()
        agent.terminate()
        agent.wait(timeout=30)
        reads = json.loads(fio.stdout)["jobs"][0]["read"]["total_ios"]
        per_prog = {}
        for pid, (name, cnt, ns) in after.items():
            c0, n0 = before.get(pid, (name, 0, 0))[1:]
            if cnt - c0 > 0:
                per_prog[name] = {"runs": cnt - c0, "ns": ns - n0,
                                  "ns_per_run": round((ns - n0) / (cnt - c0), 1)}
        total_ns = sum(p["ns"] for p in per_prog.values())
        results[mode] = {"fio_reads": reads, "iops": json.loads(fio.stdout)["jobs"][0]["read"]["iops"],
                         "programs": per_prog, "ns_per_io_syscall": round(total_ns / reads, 1)}
    Path("/proc/sys/kernel/bpf_stats_enabled").write_text("0")
    (out / "vm-modes.json").write_text(json.dumps(results, indent=2))


def progs() -> dict:
    out = json.loads(subprocess.run(["bpftool", "prog", "show", "-j"], check=True,
                                    capture_output=True, text=True).stdout)
    return {p["id"]: (p["name"], p.get("run_cnt", 0), p.get("run_time_ns", 0))
            for p in out if p.get("name", "").startswith(PREFIXES)}


def host() -> None:
    sys.path.insert(0, str(REPO / "tests" / "vm"))
    import harness
    REPORT.mkdir(parents=True, exist_ok=True)
    r = harness.run_in_vm(f"{sys.executable} {__file__} --guest {REPORT}", timeout=900,
                          cwd=REPO, writable=[REPORT], stream=sys.stdout)
    if r.returncode != 0:
        raise SystemExit(f"vm-modes: guest failed ({r.returncode})\n{r.output[-2000:]}")
    res = json.loads((REPORT / "vm-modes.json").read_text())
    lines = ["# Hook modes compared inside Debian 6.1 (emulated, TCG)", "",
             f"Kernel {r.kernel_release} under QEMU without KVM: absolute numbers are inflated by "
             "emulation; compare the modes with each other, not with the host report. fio 4 KiB "
             "random reads from tmpfs, 5 s per mode, bpf_stats on.", "",
             "| mode | IOPS | ns per I/O syscall (all programs) | programs (ns per run) |",
             "|---|---:|---:|---|"]
    for mode, m in res.items():
        progs_txt = ", ".join(f"{n} {p['ns_per_run']}" for n, p in sorted(m["programs"].items())
                              if p["runs"] > 1000)
        lines.append(f"| {mode} | {m['iops']:,.0f} | {m['ns_per_io_syscall']} | {progs_txt} |")
    (REPORT / "vm-modes.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--guest":
        guest(Path(sys.argv[2]))
    else:
        host()
