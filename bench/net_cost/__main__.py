"""What the net subsystem costs on the paths it sits on, in one run.

1. Connect + close over loopback: inet_sock_set_state fires on every state
   change of every TCP socket (about ten per connection, both ends), so this
   is the hook's worst case. Rounds alternate without and with the probe.
2. A bulk TCP transfer with packet loss (the netfault classifier on lo):
   tcp_retransmit_skb fires per retransmitted skb. Rounds alternate too.
3. ns per program run, from the kernel's BPF run-time statistics, enabled
   for one extra round of each workload only (they cost something of their
   own), and how many runs each connection and each retransmit makes.
4. One sock_diag scan with 10, 1000 and 5000 established sockets, opening a
   netlink socket in another namespace, and listing the namespaces.
Everything runs in network namespaces of its own (unshared), so neither
the host's sockets nor its interfaces are touched. The load generator is C:
Python's own cost per connection would hide the hook's. Run as root:

    .venv/bin/python -m bench.net_cost [--rounds R] [--seconds S]
    # writes bench/report/net_cost.{json,md,png}
"""
import argparse
import ctypes
import json
import os
import platform
import resource
import socket
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

from bench.common import REPORT, commit, cpu_model, paired_ratio, paired_spread, prog_id, stamp

CLONE_NEWNET = 0x40000000
LOSS_PERCENT = 1.0

LOAD = r"""#define _GNU_SOURCE
#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static double now(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return t.tv_sec + t.tv_nsec / 1e9;
}

static int listener(struct sockaddr_in *addr)
{
	socklen_t len = sizeof(*addr);
	int l = socket(AF_INET, SOCK_STREAM, 0), one = 1;

	setsockopt(l, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
	memset(addr, 0, sizeof(*addr));
	addr->sin_family = AF_INET;
	addr->sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	if (bind(l, (void *)addr, sizeof(*addr)) || listen(l, 128) ||
	    getsockname(l, (void *)addr, &len))
		exit(2);
	return l;
}

int main(int argc, char **argv)
{
	double secs = atof(argv[2]), start, end;
	struct sockaddr_in addr;
	int l = listener(&addr);
	long n = 0;
	if (!strcmp(argv[1], "connect")) {
		start = now();
		end = start + secs;
		do {
			int c = socket(AF_INET, SOCK_STREAM, 0), s;

			if (connect(c, (void *)&addr, sizeof(addr)))
				exit(3);
			s = accept(l, NULL, NULL);
			close(c);
			close(s);
			n++;
		} while ((n & 63) || now() < end);
		printf("%ld %.6f\n", n, now() - start);
		return 0;
	}
	/* bulk: the child receives and reports, the parent sends */
	if (fork() == 0) {
		static char buf[1 << 16];
		int s = accept(l, NULL, NULL);
		long got = 0, r;

		start = now();
		while ((r = recv(s, buf, sizeof(buf), 0)) > 0)
			got += r;
		printf("%ld %.6f\n", got, now() - start);
		return 0;
	} else {
		static char buf[1 << 16];
		int c = socket(AF_INET, SOCK_STREAM, 0);

		if (connect(c, (void *)&addr, sizeof(addr)))
			exit(3);
		end = now() + secs;
		while (now() < end)
			if (send(c, buf, sizeof(buf), 0) < 0)
				exit(4);
		close(c);
		wait(NULL);
	}
	return 0;
}
"""


def build(tmp: Path) -> Path:
    (tmp / "load.c").write_text(LOAD)
    exe = tmp / "load"
    subprocess.run(["gcc", "-O2", "-o", str(exe), str(tmp / "load.c")], check=True)
    return exe


def run_load(exe: Path, mode: str, seconds: float) -> float:
    """connections/s, or bytes/s received"""
    out = subprocess.run([str(exe), mode, str(seconds)], check=True, capture_output=True,
                         text=True, timeout=seconds + 60).stdout.split()
    return int(out[0]) / float(out[1])


def private_netns() -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.unshare(CLONE_NEWNET) != 0:
        raise SystemExit(f"unshare(CLONE_NEWNET): {ctypes.get_errno()}: run as root")
    subprocess.run(["ip", "link", "set", "lo", "up", "mtu", "1500"], check=True)


