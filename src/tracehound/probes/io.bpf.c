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

/* Verdict cache keyed by struct file_system_type address, so the hot path
 * does one hash lookup instead of a string copy. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 256);
	__type(key, __u64);
	__type(value, __u8);
} fstype_verdict SEC(".maps");

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

/* true when the mount's file system type is on the skip list */
static __always_inline bool skip_sb(struct super_block *sb)
{
	struct file_system_type *type = BPF_CORE_READ(sb, s_type);
	__u64 key = (__u64)type;
	__u8 *cached = bpf_map_lookup_elem(&fstype_verdict, &key);
	struct fstype_name name = {};
	__u8 verdict;

	if (cached)
		return *cached;
	bpf_probe_read_kernel_str(name.name, sizeof(name.name), BPF_CORE_READ(type, name));
	verdict = bpf_map_lookup_elem(&skip_fstypes, &name) ? 1 : 0;
	bpf_map_update_elem(&fstype_verdict, &key, &verdict, BPF_ANY);
	return verdict;
}

/* Mount id of a vfsmount, or -1 when its file system is skipped. */
static __always_inline int mount_id(struct vfsmount *vfsmnt)
{
	struct mount *mnt;

	if (!vfsmnt || skip_sb(BPF_CORE_READ(vfsmnt, mnt_sb)))
		return -1;
	mnt = (void *)vfsmnt - bpf_core_field_offset(struct mount, mnt);
	return BPF_CORE_READ(mnt, mnt_id);
}

static __always_inline struct file *fd_file(long fd)
{
	struct task_struct *task = (void *)bpf_get_current_task();
	struct fdtable *fdt = BPF_CORE_READ(task, files, fdt);
	struct file **fds = BPF_CORE_READ(fdt, fd);
	unsigned int max = BPF_CORE_READ(fdt, max_fds);
	struct file *f = 0;

	if (fd < 0 || fd >= max)
		return 0;
	bpf_probe_read_kernel(&f, sizeof(f), &fds[fd]);
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
	__sync_fetch_and_add(&s->calls[op], 1);
	if (is_err(ret))
		__sync_fetch_and_add(&s->errors[op], 1);
	else if (op <= OP_WRITE)
		__sync_fetch_and_add(&s->bytes[op], ret);
	if (hist >= 0 && hist < HIST_MAX) {
		__sync_fetch_and_add(&s->lat_sum_ns[hist], delta);
		__sync_fetch_and_add(&s->hist[hist][log2_slot(delta)], 1);
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

/* ---- syscall tracepoints ------------------------------------------------ */

struct sys_enter_ctx {
	__u64 common;
	int nr;
	__u32 pad;
	__u64 args[6];
};

struct sys_exit_ctx {
	__u64 common;
	int nr;
	__u32 pad;
	long ret;
};

#define TP_EXIT(sc)							\
SEC("tracepoint/syscalls/sys_exit_" #sc)				\
int tp_exit_##sc(struct sys_exit_ctx *ctx) { return finish(ctx->ret); }

#define TP_FD(sc, op)							\
SEC("tracepoint/syscalls/sys_enter_" #sc)				\
int tp_enter_##sc(struct sys_enter_ctx *ctx)				\
{ save_start(op, fd_mount(ctx->args[0]), 0, 0); return 0; }		\
TP_EXIT(sc)

/* path syscalls: DFD is the index of the dirfd argument or -1 */
#define TP_PATH(sc, op, dfd, parg)					\
SEC("tracepoint/syscalls/sys_enter_" #sc)				\
int tp_enter_##sc(struct sys_enter_ctx *ctx)				\
{									\
	long dirfd = (dfd) < 0 ? AT_FDCWD : (long)ctx->args[(dfd) < 0 ? 0 : (dfd)]; \
	save_start(op, path_mount(dirfd, (const char *)ctx->args[parg]), 0, 0); \
	return 0;							\
}									\
TP_EXIT(sc)

TP_FD(read, OP_READ)
TP_FD(pread64, OP_READ)
TP_FD(readv, OP_READ)
TP_FD(preadv, OP_READ)
TP_FD(preadv2, OP_READ)
TP_FD(write, OP_WRITE)
TP_FD(pwrite64, OP_WRITE)
TP_FD(writev, OP_WRITE)
TP_FD(pwritev, OP_WRITE)
TP_FD(pwritev2, OP_WRITE)
TP_FD(fsync, OP_FSYNC)
TP_FD(fdatasync, OP_FSYNC)
TP_PATH(unlink, OP_UNLINK, -1, 0)
TP_PATH(mkdir, OP_MKDIR, -1, 0)
TP_PATH(mkdirat, OP_MKDIR, 0, 1)
TP_PATH(rmdir, OP_RMDIR, -1, 0)
TP_PATH(rename, OP_RENAME, -1, 0)
TP_PATH(renameat, OP_RENAME, 0, 1)
TP_PATH(renameat2, OP_RENAME, 0, 1)

SEC("tracepoint/syscalls/sys_enter_unlinkat")
int tp_enter_unlinkat(struct sys_enter_ctx *ctx)
{
	__u32 op = ctx->args[2] & AT_REMOVEDIR ? OP_RMDIR : OP_UNLINK;

	save_start(op, path_mount(ctx->args[0], (const char *)ctx->args[1]), 0, 0);
	return 0;
}
TP_EXIT(unlinkat)

static __always_inline int open_enter(long dirfd, const char *path, __u64 flags)
{
	save_start(OP_OPEN, path_mount(dirfd, path), 0, (flags & O_CREAT) != 0);
	return 0;
}

SEC("tracepoint/syscalls/sys_enter_open")
int tp_enter_open(struct sys_enter_ctx *ctx)
{
	return open_enter(AT_FDCWD, (const char *)ctx->args[0], ctx->args[1]);
}
TP_EXIT(open)

SEC("tracepoint/syscalls/sys_enter_creat")
int tp_enter_creat(struct sys_enter_ctx *ctx)
{
	return open_enter(AT_FDCWD, (const char *)ctx->args[0], O_CREAT);
}
TP_EXIT(creat)

SEC("tracepoint/syscalls/sys_enter_openat")
int tp_enter_openat(struct sys_enter_ctx *ctx)
{
	return open_enter(ctx->args[0], (const char *)ctx->args[1], ctx->args[2]);
}
TP_EXIT(openat)

SEC("tracepoint/syscalls/sys_enter_openat2")
int tp_enter_openat2(struct sys_enter_ctx *ctx)
{
	__u64 flags = 0;

	/* struct open_how starts with __u64 flags */
	bpf_probe_read_user(&flags, sizeof(flags), (void *)ctx->args[2]);
	return open_enter(ctx->args[0], (const char *)ctx->args[1], flags);
}
TP_EXIT(openat2)

#include "io_vfs.bpf.h"
