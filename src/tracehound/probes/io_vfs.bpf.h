/* VFS-level hooks of the I/O probe (fentry/fexit and kprobe/kretprobe).
 * Included by io.bpf.c; shares its maps and helpers.
 *
 * Data operations see the struct file and so the exact mount. Namespace
 * operations (mkdir, unlink, rmdir, rename) only see a directory or dentry:
 * they are keyed by the super block's device number and userspace maps it to
 * a mount.
 *
 * fexit sees the arguments as well as the return value, so in fentry mode
 * everything is counted at exit; fentry only starts the clock of the calls
 * whose latency is measured, and is not attached for the others. A
 * kretprobe sees only the return value: in kprobe mode entry keeps what
 * exit needs. */

/* int-returning functions may leave the upper half of rax undefined, and
 * vfs_mkdir returns a dentry pointer on newer kernels: accept both shapes. */
static __always_inline long int_ret(__u64 r)
{
	return (r >> 32) == 0 ? (long)(int)r : (long)r;
}

/* ---- fentry / fexit ----------------------------------------------------- */

static void cancel_call_start(void);

static __always_inline void fx_file(__u32 op, struct file *f, long ret)
{
	__u32 weight = 0;
	int mnt = MNT_UNKNOWN;
	__u64 cgroup, delta = timed(op) ? clock_stop(CLOCK_VFS, op, &weight, &mnt, &cgroup) : 0;

	/* without a start, what the call's start would have found */
	if (mnt == MNT_UNKNOWN) {
		mnt = mount_id_typed(f->f_path.mnt);
		cgroup = cgroup_id_of(bpf_get_current_task_btf());
	}
	if (mnt >= 0)
		account_cg(cgroup, mnt, 0, op, ret, delta, weight);
}

static __always_inline void fx_sb(__u32 op, struct super_block *sb, long ret)
{
	int flags;

	if (!sb)
		return;
	flags = dev_key_flags(sb);
	if (flags >= 0)
		account(sb->s_dev, flags, op, ret, 0, 0);
}