def alternate(exe: Path, mode: str, rounds: int, seconds: float, probe_factory):
    """(rates without, rates with, retransmits counted during the probed rounds)"""
    run_load(exe, mode, 0.5)                         # warm
    bare, probed, retrans = [], [], 0
    for _ in range(rounds):
        bare.append(run_load(exe, mode, seconds))
        probe = probe_factory()
        try:
            probed.append(run_load(exe, mode, seconds))
            retrans += sum(c["retransmits"] for c in probe.counters().values())
        finally:
            probe.close()
    return bare, probed, retrans


def run_stats(exe: Path, mode: str, seconds: float, probe_factory) -> dict:
    """One probed round with the kernel's BPF run-time statistics on: per
    program, runs and ns per run; and the workload's own count."""
    from tracehound.bpf import libbpf
    lib = libbpf.lib()
    lib.bpf_enable_stats.argtypes = [ctypes.c_int]
    lib.bpf_enable_stats.restype = ctypes.c_int
    stats_fd = lib.bpf_enable_stats(0)              # BPF_STATS_RUN_TIME, while the fd is open
    if stats_fd < 0:
        return {}
    probe = probe_factory()
    try:
        ids = {name: prog_id(lib, prog.fd) for name, prog in probe.obj.programs.items()
               if prog.autoload}
        rate = run_load(exe, mode, seconds)
        counted = sum(c["retransmits"] for c in probe.counters().values())
        out = {"rate": rate, "seconds": seconds, "retransmits": counted, "programs": {}}
        for name, pid in ids.items():
            info = json.loads(subprocess.run(["bpftool", "-j", "prog", "show", "id", str(pid)],
                                             check=True, capture_output=True, text=True).stdout)
            runs, ns = info.get("run_cnt", 0), info.get("run_time_ns", 0)
            out["programs"][name] = {"runs": runs, "ns_per_run": ns / runs if runs else None}
        return out
    finally:
        probe.close()
        os.close(stats_fd)


def _median_ms(fn, times: int) -> tuple[float, float]:
    """(median, fastest) ms of fn()"""
    took = []
    for _ in range(times):
        t = time.perf_counter()
        fn()
        took.append((time.perf_counter() - t) * 1e3)
    return statistics.median(took), min(took)


def sockdiag_costs(sizes=(10, 1000, 5000), scans=20) -> dict:
    """Median ms of one scan of this namespace holding N established sockets."""
    from tracehound.host import sockdiag
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, 20000), max(hard, 20000)))
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1024)
    held, out = [], {}
    for n in sizes:
        while len(held) < n:
            held += [socket.create_connection(listener.getsockname()), listener.accept()[0]]
        seen = sockdiag.scan(10 * n + 100, all_netns=False).sockets
        median, fastest = _median_ms(lambda: sockdiag.scan(10 * n + 100, all_netns=False), scans)
        out[n] = {"sockets_seen": seen, "median_ms": median, "min_ms": fastest}
    for s in held + [listener]:
        s.close()
    return {"scans": out,
            "open_in_netns_ms": _median_ms(
                lambda: sockdiag.open_socket("/proc/self/ns/net").close(), 50)[0],
            "list_namespaces_ms": _median_ms(sockdiag.namespaces, 10)[0],
            "processes": sum(1 for p in Path("/proc").iterdir() if p.name.isdigit())}


def time_wait_scan(scans=10) -> dict:
    """A scan of the namespace the connect rounds left full of TIME_WAIT
    sockets: the dump walks them though it returns none."""
    from tracehound.host import sockdiag
    fields = Path("/proc/net/sockstat").read_text().split("TCP:")[1].split("\n")[0].split()
    return {"time_wait": int(fields[fields.index("tw") + 1]),
            "median_ms": _median_ms(lambda: sockdiag.scan(100000, all_netns=False), scans)[0]}


