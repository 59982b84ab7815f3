// SPDX-License-Identifier: GPL-2.0
/* tracehound I/O probe: VFS activity per (cgroup, mount), counted in kernel;
 * the cgroup is the v2 one or a v1 subsystem's (cgroup_key.bpf.h).
 *
 * Three hook sets feed the same maps; the loader enables exactly one set per
 * operation group (read, write, fsync, open, remove, mkdir, rename):
 *   fe_ and fx_ programs: fentry/fexit on vfs_ functions    (io_vfs.bpf.h)
 *   kp_ and kr_ programs: kprobe/kretprobe on the same ones  (io_vfs.bpf.h)
 *   tp_ programs:         raw syscall tracepoints            (io_syscalls.bpf.h)
 * Data that bypasses those functions (io_uring, Linux AIO, copies between
 * files, page-cache fills) is counted where it completes (io_async.bpf.h).
 * This file holds the maps and what every mode shares: cgroup attribution
 * and the accounting itself; io_mounts.bpf.h finds a call's mount. Userspace never sees individual
 * events; it reads io_slots and io_stats at scrape time.
 */
#include "types.h"
#include <linux/bpf.h>
#include <asm/unistd.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>
#include <bpf/bpf_core_read.h>
#include "io.h"
#include "cgroup_key.bpf.h"
#include "btf_keep.h"

char LICENSE[] SEC("license") = "GPL";

#define O_CREAT 0100
#define AT_FDCWD -100
#define AT_REMOVEDIR 0x200
#define FMODE_CREATED 0x100000
#define MAX_ERRNO 4095

const volatile struct io_settings settings SEC(".rodata.settings") = {};

/* Kernels with bpf_rdonly_cast (6.2+) get this object; older ones get the
 * same source built with IO_PROBE_READS, which reads kernel memory through
 * helper calls. A typed view of a kernel address is read with plain loads
 * that the JIT guards like a probe read, at a fraction of a helper call's
 * cost (each call and return is dearest where return-stack mitigations
 * run). */
#ifndef IO_PROBE_READS
extern void *bpf_rdonly_cast(const void *obj, __u32 btf_id) __ksym;
#define VIEW(type, addr) ((type *)bpf_rdonly_cast((void *)(addr), bpf_core_type_id_kernel(type)))
#endif

/* The counters live in an array, whose lookup the verifier inlines; a hash
 * only maps each (cgroup, mount) key to its slot, and each CPU remembers the
 * slots of the keys it saw last (slot_hints), so an event finds its
 * counters without a helper call. Userspace maps the array to read it. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 8192);
	__uint(map_flags, BPF_F_MMAPABLE);
	__type(key, __u32);
	__type(value, struct io_stats);
} io_stats SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 8192);
	__type(key, struct io_key);
	__type(value, __u32);
} io_slots SEC(".maps");

/* Slots userspace emptied (their cgroup is gone), for reuse; slots never
 * used are handed out from next_slot. */
struct {
	__uint(type, BPF_MAP_TYPE_QUEUE);
	__uint(max_entries, 8192);
	__type(value, __u32);
} free_slots SEC(".maps");

__u64 next_slot;

#define SLOT_HINTS 8
struct slot_hint {
	struct io_key key;
	__u32 slot;
	__u32 pad;
};

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, SLOT_HINTS);
	__type(key, __u32);
	__type(value, struct slot_hint);
} slot_hints SEC(".maps");

/* Pseudo file systems to ignore, by name (filled from the configuration). */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 64);
	__type(key, struct fstype_name);
	__type(value, __u8);
} skip_fstypes SEC(".maps");

/* What each mount id was last seen as: its super block's device (high half)
 * and, in the low half, MNT_BY_DEV (an entry of a device, for hooks that see
 * no mount) | the id itself << 3 | MNT_FOREIGN | MNT_SEEN | MNT_SKIPPED. An
 * entry is trusted only while all of it matches, so a reused id or a
 * colliding slot takes the slow path (type name lookup) once and overwrites
 * it; one 64-bit store keeps readers on other CPUs from seeing half an
 * entry. */
#define MNT_SLOTS 4096
#define MNT_BY_DEV (1u << 31)
#define MNT_FOREIGN 4
#define MNT_SEEN 2
#define MNT_SKIPPED 1
#define MNT_ID_MASK 0x0fffffff
/* set in a mount id the mount_id functions return for a mount a user owns;
 * account_cg moves it into the key's flags (IO_KEY_FOREIGN) */