#define FE_FILE(fn, op)							\
SEC("fentry/" #fn) int BPF_PROG(fe_##fn, struct file *f)		\
{									\
	clock_start(CLOCK_VFS, op, op, mount_id_typed(f->f_path.mnt),	\
		    bpf_get_current_task_btf());				\
	return 0;							\
}

FE_FILE(vfs_read, OP_READ)
FE_FILE(vfs_readv, OP_READ)
FE_FILE(vfs_write, OP_WRITE)
FE_FILE(vfs_writev, OP_WRITE)
FE_FILE(vfs_fsync_range, OP_FSYNC)

SEC("fexit/vfs_read") int BPF_PROG(fx_vfs_read, struct file *f, char *b, unsigned long n, void *p, long ret)
{ fx_file(OP_READ, f, ret); return 0; }
SEC("fexit/vfs_write") int BPF_PROG(fx_vfs_write, struct file *f, char *b, unsigned long n, void *p, long ret)
{ fx_file(OP_WRITE, f, ret); return 0; }
SEC("fexit/vfs_readv") int BPF_PROG(fx_vfs_readv, struct file *f, void *v, unsigned long n, void *p,
				    int fl, long ret)
{ fx_file(OP_READ, f, ret); return 0; }
SEC("fexit/vfs_writev") int BPF_PROG(fx_vfs_writev, struct file *f, void *v, unsigned long n, void *p,
				     int fl, long ret)
{ fx_file(OP_WRITE, f, ret); return 0; }
SEC("fexit/vfs_fsync_range") int BPF_PROG(fx_vfs_fsync_range, struct file *f, long s, long e, int d,
					  int ret)
{
	/* counted here: the fdatasync trace event's start is not needed */
	cancel_call_start();
	fx_file(OP_FSYNC, f, ret);
	return 0;
}

SEC("fexit/vfs_open") int BPF_PROG(fx_vfs_open, const struct path *p, struct file *f, int ret)
{
	int mnt = mount_id_typed(p->mnt);

	if (mnt < 0)
		return 0;
	account(mnt, 0, OP_OPEN, ret, 0, 0);
	/* created means the file did not exist before */
	if (ret == 0 && (f->f_mode & FMODE_CREATED))
		account(mnt, 0, OP_CREATE, ret, 0, 0);
	return 0;
}

/* The directory's super block: the dentry may already be released when
 * vfs_mkdir returns (newer kernels), the directory never is. */
SEC("fexit/vfs_unlink") int BPF_PROG(fx_vfs_unlink, void *ns, struct inode *dir, struct dentry *d,
				     void *deleg, int ret)
{ fx_sb(OP_UNLINK, dir->i_sb, ret); return 0; }
SEC("fexit/vfs_mkdir") int BPF_PROG(fx_vfs_mkdir, void *ns, struct inode *dir, struct dentry *d,
				    unsigned short mode, __u64 ret)
{ fx_sb(OP_MKDIR, dir->i_sb, int_ret(ret)); return 0; }
SEC("fexit/vfs_rmdir") int BPF_PROG(fx_vfs_rmdir, void *ns, struct inode *dir, struct dentry *d, int ret)
{ fx_sb(OP_RMDIR, dir->i_sb, ret); return 0; }
SEC("fexit/vfs_rename") int BPF_PROG(fx_vfs_rename, struct renamedata *rd, int ret)
{ fx_sb(OP_RENAME, rd->old_dentry->d_sb, ret); return 0; }

/* ---- kprobe / kretprobe, and the fdatasync trace events ----------------- */

/* A call in flight on a thread; op == OP_MAX: none. */
struct start {
	__u64 ts;      /* 0: latency not measured */
	__u32 mnt;
	__u32 flags;   /* IO_KEY_* */
	__u32 op;
	__u32 weight;  /* the calls a timed one stands for (io_sample.bpf.h) */
	__u64 file;    /* vfs_open: the struct file being opened */
};

struct {
	__uint(type, BPF_MAP_TYPE_TASK_STORAGE);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, int);
	__type(value, struct start);
} call_start SEC(".maps");

static __always_inline void save_start(__u32 op, long mnt, __u32 flags, struct file *file)
{
	struct start *s;

	if (mnt < 0)
		return;
	s = bpf_task_storage_get(&call_start, bpf_get_current_task_btf(), 0,
				 BPF_LOCAL_STORAGE_GET_F_CREATE);
	if (!s) {
		health_inc(HEALTH_START_FULL);
		return;
	}
	s->ts = 0;
	if (timed(op))
		s->ts = sample_start(op, &s->weight, bpf_get_current_task());
	s->mnt = mnt;
	s->flags = flags;
	s->op = op;
	s->file = (__u64)file;
}

static void cancel_call_start(void)
{
	struct start *s = bpf_task_storage_get(&call_start, bpf_get_current_task_btf(), 0, 0);

	if (s)
		s->op = OP_MAX;
}

/* Finish the call started on this thread. A call that began before the probe
 * was attached has no start and is not counted. */
static __always_inline int finish(long ret)
{
	struct start *s = bpf_task_storage_get(&call_start, bpf_get_current_task_btf(), 0, 0);
	struct file *file;
	__u32 mnt, flags, op, weight;
	__u64 delta;

	if (!s || s->op >= OP_MAX)
		return 0;
	delta = s->ts ? bpf_ktime_get_ns() - s->ts : 0;
	mnt = s->mnt; flags = s->flags; op = s->op; weight = s->weight;
	if (delta)
		sample_timed(op, s->ts, weight);
	file = (struct file *)s->file;
	s->op = OP_MAX;
	account(mnt, flags, op, ret, delta, weight);
	if (file && ret == 0 && (BPF_CORE_READ(file, f_mode) & FMODE_CREATED))
		account(mnt, flags, OP_CREATE, ret, 0, 0);
	return 0;
}