def main() -> None:
    from tracehound.chaos.faults.tcbpf import NetfaultProgram
    from tracehound.probes.net import NetProbe

    p = argparse.ArgumentParser(prog="python -m bench.net_cost",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=10)
    p.add_argument("--seconds", type=float, default=1.5)
    args = p.parse_args()
    started = time.monotonic()
    private_netns()

    def probe_factory():
        probe = NetProbe().start()
        if not probe.available:
            raise SystemExit(f"net probe: {probe.reason}")
        return probe
    data = {"cpu": cpu_model() or "?", "commit": commit(), "date": stamp()["date"],
            "vcpus": os.cpu_count(), "kernel": platform.release(),
            "rounds": args.rounds, "seconds": args.seconds, "loss_percent": LOSS_PERCENT}
    # first: TIME_WAIT sockets of the connect rounds stay in the kernel's
    # hash table, which every dump walks, for a minute
    data["sockdiag"] = sockdiag_costs()
    with tempfile.TemporaryDirectory() as tmp:
        exe = build(Path(tmp))
        bare, probed, _ = alternate(exe, "connect", args.rounds, args.seconds, probe_factory)
        data["connect"] = {"bare": bare, "probed": probed}
        data["connect_stats"] = run_stats(exe, "connect", args.seconds, probe_factory)
        loss = NetfaultProgram()
        try:
            loss.configure(LOSS_PERCENT, 0)
            loss.attach(None, "lo", "egress", 49100, 1)
            bare, probed, retrans = alternate(exe, "bulk", args.rounds, args.seconds,
                                              probe_factory)
            data["bulk"] = {"bare": bare, "probed": probed, "retransmits": retrans}
            data["bulk_stats"] = run_stats(exe, "bulk", args.seconds, probe_factory)
            data["bulk"]["packets_dropped"] = loss.counters().get("packets_dropped")
        finally:
            loss.close()
    data["time_wait"] = time_wait_scan()
    data["wall_s"] = time.monotonic() - started
    REPORT.mkdir(parents=True, exist_ok=True)
    (REPORT / "net_cost.json").write_text(json.dumps(data, indent=2))
    (REPORT / "net_cost.md").write_text(report(data))
    plot(data, REPORT / "net_cost.png")


