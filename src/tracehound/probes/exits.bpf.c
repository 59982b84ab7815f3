// SPDX-License-Identifier: GPL-2.0
/* tracehound exit probe: why processes end, counted per cgroup in kernel maps.
 *
 *   exit_counts  (cgroup, reason, signal) -> processes that ended so
 *   exit_last    (cgroup, reason, signal) -> the latest of them (abnormal only)
 *   exit_health  dropped updates
 *
 * One hook, sched_process_exit, in one of two forms the loader picks at
 * runtime: tp_btf (BTF-typed raw tracepoint) or the classic tracepoint.
 * A process is counted once, by the last of its threads to exit: that
 * thread sees signal->live at zero (do_exit decrements it before the
 * tracepoint), whichever thread it is and whichever way the others went.
 * Layouts are in exits.h, the contract with probes/exits.py.
 */
#include <linux/types.h>
#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>
#include <bpf/bpf_core_read.h>

#define PRESERVE __attribute__((preserve_access_index))

#include "cgroup_types.h"
#include "exits.h"

char LICENSE[] SEC("license") = "GPL";

/* Unchanged since 2.6: sched.h and sched/signal.h. */
#define PF_KTHREAD 0x00200000
#define SIGNAL_GROUP_EXIT 0x00000004

struct mm_struct;

/* Only the fields read here; CO-RE relocates each against the running
 * kernel, so order and layout do not matter. */
struct signal_struct {
	struct {
		int counter;
	} live;                         /* threads not yet exited (atomic_t) */
	unsigned int flags;
	int group_exit_code;
	struct mm_struct *oom_mm;       /* set by mark_oom_victim, never cleared */
} PRESERVE;

struct task_struct {
	unsigned int flags;
	int tgid;
	int exit_code;
	char comm[16];
	struct task_struct *group_leader;
	struct signal_struct *signal;
	struct css_set *cgroups;
} PRESERVE;

#include "cgroup_key.bpf.h"
#include "btf_keep.h"

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 8192);        /* keys of removed cgroups are retired by the agent */
	__type(key, struct exit_key);
	__type(value, __u64);
} exit_counts SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 4096);
	__type(key, struct exit_key);
	__type(value, struct exit_last);
} exit_last SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, H_MAX);
	__type(key, __u32);
	__type(value, __u64);
} exit_health SEC(".maps");

BTF_KEEP(exits, enum exit_reason reason, enum exit_health health)

static __always_inline void health_inc(__u32 idx)
{
	__u64 *v = bpf_map_lookup_elem(&exit_health, &idx);

	if (v)
		__sync_fetch_and_add(v, 1);
}

static __always_inline void count(struct exit_key *key)
{
	__u64 one = 1, *v = bpf_map_lookup_elem(&exit_counts, key);

	if (v) {
		__sync_fetch_and_add(v, 1);
		return;
	}
	if (bpf_map_update_elem(&exit_counts, key, &one, BPF_NOEXIST)) {
		v = bpf_map_lookup_elem(&exit_counts, key);  /* lost a race with another CPU */
		if (v)
			__sync_fetch_and_add(v, 1);
		else
			health_inc(H_COUNTERS_FULL);
	}
}

static __always_inline void count_exit(struct task_struct *task)
{
	struct signal_struct *sig = BPF_CORE_READ(task, signal);
	struct exit_key key = {};
	struct exit_last last = {};
	struct task_struct *leader;
	__u32 code;

	if (BPF_CORE_READ(task, flags) & PF_KTHREAD)
		return;
	if (BPF_CORE_READ(sig, live.counter) != 0)
		return;         /* another thread of the process still runs */
	leader = BPF_CORE_READ(task, group_leader);
	/* what wait() reports: the group's code after a group exit (a fatal
	 * signal, exit_group), else the leader's own */
	if (BPF_CORE_READ(sig, flags) & SIGNAL_GROUP_EXIT)
		code = BPF_CORE_READ(sig, group_exit_code);
	else
		code = BPF_CORE_READ(leader, exit_code);

	key.cgroup_id = current_cgroup_key();
	if (BPF_CORE_READ(sig, oom_mm)) {
		key.reason = REASON_OOM;
		key.signal = code & 0x7f;
	} else if (code & 0x7f) {
		key.reason = REASON_SIGNAL;
		key.signal = code & (0x7f | EXIT_SIG_CORE);
	} else if ((code >> 8) & 0xff) {
		key.reason = REASON_ERROR;
		last.status = (code >> 8) & 0xff;
	} else {
		key.reason = REASON_CLEAN;
	}
	count(&key);
	if (key.reason == REASON_CLEAN)
		return;
	last.ktime_ns = bpf_ktime_get_ns();
	last.pid = BPF_CORE_READ(task, tgid);
	BPF_CORE_READ_STR_INTO(&last.comm, leader, comm);
	if (bpf_map_update_elem(&exit_last, &key, &last, BPF_ANY))
		health_inc(H_LAST_FULL);
}

SEC("tp_btf/sched_process_exit")
int BPF_PROG(tb_sched_process_exit, struct task_struct *p)
{
	count_exit(p);
	return 0;
}

/* The record carries no task pointer; the exiting task is current. */
SEC("tracepoint/sched/sched_process_exit")
int tp_sched_process_exit(void *ctx)
{
	count_exit((struct task_struct *)bpf_get_current_task());
	return 0;
}
