/* VFS-level hooks of the I/O probe (fentry/fexit and kprobe/kretprobe).
 * Included by io.bpf.c; shares its maps and helpers.
 *
 * Data operations see the struct file and so the exact mount. Namespace
 * operations (mkdir, unlink, rmdir, rename) only see a dentry: they are keyed
 * by the super block's device number and userspace maps it to a mount. */

/* int-returning functions may leave the upper half of rax undefined, and
 * vfs_mkdir returns a dentry pointer on newer kernels: accept both shapes. */
static __always_inline long int_ret(__u64 r)
{
	return (r >> 32) == 0 ? (long)(int)r : (long)r;
}

static __always_inline void save_start(__u32 op, long mnt, __u32 flags, struct file *file)
{
	__u32 tid = (__u32)bpf_get_current_pid_tgid();
	struct start s = {
		.ts = bpf_ktime_get_ns(), .mnt = mnt, .flags = flags, .op = op, .file = (__u64)file,
	};

	if (mnt < 0)
		return;
	if (bpf_map_update_elem(&io_start, &tid, &s, BPF_ANY))
		health_inc(HEALTH_START_FULL);
}

/* Finish the call started on this thread. A call that began before the probe
 * was attached has no start and is not counted. */
static __always_inline int finish(long ret)
{
	__u32 tid = (__u32)bpf_get_current_pid_tgid();
	struct start *s = bpf_map_lookup_elem(&io_start, &tid);
	struct file *file;
	__u32 mnt, flags, op;
	bool created;
	__u64 delta;

	if (!s)
		return 0;
	delta = bpf_ktime_get_ns() - s->ts;
	mnt = s->mnt; flags = s->flags; op = s->op;
	file = (struct file *)s->file;
	bpf_map_delete_elem(&io_start, &tid);
	account(mnt, flags, op, ret, delta);
	/* vfs_open: created means the file did not exist before */
	created = file && ret == 0 && (BPF_CORE_READ(file, f_mode) & FMODE_CREATED);
	if (created)
		account(mnt, flags, OP_CREATE, ret, delta);
	return 0;
}

static __always_inline void dentry_start(__u32 op, struct dentry *d)
{
	struct super_block *sb = BPF_CORE_READ(d, d_sb);

	if (!sb || skip_sb(sb))
		return;
	save_start(op, BPF_CORE_READ(sb, s_dev), IO_KEY_DEV, 0);
}

static __always_inline void file_start(__u32 op, struct file *f)
{
	if (!f)
		return;
	save_start(op, mount_id(BPF_CORE_READ(f, f_path.mnt)), 0, 0);
}

static __always_inline void open_start(const struct path *p, struct file *f)
{
	save_start(OP_OPEN, mount_id(BPF_CORE_READ(p, mnt)), 0, f);
}

/* ---- fdatasync, for both VFS modes --------------------------------------
 * A kernel may inline the whole fdatasync path into the syscall (Debian's 6.1
 * does: the datasync=1 specialisation of do_fsync absorbs vfs_fsync_range),
 * and then no VFS hook sees the call. The syscall's own trace events fire for
 * this one syscall only, so they cost nothing elsewhere. Enter opens a start
 * like the VFS hooks do; where vfs_fsync_range is still called, its hooks
 * replace and finish that start, and exit finds nothing left to count. */

struct sys_enter_ctx { __u64 common; int nr; unsigned long args[6]; };
struct sys_exit_ctx { __u64 common; int nr; long ret; };

SEC("tracepoint/syscalls/sys_enter_fdatasync")
int sc_enter_fdatasync(struct sys_enter_ctx *ctx)
{ file_start(OP_FSYNC, fd_file(ctx->args[0])); return 0; }
SEC("tracepoint/syscalls/sys_exit_fdatasync")
int sc_exit_fdatasync(struct sys_exit_ctx *ctx)
{ return finish(ctx->ret); }

/* ---- fentry / fexit ----------------------------------------------------- */