static __always_inline void dentry_start(__u32 op, struct dentry *d)
{
	struct super_block *sb = BPF_CORE_READ(d, d_sb);
	int flags;

	if (!sb)
		return;
	flags = dev_key_flags(sb);
	if (flags >= 0)
		save_start(op, BPF_CORE_READ(sb, s_dev), flags, 0);
}

static __always_inline void file_start(__u32 op, struct file *f)
{
	if (!f)
		return;
	save_start(op, mount_id(file_vfsmount(f)), 0, 0);
}

/* A kernel may inline the whole fdatasync path into the syscall (Debian's 6.1
 * does: the datasync=1 specialisation of do_fsync absorbs vfs_fsync_range),
 * and then no VFS hook sees the call. The syscall's own trace events fire for
 * this one syscall only, so they cost nothing elsewhere. Enter opens a start
 * like the kprobes do; where vfs_fsync_range is still called, its hooks
 * replace (kprobe) or cancel (fexit) that start, and exit finds nothing left
 * to count. */

SEC("tracepoint/syscalls/sys_enter_fdatasync")
int sc_enter_fdatasync(struct sys_enter_ctx *ctx)
{ file_start(OP_FSYNC, fd_file(bpf_get_current_task_btf(), ctx->args[0])); return 0; }
SEC("tracepoint/syscalls/sys_exit_fdatasync")
int sc_exit_fdatasync(struct sys_exit_ctx *ctx)
{ return finish(ctx->ret); }

#define KP_FILE(fn, op)							\
SEC("kprobe/" #fn) int BPF_KPROBE(kp_##fn, struct file *f)		\
{ file_start(op, f); return 0; }					\
SEC("kretprobe/" #fn) int BPF_KRETPROBE(kr_##fn, long ret)		\
{ return finish(ret); }

#define KP_DENTRY(fn, op)						\
SEC("kprobe/" #fn) int BPF_KPROBE(kp_##fn, void *ns, struct inode *dir, struct dentry *d) \
{ dentry_start(op, d); return 0; }					\
SEC("kretprobe/" #fn) int BPF_KRETPROBE(kr_##fn, __u64 ret)		\
{ return finish(int_ret(ret)); }

KP_FILE(vfs_read, OP_READ)
KP_FILE(vfs_readv, OP_READ)
KP_FILE(vfs_write, OP_WRITE)
KP_FILE(vfs_writev, OP_WRITE)
KP_DENTRY(vfs_unlink, OP_UNLINK)
KP_DENTRY(vfs_mkdir, OP_MKDIR)
KP_DENTRY(vfs_rmdir, OP_RMDIR)

SEC("kprobe/vfs_fsync_range") int BPF_KPROBE(kp_vfs_fsync_range, struct file *f)
{ file_start(OP_FSYNC, f); return 0; }
SEC("kretprobe/vfs_fsync_range") int BPF_KRETPROBE(kr_vfs_fsync_range, __u64 ret)
{ return finish(int_ret(ret)); }

SEC("kprobe/vfs_open") int BPF_KPROBE(kp_vfs_open, const struct path *p, struct file *f)
{ save_start(OP_OPEN, mount_id(BPF_CORE_READ(p, mnt)), 0, f); return 0; }
SEC("kretprobe/vfs_open") int BPF_KRETPROBE(kr_vfs_open, __u64 ret)
{ return finish(int_ret(ret)); }

SEC("kprobe/vfs_rename") int BPF_KPROBE(kp_vfs_rename, struct renamedata *rd)
{ dentry_start(OP_RENAME, BPF_CORE_READ(rd, old_dentry)); return 0; }
SEC("kretprobe/vfs_rename") int BPF_KRETPROBE(kr_vfs_rename, __u64 ret)
{ return finish(int_ret(ret)); }
