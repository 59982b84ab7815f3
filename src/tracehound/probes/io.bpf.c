// SPDX-License-Identifier: GPL-2.0
/* tracehound I/O probe: VFS activity per (cgroup v2, mount), counted in kernel.
 *
 * Three hook sets feed the same maps; the loader enables exactly one set per
 * operation group (read, write, fsync, open, remove, mkdir, rename):
 *   fe_ and fx_ programs: fentry/fexit on vfs_ functions    (io_vfs.bpf.h)
 *   kp_ and kr_ programs: kprobe/kretprobe on the same ones  (io_vfs.bpf.h)
 *   tp_ programs:         raw syscall tracepoints            (io_syscalls.bpf.h)
 * This file holds the maps and what every mode shares: mount and cgroup
 * attribution and the accounting itself. Userspace never sees individual
 * events; it reads io_stats at scrape time.
 */
#include "types.h"
#include <linux/bpf.h>
#include <asm/unistd.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>
#include <bpf/bpf_core_read.h>
#include "io.h"

char LICENSE[] SEC("license") = "GPL";

#define O_CREAT 0100
#define AT_FDCWD -100
#define AT_REMOVEDIR 0x200
#define FMODE_CREATED 0x100000
#define MAX_ERRNO 4095

struct io_config {
	__u32 agent_mnt_ns;   /* inode of the agent's mount namespace */
	__u32 tp_ops;         /* bit per enum io_op counted by the syscall hooks */
};

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct io_config);
} io_config SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 8192);
	__type(key, struct io_key);
	__type(value, struct io_stats);
} io_stats SEC(".maps");

/* A VFS call in flight on a thread (fentry/kprobe modes). */
struct start {
	__u64 ts;
	__u32 mnt;
	__u32 flags;   /* IO_KEY_* */
	__u32 op;
	__u32 pad;
	__u64 file;    /* vfs_open: the struct file being opened */
};

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 16384);
	__type(key, __u32);
	__type(value, struct start);
} io_start SEC(".maps");

/* Pseudo file systems to ignore, by name (filled from the configuration). */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 64);
	__type(key, struct fstype_name);
	__type(value, __u8);
} skip_fstypes SEC(".maps");

/* vfsmount address -> mount id, or -1 for a skipped file system. Saves the
 * pointer walk and the type-name check on every call; userspace clears it
 * whenever the mount table changes, before an address can be reused. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 4096);
	__type(key, __u64);
	__type(value, __s32);
} mnt_cache SEC(".maps");

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

static const struct io_stats zero_stats;

static __always_inline void health_inc(__u32 idx)
{
	__u64 *v = bpf_map_lookup_elem(&io_health, &idx);
	if (v)
		*v += 1;
}

static __always_inline bool is_err(long ret)
{
	return ret < 0 && ret >= -MAX_ERRNO;
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

/* true when the super block's file system type is on the skip list */
static __always_inline bool skip_sb(struct super_block *sb)
{
	struct fstype_name name = {};

	bpf_probe_read_kernel_str(name.name, sizeof(name.name), BPF_CORE_READ(sb, s_type, name));
	return bpf_map_lookup_elem(&skip_fstypes, &name) != 0;
}

/* Mount id of a vfsmount, or -1 when its file system is skipped. */
static __always_inline int mount_id(struct vfsmount *vfsmnt)
{
	__u64 key = (__u64)vfsmnt;
	__s32 *cached, id;
	struct mount *mnt;

	if (!vfsmnt)
		return -1;
	cached = bpf_map_lookup_elem(&mnt_cache, &key);
	if (cached)
		return *cached;
	if (skip_sb(BPF_CORE_READ(vfsmnt, mnt_sb))) {
		id = -1;
	} else {
		mnt = (void *)vfsmnt - bpf_core_field_offset(struct mount, mnt);
		id = BPF_CORE_READ(mnt, mnt_id);
	}
	bpf_map_update_elem(&mnt_cache, &key, &id, BPF_ANY);
	return id;
}

static __always_inline struct file *fd_file(long fd)
{
	/* BTF-typed task: plain loads instead of a helper call per pointer */
	struct task_struct *task = bpf_get_current_task_btf();
	struct fdtable *fdt = task->files->fdt;
	struct file *f = 0;

	if (fd < 0 || fd >= fdt->max_fds)
		return 0;
	bpf_probe_read_kernel(&f, sizeof(f), &fdt->fd[fd]);
	return f;
}

static __always_inline int fd_mount(long fd)
{
	struct file *f = fd_file(fd);

	return f ? mount_id(BPF_CORE_READ(f, f_path.mnt)) : -1;
}

/* Mount a path argument starts from: the longest mount-point prefix for an
 * absolute path in the agent's mount namespace, otherwise the directory it is
 * relative to (dirfd, cwd or the task's root). */
static __always_inline int path_mount(long dirfd, const char *upath)
{
	struct task_struct *task = (void *)bpf_get_current_task();
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
		struct io_config *cfg = bpf_map_lookup_elem(&io_config, &zero);

		if (bpf_core_field_exists(struct ns_common, inum))
			ns = BPF_CORE_READ(task, nsproxy, mnt_ns, ns.inum);
		if (cfg && ns == cfg->agent_mnt_ns) {
			key->prefixlen = (len - 1) * 8;
			val = bpf_map_lookup_elem(&mounts_by_path, key);
			if (val)
				return val->skip ? -1 : (int)val->mnt_id;
		}
		return mount_id(BPF_CORE_READ(task, fs, root.mnt));
	}
	if (dirfd == AT_FDCWD)
		return mount_id(BPF_CORE_READ(task, fs, pwd.mnt));
	return fd_mount(dirfd);
}


static __always_inline void account(__u32 mnt, __u32 flags, __u32 op, long ret, __u64 delta)
{
	struct io_key key = { .cgroup_id = bpf_get_current_cgroup_id(), .mnt = mnt, .flags = flags };
	struct io_stats *s = bpf_map_lookup_elem(&io_stats, &key);
	int hist = op == OP_READ ? HIST_READ : op == OP_WRITE ? HIST_WRITE :
		   op == OP_FSYNC ? HIST_FSYNC : HIST_NONE;

	if (!s) {
		bpf_map_update_elem(&io_stats, &key, &zero_stats, BPF_NOEXIST);
		s = bpf_map_lookup_elem(&io_stats, &key);
		if (!s) {
			health_inc(HEALTH_STATS_FULL);
			return;
		}
	}
	if (op >= OP_MAX)
		return;
	if (is_err(ret))
		__sync_fetch_and_add(&s->errors[op], 1);
	else if (op <= OP_WRITE)
		__sync_fetch_and_add(&s->bytes[op], ret);
	/* For histogrammed ops the call count is the histogram's total, summed
	 * at scrape time: one atomic less on the hottest path. */
	if (hist >= 0 && hist < HIST_MAX) {
		__sync_fetch_and_add(&s->lat_sum_ns[hist], delta);
		__sync_fetch_and_add(&s->hist[hist][log2_slot(delta)], 1);
	} else {
		__sync_fetch_and_add(&s->calls[op], 1);
	}
}

#include "io_syscalls.bpf.h"
#include "io_vfs.bpf.h"
