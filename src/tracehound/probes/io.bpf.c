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
 * This file holds the maps and what every mode shares: mount and cgroup
 * attribution and the accounting itself. Userspace never sees individual
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
 * and, in the low half, the id itself << 2 | MNT_SEEN | MNT_SKIPPED. An entry
 * is trusted only while both still match, so a reused id or a colliding slot
 * takes the slow path (type name lookup) once and overwrites it; one 64-bit
 * store keeps readers on other CPUs from seeing half an entry. */
#define MNT_SLOTS 4096
#define MNT_SEEN 2
#define MNT_SKIPPED 1
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

#include "io_sample.bpf.h"
#include "io_clocks.bpf.h"

/* true when the super block's file system type is on the skip list */
static __always_inline bool skip_sb(struct super_block *sb)
{
	struct fstype_name name = {};

	bpf_probe_read_kernel_str(name.name, sizeof(name.name), BPF_CORE_READ(sb, s_type, name));
	return bpf_map_lookup_elem(&skip_fstypes, &name) != 0;
}

/* Whether the file system under mount `id` is skipped: a remembered
 * decision while the id and device still match. Hooks that see no mount
 * pass the device as the id (a collision only costs one slow path). */
static __always_inline bool skipped(__u32 id, __u32 dev, struct super_block *sb)
{
	__u64 seen = (__u64)dev << 32 | (id & 0x3fffffff) << 2 | MNT_SEEN;
	__u64 *slot = &mnt_seen[id & (MNT_SLOTS - 1)];
	bool skip;

	if ((*slot & ~(__u64)MNT_SKIPPED) == seen)
		return *slot & MNT_SKIPPED;
	skip = skip_sb(sb);
	*slot = seen | (skip ? MNT_SKIPPED : 0);
	return skip;
}

/* Mount id from what mount_id_* read, or -1 when its file system is skipped. */
static __always_inline int mount_id_of(__u32 id, __u32 dev, struct super_block *sb)
{
	return skipped(id, dev, sb) ? -1 : (int)id;
}

/* Id of the struct mount a vfsmount is embedded in: the one step that needs
 * a probe read where bpf_rdonly_cast is missing. */
static __always_inline __u32 id_of_mount_around(struct vfsmount *vfsmnt)
{
	unsigned long mount = (unsigned long)vfsmnt - bpf_core_field_offset(struct mount, mnt);

#ifdef IO_PROBE_READS
	return BPF_CORE_READ((struct mount *)mount, mnt_id);
#else
	return VIEW(struct mount, mount)->mnt_id;
#endif
}

/* Mount id of a vfsmount at any kernel address. */
static __always_inline int mount_id(struct vfsmount *vfsmnt)
{
	struct super_block *sb;

	if (!vfsmnt)
		return -1;
#ifdef IO_PROBE_READS
	sb = BPF_CORE_READ(vfsmnt, mnt_sb);
	return mount_id_of(id_of_mount_around(vfsmnt), BPF_CORE_READ(sb, s_dev), sb);
#else
	sb = VIEW(struct vfsmount, vfsmnt)->mnt_sb;
	return mount_id_of(id_of_mount_around(vfsmnt), sb->s_dev, sb);
#endif
}

/* Mount id of a vfsmount the verifier knows the type of (reached from a
 * traced function's arguments): its super block is read with plain loads
 * in both builds. */
static __always_inline int mount_id_typed(struct vfsmount *vfsmnt)
{
	struct super_block *sb;

	if (!vfsmnt)
		return -1;
	sb = vfsmnt->mnt_sb;
	return mount_id_of(id_of_mount_around(vfsmnt), sb->s_dev, sb);
}

static __always_inline struct vfsmount *file_vfsmount(struct file *f)
{
#ifdef IO_PROBE_READS
	return BPF_CORE_READ(f, f_path.mnt);
#else
	return VIEW(struct file, f)->f_path.mnt;
#endif
}

/* `task`: the current one, BTF-typed (plain loads instead of a helper call
 * per pointer); the hot paths fetch it once and pass it down. */
static __always_inline struct file *fd_file(struct task_struct *task, long fd)
{
	struct fdtable *fdt = task->files->fdt;
	unsigned long at;

	if (fd < 0 || fd >= fdt->max_fds)
		return 0;
	at = (unsigned long)fdt->fd + fd * sizeof(struct file *);
#ifdef IO_PROBE_READS
	struct file *f = 0;

	bpf_probe_read_kernel(&f, sizeof(f), (void *)at);
	return f;
#else
	/* the fd array is untyped memory: read the slot as the file pointer
	 * member of a struct that has one */
	return VIEW(struct kiocb, at - bpf_core_field_offset(struct kiocb, ki_filp))->ki_filp;
#endif
}

static __always_inline int fd_mount(struct task_struct *task, long fd)
{
	struct file *f = fd_file(task, fd);

	return f ? mount_id(file_vfsmount(f)) : -1;
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

/* Mount a path argument starts from: the longest mount-point prefix for an
 * absolute path in the agent's mount namespace, otherwise the directory it is
 * relative to (dirfd, cwd or the task's root). */
static __always_inline int path_mount(struct task_struct *task, long dirfd, const char *upath)
{
	__u32 zero = 0, ns = 0;
	struct mnt_lpm_key *key = bpf_map_lookup_elem(&path_scratch, &zero);
	struct mnt_lpm_value *val;
	long len;

	if (!key)
		return -1;
	len = bpf_probe_read_user_str(key->path, sizeof(key->path), upath);
	if (len <= 0)
		return -1;
	if (key->path[0] == '/') {
		if (bpf_core_field_exists(struct ns_common, inum))
			ns = BPF_CORE_READ(task, nsproxy, mnt_ns, ns.inum);
		if (ns == settings.agent_mnt_ns) {
			key->prefixlen = (len - 1) * 8;
			val = bpf_map_lookup_elem(&mounts_by_path, key);
			if (val)
				return val->skip ? -1 : (int)val->mnt_id;
		}
		return mount_id(BPF_CORE_READ(task, fs, root.mnt));
	}
	if (dirfd == AT_FDCWD)
		return mount_id(BPF_CORE_READ(task, fs, pwd.mnt));
	return fd_mount(task, dirfd);
}

static __always_inline bool same_key(const struct io_key *a, const struct io_key *b)
{
	return a->cgroup_id == b->cgroup_id && a->mnt == b->mnt && a->flags == b->flags;
}

/* A slot for a key seen for the first time, registered in io_slots. */
static __noinline __u32 new_slot(struct io_key *key)
{
	struct io_stats *s;
	__u32 slot, *won;

	if (bpf_map_pop_elem(&free_slots, &slot)) {
		if (next_slot >= settings.slots)
			return -1;
		slot = __sync_fetch_and_add(&next_slot, 1);
		if (slot >= settings.slots)
			return -1;
	}
	s = bpf_map_lookup_elem(&io_stats, &slot);
	if (!s)
		return -1;
	s->owner = *key;
	if (!bpf_map_update_elem(&io_slots, key, &slot, BPF_NOEXIST))
		return slot;
	/* another CPU registered the key first: use its slot */
	s->owner.cgroup_id = 0;
	bpf_map_push_elem(&free_slots, &slot, 0);
	won = bpf_map_lookup_elem(&io_slots, key);
	return won ? *won : -1;
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
		health_inc(HEALTH_STATS_FULL);
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
	struct io_stats *s = stats_of(&key);
	int hist = hist_of(op);

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
		__sync_fetch_and_add(&s->lat_sum_ns[hist], delta * weight);
		__sync_fetch_and_add(&s->hist[hist][log2_slot(delta)], weight);
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