def report(d: dict) -> str:
    cb, cw, cr = paired_ratio(d["connect"])
    bb, bw, br = paired_ratio(d["bulk"])
    cs, bs = d.get("connect_stats") or {}, d.get("bulk_stats") or {}
    progs = [(load, name, v) for load, st in (("connect", cs), ("bulk with loss", bs))
             for name, v in sorted(st.get("programs", {}).items())]
    conns = cs.get("rate", 0) * cs.get("seconds", 0)
    set_state = cs.get("programs", {}).get("tb_inet_sock_set_state", {})
    per_conn = set_state.get("runs", 0) / conns if conns else 0
    added = per_conn * (set_state.get("ns_per_run") or 0)
    lines = [
        "# What the net probe costs on the paths it hooks", "",
        f"{d['cpu']}, {d['vcpus']} vCPUs (a KVM guest), kernel {d['kernel']}, commit "
        f"{d.get('commit', 'not recorded')}. One run of "
        "`bench/net_cost` in a network namespace of its own: C load generators over "
        f"loopback, {d['rounds']} rounds of {d['seconds']} s alternating without and with the "
        "probe (tp_btf programs on inet_sock_set_state, tcp_retransmit_skb, tcp_receive_reset). "
        "Machines differ: only the ratios of one run compare with each other, never absolute "
        f"figures across hosts. The whole run took {d['wall_s']:.0f} s.", "",
        "| workload | without (median) | with the probe (median) | with / without "
        "(paired, median) | quartiles of the paired ratios |", "|---|---:|---:|---:|---:|",
        f"| connect + close, loopback | {cb:,.0f} conn/s | {cw:,.0f} conn/s | {cr:.3f} | "
        "{:.3f} .. {:.3f} |".format(*paired_spread(d["connect"])),
        f"| bulk send, {d['loss_percent']}% loss on lo | {bb / 1e6:,.1f} MB/s | "
        f"{bw / 1e6:,.1f} MB/s | {br:.3f} | " + "{:.3f} .. {:.3f} |".format(*paired_spread(d["bulk"])),
        "",
        "A ratio whose quartiles straddle 1 is no measurable difference: on this shared 2-vCPU "
        "guest the rounds' own noise is larger than the probe. Loss-limited TCP throughput also "
        "varies from round to round by itself, so the bulk row can only bound the cost; the "
        "run-time statistics below measure it.", "",
        "## Per program run (kernel BPF run-time statistics, one extra probed round each)", "",
        "| workload | program | runs | ns per run |", "|---|---|---:|---:|"]
    for load, name, v in progs:
        ns = f"{v['ns_per_run']:.0f}" if v.get("ns_per_run") else "-"
        lines.append(f"| {load} | {name} | {v['runs']:,} | {ns} |")
    lines += [
        "",
        f"Each connection (both ends, open and close) ran inet_sock_set_state {per_conn:.1f} "
        f"times: about {added:.0f} ns of program time per connection, against "
        f"{1e9 / cb:,.0f} ns per connection without the probe ({added * cb / 1e9:.2%}). The "
        "statistics time the program body only; the ratio above also holds the tracepoint's "
        "call into it.",
        f"During the probed bulk rounds the probe counted {d['bulk']['retransmits']:,} "
        f"retransmitted segments ({bs.get('retransmits', 0):,} in the statistics round, which "
        f"ran tb_tcp_retransmit_skb {bs.get('programs', {}).get('tb_tcp_retransmit_skb', {}).get('runs', 0):,} "
        "times: one run per retransmitted skb, which may carry several segments).", "",
        "## One sock_diag scan (scrape time)", "",
        "| established sockets | read | median | fastest |", "|---:|---:|---:|---:|"]
    for n, v in d["sockdiag"]["scans"].items():
        lines.append(f"| {n} | {v['sockets_seen']} | {v['median_ms']:.2f} ms | "
                     f"{v['min_ms']:.2f} ms |")
    sd = d["sockdiag"]
    lines += [
        "",
        f"Opening the netlink socket in another network namespace (a thread that joins it) "
        f"costs {sd['open_in_netns_ms']:.2f} ms each; listing the namespaces of "
        f"{sd['processes']} processes {sd['list_namespaces_ms']:.2f} ms. These scans ran "
        "first, in a namespace holding nothing else. The kernel walks its socket hash table "
        "(shared by all namespaces unless tcp_child_ehash_entries is set) for the dump, so a "
        "scan also pays for sockets in states it does not return: after the connect rounds "
        f"left {d['time_wait']['time_wait']:,} TIME_WAIT sockets, a scan that found no "
        f"established socket took {d['time_wait']['median_ms']:.2f} ms.", "",
        "The run-time statistics add two clock reads to each run they time, so their ns per "
        "run are an upper bound; the first run for a cgroup also inserts its entry (the "
        "resets' few runs above are mostly that).", ""]
    return "\n".join(lines)


def plot(d: dict, path: Path) -> None:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    fig, (a, b) = plt.subplots(1, 2, figsize=(9, 3.4))
    names = ["connect+close", "bulk with loss"]
    for x, key in enumerate(("connect", "bulk")):
        paired = [p / q for q, p in zip(d[key]["bare"], d[key]["probed"])]
        a.bar(x, paired_ratio(d[key])[2], color=["#4c72b0", "#dd8452"][x], alpha=0.6)
        a.scatter([x] * len(paired), paired, color="black", s=10, zorder=3)
    a.set_xticks([0, 1], names)
    a.axhline(1.0, color="grey", lw=0.8)
    a.set_ylabel("rate with / without probe")
    a.set_title("hooked paths (same run)")
    scans = d["sockdiag"]["scans"]
    sizes = [int(n) for n in scans]
    b.plot(sizes, [v["median_ms"] for v in scans.values()], marker="o")
    b.set_xlabel("established sockets")
    b.set_ylabel("ms per scan (median)")
    b.set_title("sock_diag scan")
    fig.suptitle(f"net probe cost: {d['cpu']}, {d['vcpus']} vCPUs, {d['kernel']}", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=90)


if __name__ == "__main__":
    main()
