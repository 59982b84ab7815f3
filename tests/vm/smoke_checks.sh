#!/bin/bash
# Runs inside the VM: one "CHECK <name> ok" or "CHECK <name> FAIL <reason>" line
# per capability the kernel-level tests rely on. Each check's own output goes
# to $CHECK_LOG so the summary lines stay easy to parse.
# Usage: smoke_checks.sh <results-dir on a writable share>
RESULTS=${1:?results dir}
CHECK_LOG=$(mktemp)

check() {
    local name=$1; shift
    # Subshell: a check may use set -e or exit without ending the script.
    if ( "$@" ) >"$CHECK_LOG" 2>&1; then
        echo "CHECK $name ok"
    else
        local rc=$?
        echo "CHECK $name FAIL rc=$rc: $(tail -n 5 "$CHECK_LOG" | tr '\n' '|' | cut -c1-400)"
    fi
    { echo "=== $name"; cat "$CHECK_LOG"; } >>"$RESULTS/checks.log"
}

kernel_is_61() { uname -r; case $(uname -r) in 6.1.0*) ;; *) return 1 ;; esac; }
mounted() { awk -v t="$1" '$3 == t { print; f = 1 } END { exit !f }' /proc/mounts; }
same_python() { test "$("$HOST_PYTHON" -c 'import sys; print(sys.executable)')" = "$HOST_PYTHON"; }

# bpftrace's kfunc probes are fentry programs. -c runs cat only once the
# probes are attached, so a non-zero count proves attach *and* fire. The path
# is absolute because bpftrace 0.17 rejects a bare 'cat' that resolves to
# both /bin/cat and /usr/bin/cat on merged-/usr systems.
fentry_bpftrace() {
    local out
    out=$(timeout 120 bpftrace -e 'kfunc:vfs_read { @c = count(); }' -c '/usr/bin/cat /proc/version' 2>&1) || { echo "$out"; return 1; }
    echo "$out"
    grep -q '^@c: [1-9]' <<<"$out"
}
kprobe_pmu() { test -d /sys/bus/event_source/devices/kprobe; }
kprobe_bpftrace() {
    local out
    out=$(timeout 120 bpftrace -e 'kprobe:vfs_read { @k = count(); }' -c '/usr/bin/cat /proc/version' 2>&1) || { echo "$out"; return 1; }
    echo "$out"
    grep -q '^@k: [1-9]' <<<"$out"
}
rdma_rxe() {
    set -e
    modprobe rdma_rxe
    ip link add veth0 type veth peer name veth1
    ip link set veth0 up
    ip link set veth1 up
    rdma link add rxe0 type rxe netdev veth0
    rdma link show
    rdma link show | grep -q 'rxe0/1 state ACTIVE'
}
ibv_lists_rxe0() { ibv_devices && ibv_devices | grep -qw rxe0; }
results_writable() { echo "written in the VM" >"$RESULTS/from-vm.txt"; }

check kernel_6_1 kernel_is_61
check bpffs mounted bpf
check tracefs mounted tracefs
check debugfs mounted debugfs
check cgroup2 mounted cgroup2
check same_python same_python
check fentry fentry_bpftrace
check kprobe_pmu kprobe_pmu
check kprobe_attach kprobe_bpftrace
check rdma_rxe rdma_rxe
check ibv_devices ibv_lists_rxe0
check results_writable results_writable
# the scenarios booted after this one set up their own soft-RoCE device
rdma link delete rxe0 2>/dev/null; ip link delete veth0 2>/dev/null
rm -f "$CHECK_LOG"
echo "CHECKS DONE"