#define FE_FILE(fn, op)							\
SEC("fentry/" #fn) int BPF_PROG(fe_##fn, struct file *f)		\
{ file_start(op, f); return 0; }

FE_FILE(vfs_read, OP_READ)
FE_FILE(vfs_readv, OP_READ)
FE_FILE(vfs_write, OP_WRITE)
FE_FILE(vfs_writev, OP_WRITE)
FE_FILE(vfs_fsync_range, OP_FSYNC)

SEC("fexit/vfs_read") int BPF_PROG(fx_vfs_read, struct file *f, char *b, unsigned long n, void *p, long ret)
{ return finish(ret); }
SEC("fexit/vfs_write") int BPF_PROG(fx_vfs_write, struct file *f, char *b, unsigned long n, void *p, long ret)
{ return finish(ret); }
SEC("fexit/vfs_readv") int BPF_PROG(fx_vfs_readv, struct file *f, void *v, unsigned long n, void *p,
				    int fl, long ret)
{ return finish(ret); }
SEC("fexit/vfs_writev") int BPF_PROG(fx_vfs_writev, struct file *f, void *v, unsigned long n, void *p,
				     int fl, long ret)
{ return finish(ret); }
SEC("fexit/vfs_fsync_range") int BPF_PROG(fx_vfs_fsync_range, struct file *f, long s, long e, int d,
					  int ret)
{ return finish(ret); }

SEC("fentry/vfs_open") int BPF_PROG(fe_vfs_open, const struct path *p, struct file *f)
{ open_start(p, f); return 0; }
SEC("fexit/vfs_open") int BPF_PROG(fx_vfs_open, const struct path *p, struct file *f, int ret)
{ return finish(ret); }

SEC("fentry/vfs_unlink") int BPF_PROG(fe_vfs_unlink, void *ns, struct inode *dir, struct dentry *d)
{ dentry_start(OP_UNLINK, d); return 0; }
SEC("fexit/vfs_unlink") int BPF_PROG(fx_vfs_unlink, void *ns, struct inode *dir, struct dentry *d,
				     void *deleg, int ret)
{ return finish(ret); }

SEC("fentry/vfs_mkdir") int BPF_PROG(fe_vfs_mkdir, void *ns, struct inode *dir, struct dentry *d)
{ dentry_start(OP_MKDIR, d); return 0; }
SEC("fexit/vfs_mkdir") int BPF_PROG(fx_vfs_mkdir, void *ns, struct inode *dir, struct dentry *d,
				    unsigned short mode, __u64 ret)
{ return finish(int_ret(ret)); }

SEC("fentry/vfs_rmdir") int BPF_PROG(fe_vfs_rmdir, void *ns, struct inode *dir, struct dentry *d)
{ dentry_start(OP_RMDIR, d); return 0; }
SEC("fexit/vfs_rmdir") int BPF_PROG(fx_vfs_rmdir, void *ns, struct inode *dir, struct dentry *d, int ret)
{ return finish(ret); }

SEC("fentry/vfs_rename") int BPF_PROG(fe_vfs_rename, struct renamedata *rd)
{ dentry_start(OP_RENAME, BPF_CORE_READ(rd, old_dentry)); return 0; }
SEC("fexit/vfs_rename") int BPF_PROG(fx_vfs_rename, struct renamedata *rd, int ret)
{ return finish(ret); }

/* ---- kprobe / kretprobe ------------------------------------------------- */

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
{ open_start(p, f); return 0; }
SEC("kretprobe/vfs_open") int BPF_KRETPROBE(kr_vfs_open, __u64 ret)
{ return finish(int_ret(ret)); }

SEC("kprobe/vfs_rename") int BPF_KPROBE(kp_vfs_rename, struct renamedata *rd)
{ dentry_start(OP_RENAME, BPF_CORE_READ(rd, old_dentry)); return 0; }
SEC("kretprobe/vfs_rename") int BPF_KRETPROBE(kr_vfs_rename, __u64 ret)
{ return finish(int_ret(ret)); }
