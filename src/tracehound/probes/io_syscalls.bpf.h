/* Syscall-level hooks of the I/O probe, for kernels that refuse fentry and
 * kprobes. Included by io.bpf.c; shares its maps and helpers.
 *
 * Two BTF-typed raw tracepoints (sys_enter, sys_exit) cover every syscall:
 * cheaper than one classic tracepoint per syscall, which builds a trace
 * record before calling the program. Enter only timestamps the calls whose
 * latency is measured, and is not attached at all when none is (latency
 * off): everything else is decided at exit, where the saved user registers
 * still hold the arguments. */

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

static __always_inline bool tp_counts(int op)
{
	return op >= 0 && (settings.tp_ops & (1u << op));
}

SEC("tp_btf/sys_enter")
int BPF_PROG(tp_sys_enter, struct pt_regs *regs, long id)
{
	int op = syscall_op(id);
	struct task_struct *task;

	/* timed ops are read, write and fsync: each names its file by fd */
	if (tp_counts(op) && timed(op)) {
		task = bpf_get_current_task_btf();
		clock_start(CLOCK_SYSCALL, id, op, fd_mount(task, ((struct pt_regs___th *)regs)->di),
			    task);
	}
	return 0;
}

/* open-type calls: the opened file's mount when it succeeded, otherwise the
 * mount the path points into */
static __always_inline void tp_open_exit(struct task_struct *task, long id, struct pt_regs___th *r,
					 long ret)
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
	mnt = ret >= 0 ? fd_mount(task, ret) : path_mount(task, dirfd, path);
	if (mnt < 0)
		return;
	account_in(task, mnt, 0, OP_OPEN, ret, 0, 0);
	if (flags & O_CREAT)
		account_in(task, mnt, 0, OP_CREATE, ret, 0, 0);
}

/* copies and AIO reaps (io_async.bpf.h), for the groups in this mode */
static __always_inline void tp_async_exit(long id, struct pt_regs___th *r, long ret)
{
	if (settings.tp_ops & TP_COPY) {
		if (id == NR(copy_file_range) || id == NR(splice))
			copy_done(bpf_get_current_task_btf(), r->di, r->dx, ret);
		else if (id == NR(sendfile))
			copy_done(bpf_get_current_task_btf(), r->si, r->di, ret);
	}
	if ((settings.tp_ops & TP_AIO) && (id == NR(io_getevents) || id == NR(io_pgetevents)))
		aio_reaped(r->r10, ret);
}

SEC("tp_btf/sys_exit")
int BPF_PROG(tp_sys_exit, struct pt_regs *regs, long ret)
{
	struct pt_regs___th *r = (void *)regs;
	long id = r->orig_ax;
	int op = syscall_op(id), mnt;
	struct task_struct *task;
	__u64 delta = 0, cgroup;
	__u32 weight = 0;

	if (!tp_counts(op)) {
		if (op < 0 && (settings.tp_ops & (TP_COPY | TP_AIO)))
			tp_async_exit(id, r, ret);
		return 0;
	}
	if (op == OP_READ || op == OP_WRITE || op == OP_FSYNC) {
		mnt = MNT_UNKNOWN;
		/* the mount and cgroup its entry found, where it saw the call */
		if (timed(op))
			delta = clock_stop(CLOCK_SYSCALL, id, &weight, &mnt, &cgroup);
		if (mnt == MNT_UNKNOWN) {
			task = bpf_get_current_task_btf();
			mnt = fd_mount(task, r->di);
			cgroup = cgroup_id_of(task);
		}
		if (mnt >= 0)
			account_cg(cgroup, mnt, 0, op, ret, delta, weight);
		return 0;
	}
	task = bpf_get_current_task_btf();
	switch (op) {
	case OP_OPEN:
		tp_open_exit(task, id, r, ret);
		return 0;
	default:
		if (id == NR(mkdirat) || id == NR(unlinkat) || id == NR(renameat) ||
		    id == NR(renameat2)) {
			if (id == NR(unlinkat) && (r->dx & AT_REMOVEDIR))
				op = OP_RMDIR;
			mnt = path_mount(task, r->di, (const char *)r->si);
		} else {
			mnt = path_mount(task, AT_FDCWD, (const char *)r->di);
		}
	}
	if (mnt >= 0)
		account_in(task, mnt, 0, op, ret, 0, 0);
	return 0;
}