#define MNT_ID_FOREIGN (1 << 30)
__u64 mnt_seen[MNT_SLOTS] SEC(".data.mounts");

/* Mount points of the agent's mount namespace, for absolute paths seen at
 * syscall entry (unlink, mkdir, ... before any file exists). */
struct {
	__uint(type, BPF_MAP_TYPE_LPM_TRIE);
	__uint(max_entries, 4096);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, struct mnt_lpm_key);
	__type(value, struct mnt_lpm_value);
} mounts_by_path SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct mnt_lpm_key);
} path_scratch SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, HEALTH_MAX);
	__type(key, __u32);
	__type(value, __u64);
} io_health SEC(".maps");

BTF_KEEP(io, enum io_op op, enum io_hist hist, enum io_health health)

static __always_inline void health_inc(__u32 idx)
{
	__u64 *v = bpf_map_lookup_elem(&io_health, &idx);
	if (v)
		*v += 1;
}

#define ENOENT 2

static __always_inline bool is_err(long ret)
{
	return ret < 0 && ret >= -MAX_ERRNO;
}

static __always_inline bool timed(__u32 op)
{
	return settings.timed_ops & (1u << op);
}

static __always_inline __u32 log2_slot(__u64 v)
{
	__u32 r = 0, shift;

	shift = (v > 0xFFFFFFFF) << 5; v >>= shift; r = shift;
	shift = (v > 0xFFFF) << 4; v >>= shift; r |= shift;
	shift = (v > 0xFF) << 3; v >>= shift; r |= shift;
	shift = (v > 0xF) << 2; v >>= shift; r |= shift;
	shift = (v > 0x3) << 1; v >>= shift; r |= shift;
	r |= (v >> 1);
	return r < HIST_SLOTS ? r : HIST_SLOTS - 1;
}

static __always_inline int hist_of(__u32 op)
{
	return op == OP_READ ? HIST_READ : op == OP_WRITE ? HIST_WRITE :
	       op == OP_FSYNC ? HIST_FSYNC : HIST_NONE;
}

/* The task's cgroup key (cgroup_key.bpf.h) read with plain loads: its v2
 * cgroup (what bpf_get_current_cgroup_id returns) or the cgroup of its css
 * of the chosen v1 subsystem. */
static __always_inline __u64 cgroup_id_of(struct task_struct *task)
{
	int s;

	if (cgroup_key == CGROUP_KEY_V2)
		return task->cgroups->dfl_cgrp->kn->id;
	s = cgroup_key_subsys();
	if (s < 0 || s >= CSS_SUBSYS_SLOTS)
		return 0;
	return task->cgroups->subsys[s]->cgroup->kn->id;
}

#include "io_sample.bpf.h"
#include "io_clocks.bpf.h"

#include "io_mounts.bpf.h"

static __always_inline bool same_key(const struct io_key *a, const struct io_key *b)
{
	return a->cgroup_id == b->cgroup_id && a->mnt == b->mnt && a->flags == b->flags;
}

/* Whether a new key may take one of the slots kept for the node's own: no
 * user can make its cgroup or its mount at will, so no tenant can fill the
 * table with such keys and blind the agent to jobs started after. Decided
 * from the current task, whose cgroup the key normally is (a completion
 * counted for another task's cgroup is judged as a user's). */
static __always_inline bool may_take_reserve(const struct io_key *key)
{
	struct task_struct *task = (struct task_struct *)bpf_get_current_task();

	if (key->flags & IO_KEY_FOREIGN)
		return false;
	return task_cgroup_key(task) == key->cgroup_id && cgroup_made_by_root(task);
}

#define NO_SLOT ((__u32)-1)
#define RESERVED_SLOT ((__u32)-2)

