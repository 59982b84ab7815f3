// SPDX-License-Identifier: GPL-2.0
/* tracehound I/O probe: VFS activity per (cgroup v2, mount), counted in kernel.
 *
 * Three hook sets feed the same maps; the loader enables exactly one set per
 * operation group (read, write, fsync, open, unlink, mkdir, rmdir, rename):
 *   fe_ and fx_ programs: fentry/fexit on vfs_ functions
 *   kp_ and kr_ programs: kprobe/kretprobe on the same functions
 *   tp_ programs:         syscall tracepoints
 * Userspace never sees individual events; it reads io_stats at scrape time.
 */
#include "types.h"
#include <linux/bpf.h>
#include <asm/unistd.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>
#include <bpf/bpf_core_read.h>
#include "common.h"

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

struct start {
	__u64 ts;
	__u32 mnt;
	__u32 flags;   /* IO_KEY_* */
	__u32 op;
	__u32 create;  /* open that asked for O_CREAT */
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

static __always_inline void save_start_file(__u32 op, long mnt, __u32 flags, __u32 create,
					    void *file)
{
	__u32 tid = (__u32)bpf_get_current_pid_tgid();
	struct start s = {
		.ts = bpf_ktime_get_ns(), .mnt = mnt, .flags = flags, .op = op, .create = create,
		.file = (__u64)file,
	};

	if (mnt < 0)
		return;
	if (bpf_map_update_elem(&io_start, &tid, &s, BPF_ANY))
		health_inc(HEALTH_START_FULL);
}

static __always_inline void save_start(__u32 op, long mnt, __u32 flags, __u32 create)
{
	save_start_file(op, mnt, flags, create, 0);
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

/* Common exit: finish the call started on this thread. An open that returned
 * a descriptor is re-attributed to the mount of the file it opened. */
static __always_inline int finish(long ret)
{
	__u32 tid = (__u32)bpf_get_current_pid_tgid();
	struct start *s = bpf_map_lookup_elem(&io_start, &tid);
	__u64 delta;
	__u32 mnt, flags, op, create;
	struct file *file;
	int m;

	if (!s)
		return 0;
	delta = bpf_ktime_get_ns() - s->ts;
	mnt = s->mnt; flags = s->flags; op = s->op; create = s->create;
	file = (struct file *)s->file;
	bpf_map_delete_elem(&io_start, &tid);
	if (file) {
		/* vfs_open: created means the file did not exist before */
		create = ret == 0 && (BPF_CORE_READ(file, f_mode) & FMODE_CREATED);
	} else if (op == OP_OPEN && ret >= 0) {
		m = fd_mount(ret);
		if (m < 0)
			return 0;
		mnt = m;
		flags = 0;
	}
	account(mnt, flags, op, ret, delta);
	if (create)
		account(mnt, flags, OP_CREATE, ret, delta);
	return 0;
}

/* ---- syscall tracepoints ------------------------------------------------
 * Two BTF-typed raw tracepoints (sys_enter, sys_exit) cover every syscall:
 * cheaper than one classic tracepoint per syscall, which builds a trace
 * record before calling the program. Enter only timestamps the calls that
 * have latency histograms; everything else is decided at exit, where the
 * saved user registers still hold the arguments. */

struct tp_start {
	__u64 ts;
	long id;
};

struct {
	__uint(type, BPF_MAP_TYPE_TASK_STORAGE);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, int);
	__type(value, struct tp_start);
} tp_start SEC(".maps");

/* Kernel names of the saved user registers (CO-RE flavour of pt_regs). */
struct pt_regs___th {
	unsigned long di, si, dx, r10, orig_ax;
} PRESERVE;

#define NR(x) __NR_##x

static __always_inline int syscall_op(long id)
{
	switch (id) {
	case NR(read): case NR(pread64): case NR(readv): case NR(preadv): case NR(preadv2):
		return OP_READ;
	case NR(write): case NR(pwrite64): case NR(writev): case NR(pwritev): case NR(pwritev2):
		return OP_WRITE;
	case NR(fsync): case NR(fdatasync):
		return OP_FSYNC;
	case NR(openat): case NR(openat2):
#ifdef __NR_open
	case NR(open): case NR(creat):
#endif
		return OP_OPEN;
	case NR(unlinkat):
#ifdef __NR_unlink
	case NR(unlink):
#endif
		return OP_UNLINK;
#ifdef __NR_rmdir
	case NR(rmdir):
		return OP_RMDIR;
#endif
	case NR(mkdirat):
#ifdef __NR_mkdir
	case NR(mkdir):
#endif
		return OP_MKDIR;
	case NR(renameat): case NR(renameat2):
#ifdef __NR_rename
	case NR(rename):
#endif
		return OP_RENAME;
	}
	return -1;
}

static __always_inline bool tp_enabled(int op)
{
	__u32 zero = 0;
	struct io_config *cfg;

	if (op < 0)
		return false;
	cfg = bpf_map_lookup_elem(&io_config, &zero);
	return cfg && (cfg->tp_ops & (1u << op));
}

SEC("tp_btf/sys_enter")
int BPF_PROG(tp_sys_enter, struct pt_regs *regs, long id)
{
	int op = syscall_op(id);
	struct tp_start *s;

	if (op != OP_READ && op != OP_WRITE && op != OP_FSYNC)
		return 0;
	if (!tp_enabled(op))
		return 0;
	s = bpf_task_storage_get(&tp_start, bpf_get_current_task_btf(), 0,
				 BPF_LOCAL_STORAGE_GET_F_CREATE);
	if (s) {
		s->ts = bpf_ktime_get_ns();
		s->id = id;
	}
	return 0;
}

/* open-type calls: the opened file's mount when it succeeded, otherwise the
 * mount the path points into */
static __always_inline void tp_open_exit(long id, struct pt_regs___th *r, long ret)
{
	long dirfd = r->di;
	const char *path = (const char *)r->si;
	__u64 flags = r->dx;
	int mnt;

#ifdef __NR_open
	if (id == NR(open) || id == NR(creat)) {
		dirfd = AT_FDCWD;
		path = (const char *)r->di;
		flags = id == NR(creat) ? O_CREAT : r->si;
	}
#endif
	if (id == NR(openat2)) {
		flags = 0;  /* struct open_how starts with __u64 flags */
		bpf_probe_read_user(&flags, sizeof(flags), (void *)r->dx);
	}
	mnt = ret >= 0 ? fd_mount(ret) : path_mount(dirfd, path);
	if (mnt < 0)
		return;
	account(mnt, 0, OP_OPEN, ret, 0);
	if (flags & O_CREAT)
		account(mnt, 0, OP_CREATE, ret, 0);
}

SEC("tp_btf/sys_exit")
int BPF_PROG(tp_sys_exit, struct pt_regs *regs, long ret)
{
	struct pt_regs___th *r = (void *)regs;
	long id = r->orig_ax;
	int op = syscall_op(id), mnt;
	struct tp_start *s;
	__u64 delta = 0;

	if (!tp_enabled(op))
		return 0;
	switch (op) {
	case OP_READ: case OP_WRITE: case OP_FSYNC:
		s = bpf_task_storage_get(&tp_start, bpf_get_current_task_btf(), 0, 0);
		/* no start: the call began before the probe was attached */
		if (!s || s->id != id || !s->ts)
			return 0;
		delta = bpf_ktime_get_ns() - s->ts;
		s->ts = 0;
		mnt = fd_mount(r->di);
		break;
	case OP_OPEN:
		tp_open_exit(id, r, ret);
		return 0;
	default:
		if (id == NR(mkdirat) || id == NR(unlinkat) || id == NR(renameat) ||
		    id == NR(renameat2)) {
			if (id == NR(unlinkat) && (r->dx & AT_REMOVEDIR))
				op = OP_RMDIR;
			mnt = path_mount(r->di, (const char *)r->si);
		} else {
			mnt = path_mount(AT_FDCWD, (const char *)r->di);
		}
	}
	if (mnt >= 0)
		account(mnt, 0, op, ret, delta);
	return 0;
}

#include "io_vfs.bpf.h"