/* A slot for a key seen for the first time, registered in io_slots. */
static __noinline __u32 new_slot(struct io_key *key)
{
	struct io_stats *s;
	__u32 slot, *won;

	if (bpf_map_pop_elem(&free_slots, &slot)) {
		if (next_slot >= settings.slots)
			return NO_SLOT;
		slot = __sync_fetch_and_add(&next_slot, 1);
		if (slot >= settings.slots)
			return NO_SLOT;
	}
	/* the reserve is the top of the array: a slot from there, fresh or
	 * freed, goes back to the queue when the key may not have it */
	if (slot >= settings.slots - settings.reserved && !may_take_reserve(key)) {
		bpf_map_push_elem(&free_slots, &slot, 0);
		return RESERVED_SLOT;
	}
	s = bpf_map_lookup_elem(&io_stats, &slot);
	if (!s)
		return NO_SLOT;
	s->owner = *key;
	if (!bpf_map_update_elem(&io_slots, key, &slot, BPF_NOEXIST))
		return slot;
	/* another CPU registered the key first: use its slot */
	s->owner.cgroup_id = 0;
	bpf_map_push_elem(&free_slots, &slot, 0);
	won = bpf_map_lookup_elem(&io_slots, key);
	return won ? *won : NO_SLOT;
}

static __always_inline struct io_stats *stats_of(struct io_key *key)
{
	__u32 way = (key->cgroup_id ^ key->mnt) & (SLOT_HINTS - 1), slot, *found;
	struct slot_hint *hint = bpf_map_lookup_elem(&slot_hints, &way);
	struct io_stats *s;

	if (hint && same_key(&hint->key, key)) {
		s = bpf_map_lookup_elem(&io_stats, &hint->slot);
		if (s && same_key(&s->owner, key))
			return s;
	}
	found = bpf_map_lookup_elem(&io_slots, key);
	slot = found ? *found : new_slot(key);
	s = bpf_map_lookup_elem(&io_stats, &slot);
	if (!s) {
		health_inc(slot == RESERVED_SLOT ? HEALTH_STATS_RESERVE : HEALTH_STATS_FULL);
		return 0;
	}
	if (hint) {
		hint->key = *key;
		hint->slot = slot;
	}
	return s;
}

/* Count one call. `delta` is its latency when it was timed, 0 when not
 * (latency off for the op, not sampled, or the call began before the probe
 * attached): every call is counted in calls[op], exactly; a timed one is
 * also counted in its histogram as `weight` calls of its latency (1 when
 * every call is timed, the calls its sample stands for otherwise). */
static __always_inline void account_cg(__u64 cgroup_id, __u32 mnt, __u32 flags, __u32 op,
				       long ret, __u64 delta, __u32 weight)
{
	struct io_key key = { .cgroup_id = cgroup_id, .mnt = mnt, .flags = flags };
	int hist = hist_of(op);
	struct io_stats *s;

	if (!(flags & IO_KEY_DEV) && (mnt & MNT_ID_FOREIGN)) {
		key.mnt = mnt & ~MNT_ID_FOREIGN;
		key.flags |= IO_KEY_FOREIGN;
	}
	s = stats_of(&key);

	if (!s)
		return;
	if (op >= OP_MAX)
		return;
	/* The loader's library search, config probing and `rm -f` fail by the
	 * thousand with ENOENT on a healthy node; kept apart, an error count
	 * means something went wrong. */
	if (ret == -ENOENT && op >= OP_OPEN && op <= OP_RENAME)
		__sync_fetch_and_add(&s->not_found[op], 1);
	else if (is_err(ret))
		__sync_fetch_and_add(&s->errors[op], 1);
	else if (op <= OP_WRITE)
		__sync_fetch_and_add(&s->bytes[op], ret);
	__sync_fetch_and_add(&s->calls[op], 1);
	if (delta && hist >= 0 && hist < HIST_MAX) {
		/* audited, a call the sampler left out (weight 0) is timed too,
		 * but only into io_audit */
		if (weight) {
			__sync_fetch_and_add(&s->lat_sum_ns[hist], delta * weight);
			__sync_fetch_and_add(&s->hist[hist][log2_slot(delta)], weight);
		}
		if (settings.audit)
			audit_add(&key, hist, delta, weight);
	}
}

static __always_inline void account_in(struct task_struct *task, __u32 mnt, __u32 flags, __u32 op,
				       long ret, __u64 delta, __u32 weight)
{
	account_cg(cgroup_id_of(task), mnt, flags, op, ret, delta, weight);
}

static __always_inline void account(__u32 mnt, __u32 flags, __u32 op, long ret, __u64 delta,
				    __u32 weight)
{
	account_in(bpf_get_current_task_btf(), mnt, flags, op, ret, delta, weight);
}

#include "io_async.bpf.h"
#include "io_syscalls.bpf.h"
#include "io_vfs.bpf.h"
