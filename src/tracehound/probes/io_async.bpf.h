/* I/O that moves file data past the VFS read/write functions, for every hook
 * mode. Included by io.bpf.c; shares its maps and helpers.
 *
 *   io_uring     counted at each request's completion (io_uring_complete),
 *                for the task that submitted it, bytes from the result,
 *                latency from its submission
 *   Linux AIO    counted when the application reaps the completions
 *                (io_getevents, io_pgetevents), bytes from each io_event
 *   copies       copy_file_range, sendfile and splice: bytes read on the
 *                source's mount and written on the target's, at syscall exit
 *   page cache   every file page added to the page cache (read-ahead, read
 *                misses, mmap faults, and the pages a write allocates)
 *
 * io_uring and AIO call the file's ->read_iter/->write_iter directly and the
 * copies go through splice, so none of this is also seen by the vfs_read,
 * vfs_write or read/write syscall hooks: nothing is counted twice.
 *
 * The raw syscall hooks (tracepoint mode) read the copies' and reaps'
 * arguments from the saved user registers; the VFS modes use the syscalls'
 * own trace events, which fire for these syscalls only. */

#define PAGE_SIZE 4096

/* uapi/linux/io_uring.h opcodes: a stable ABI */
#define IORING_OP_READV 1
#define IORING_OP_WRITEV 2
#define IORING_OP_FSYNC 3
#define IORING_OP_READ_FIXED 4
#define IORING_OP_WRITE_FIXED 5
#define IORING_OP_READ 22
#define IORING_OP_WRITE 23
#define IORING_OP_READV_FIXED 60
#define IORING_OP_WRITEV_FIXED 61

/* uapi/linux/aio_abi.h */
#define IOCB_CMD_PREAD 0
#define IOCB_CMD_PWRITE 1
#define IOCB_CMD_FSYNC 2
#define IOCB_CMD_FDSYNC 3
#define IOCB_CMD_PREADV 7
#define IOCB_CMD_PWRITEV 8

struct io_event_user {
	__u64 data;
	__u64 obj;      /* the user's struct iocb */
	__s64 res;
	__s64 res2;
};

/* struct iocb from aio_lio_opcode on (offset 16, little endian) */
struct iocb_cmd {
	__u16 opcode;
	__s16 reqprio;
	__u32 fildes;
};
#define IOCB_CMD_AT 16

/* a reap returns at most nr events; bound the walk all the same */
#define AIO_MAX_EVENTS 65536

/* io_uring and AIO run an fsync through vfs_fsync_range, which the VFS
 * modes hook: there that hook counts and times it, once. Only where fsync is
 * counted at its syscall (tracepoint mode) is it counted at completion. */
static __always_inline bool async_fsync_counted_here(void)
{
	return settings.tp_ops & (1u << OP_FSYNC);
}

/* ---- io_uring ------------------------------------------------------------ */

static __always_inline int uring_op(__u8 opcode)
{
	switch (opcode) {
	case IORING_OP_READV: case IORING_OP_READ_FIXED: case IORING_OP_READ:
	case IORING_OP_READV_FIXED:
		return OP_READ;
	case IORING_OP_WRITEV: case IORING_OP_WRITE_FIXED: case IORING_OP_WRITE:
	case IORING_OP_WRITEV_FIXED:
		return OP_WRITE;
	case IORING_OP_FSYNC:
		return async_fsync_counted_here() ? OP_FSYNC : -1;
	}
	return -1;
}

/* When each timed request was submitted, in a slot picked by its address:
 * one 64-bit word holding 15 more bits of the address (to tell requests
 * sharing a slot apart), the weight of the sample (9 bits: intervals are
 * below 2^(SAMPLE_K_MAX+1)) and the low 40 bits of the submission time in ns
 * (latencies up to 18 minutes), so a reader on another CPU never sees half
 * an entry and no helper call is made. A request whose slot another one
 * took meanwhile, or that was in flight when the probe attached, is
 * counted untimed. */
#define URING_SLOTS 16384
#define URING_TS_BITS 40
#define URING_TS_MASK ((1ULL << URING_TS_BITS) - 1)
#define URING_WEIGHT_BITS 9
#define URING_WEIGHT_MASK ((1ULL << URING_WEIGHT_BITS) - 1)
#define URING_TAG_SHIFT (URING_TS_BITS + URING_WEIGHT_BITS)
__u64 uring_starts[URING_SLOTS];

static __always_inline __u64 *uring_slot(__u64 req, __u64 *tag)
{
	*tag = (req >> 22) & 0x7fff;
	return &uring_starts[(req >> 8) & (URING_SLOTS - 1)];
}

/* The request's fields. Both events pass it untyped on some kernels, so it
 * is viewed through bpf_rdonly_cast (plain loads) where the kernel has it,
 * and read with probe reads where it does not. */
#ifdef IO_PROBE_READS
#define REQ_OPCODE(req) BPF_CORE_READ((struct io_kiocb *)(req), opcode)
#else
#define REQ_OPCODE(req) VIEW(struct io_kiocb, req)->opcode
#endif

static __always_inline void uring_submitted(void *req)
{
	int op = uring_op(REQ_OPCODE(req));
	__u64 tag, *slot, now;
	__u32 weight;

	if (op < 0 || !timed(op))
		return;
	now = sample_start(op, &weight, bpf_get_current_task());
	if (!now)
		return;
	/* it completes on any CPU, microseconds later and more: its CPU's
	 * sampler is set now */
	sample_timed(op, now, weight);
	slot = uring_slot((__u64)req, &tag);
	*slot = tag << URING_TAG_SHIFT | (weight & URING_WEIGHT_MASK) << URING_TS_BITS |
		(now & URING_TS_MASK);
}

/* The submit event's name since 6.5, and before; the request comes first.
 * Raw tracepoints: their arguments are plain numbers, so the request's
 * address can pick a slot (a BTF-typed pointer allows no such arithmetic). */
SEC("raw_tp/io_uring_submit_req")
int BPF_PROG(rt_io_uring_submit_req, void *req)
{
	uring_submitted(req);
	return 0;
}

SEC("raw_tp/io_uring_submit_sqe")
int BPF_PROG(rt_io_uring_submit_sqe, void *req)
{
	uring_submitted(req);
	return 0;
}

/* The cgroup of the request's submitter: usually the current task, which
 * runs its own completions as task work; an io-wq worker, the SQPOLL thread
 * or another task may post them too. */
static __always_inline __u64 submitter_cgroup(struct task_struct *task)
{
	/* The current task is asked for again, not reused: once the two are
	 * known equal the compiler may load through `task`, a plain number to
	 * the verifier where it came from a probe read (6.1 refused that). */
	if ((__u64)task == (__u64)bpf_get_current_task_btf())
		return cgroup_id_of(bpf_get_current_task_btf());
#ifdef IO_PROBE_READS
	return task_cgroup_key(task);
#else
	return cgroup_id_of(VIEW(struct task_struct, task));
#endif
}

static __always_inline void uring_done(void *ptr)
{
	struct task_struct *task;
	struct io_kiocb *req;
	struct file *file;
	__u64 delta = 0, tag, seen, *slot;
	__u32 weight = 0;
	long res;
	int op, mnt;

	if (!ptr)
		return;           /* an auxiliary completion, no request behind it */
#ifdef IO_PROBE_READS
	req = ptr;
	op = uring_op(BPF_CORE_READ(req, opcode));
	if (op < 0)
		return;
	if (bpf_core_field_exists(req->task))
		task = BPF_CORE_READ(req, task);
	else
		task = BPF_CORE_READ(req, tctx, task);
	file = BPF_CORE_READ(req, file);
	res = BPF_CORE_READ(req, cqe.res);
#else
	req = VIEW(struct io_kiocb, ptr);
	op = uring_op(req->opcode);
	if (op < 0)
		return;
	if (bpf_core_field_exists(req->task))
		task = req->task;
	else
		task = req->tctx->task;
	file = req->file;
	res = req->cqe.res;
#endif
	if (!task || !file)
		return;
	mnt = mount_id(file_vfsmount(file));
	if (mnt < 0)
		return;
	if (timed(op)) {
		slot = uring_slot((__u64)ptr, &tag);
		seen = *slot;
		if (seen && seen >> URING_TAG_SHIFT == tag) {
			delta = (bpf_ktime_get_ns() - seen) & URING_TS_MASK;
			weight = (seen >> URING_TS_BITS) & URING_WEIGHT_MASK;
			*slot = 0;
		}
	}
	account_cg(submitter_cgroup(task), mnt, 0, op, res, delta, weight);
}

SEC("raw_tp/io_uring_complete")
int BPF_PROG(rt_io_uring_complete, void *ring, void *req)
{
	uring_done(req);
	return 0;
}

/* ---- the page cache --------------------------------------------------------- */

SEC("tp_btf/mm_filemap_add_to_page_cache")
int BPF_PROG(tb_filemap_add, struct folio *folio)
{
	struct address_space *mapping = folio->mapping;
	struct super_block *sb;
	unsigned long flags;
	__u64 pages = 1;
	struct io_stats *s;
	struct io_key key = {};
	int key_flags;

	if (!mapping)
		return 0;
	sb = mapping->host->i_sb;
	if (!sb)
		return 0;
	key_flags = dev_key_flags(sb);
	if (key_flags < 0)
		return 0;
	key.mnt = sb->s_dev;
	key.flags = key_flags;
	/* a page's flags word comes first in struct page and struct folio in
	 * every kernel, whatever its C type (memdesc_flags_t since 6.18) */
	flags = *(unsigned long *)folio;
	if (flags & (1UL << bpf_core_enum_value(enum pageflags, PG_head))) {
		if (bpf_core_field_exists(folio->_nr_pages))
			pages = folio->_nr_pages;
		else if (bpf_core_field_exists(folio->_folio_nr_pages))
			pages = folio->_folio_nr_pages;
	}
	key.cgroup_id = cgroup_id_of(bpf_get_current_task_btf());
	s = stats_of(&key);
	if (s)
		__sync_fetch_and_add(&s->cache_fill, pages * PAGE_SIZE);
	return 0;
}

/* ---- copies and AIO reaps, shared by both syscall hook kinds --------------- */

/* A copy of `ret` bytes from fd_in to fd_out. A pipe's or socket's side is on
 * a skipped file system and is not counted. A failed call does not say which
 * side failed: it counts as a failed write on its target, or as a failed
 * read where the target is not a counted file. */
static __always_inline void copy_done(struct task_struct *task, long fd_in, long fd_out, long ret)
{
	int in = fd_mount(task, fd_in), out = fd_mount(task, fd_out);

	if (is_err(ret)) {
		if (out >= 0)
			account_in(task, out, 0, OP_WRITE, ret, 0, 0);
		else if (in >= 0)
			account_in(task, in, 0, OP_READ, ret, 0, 0);
		return;
	}
	if (in >= 0)
		account_in(task, in, 0, OP_READ, ret, 0, 0);
	if (out >= 0)
		account_in(task, out, 0, OP_WRITE, ret, 0, 0);
}

static long aio_event(__u32 i, void *ctx)
{
	__u64 events = *(__u64 *)ctx;
	struct task_struct *task = bpf_get_current_task_btf();
	struct io_event_user ev;
	struct iocb_cmd cmd;
	int op, mnt;

	if (bpf_probe_read_user(&ev, sizeof(ev), (void *)(events + (__u64)i * sizeof(ev))))
		return 1;
	if (bpf_probe_read_user(&cmd, sizeof(cmd), (void *)(ev.obj + IOCB_CMD_AT)))
		return 0;
	switch (cmd.opcode) {
	case IOCB_CMD_PREAD: case IOCB_CMD_PREADV:
		op = OP_READ;
		break;
	case IOCB_CMD_PWRITE: case IOCB_CMD_PWRITEV:
		op = OP_WRITE;
		break;
	case IOCB_CMD_FSYNC: case IOCB_CMD_FDSYNC:
		if (!async_fsync_counted_here())
			return 0;
		op = OP_FSYNC;
		break;
	default:
		return 0;
	}
	mnt = fd_mount(task, cmd.fildes);
	if (mnt >= 0)
		account_in(task, mnt, 0, op, ev.res, 0, 0);
	return 0;
}

/* `n` completions were copied to the user's io_event array: each names its
 * iocb, which still holds the operation and the file descriptor. */
static __always_inline void aio_reaped(__u64 events, long n)
{
	if (n <= 0 || !events)
		return;
	bpf_loop(n < AIO_MAX_EVENTS ? n : AIO_MAX_EVENTS, aio_event, &events, 0);
}

/* ---- the syscalls' own trace events (fentry and kprobe modes) ----------- */

struct sys_enter_ctx { __u64 common; int nr; unsigned long args[6]; };
struct sys_exit_ctx { __u64 common; int nr; long ret; };

enum { CALL_NONE = 0, CALL_COPY, CALL_AIO };

/* What enter saw of a copy or a reap in flight on a thread. */
struct pending_call {
	__u32 kind;     /* CALL_* */
	__u32 pad;
	__u64 a;        /* copy: source fd; reap: the io_event array */
	__u64 b;        /* copy: target fd */
};

struct {
	__uint(type, BPF_MAP_TYPE_TASK_STORAGE);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, int);
	__type(value, struct pending_call);
} pending_calls SEC(".maps");

static __always_inline void call_enter(__u32 kind, __u64 a, __u64 b)
{
	struct pending_call *c = bpf_task_storage_get(&pending_calls, bpf_get_current_task_btf(), 0,
						      BPF_LOCAL_STORAGE_GET_F_CREATE);

	if (!c) {
		health_inc(HEALTH_START_FULL);
		return;
	}
	c->kind = kind;
	c->a = a;
	c->b = b;
}

/* The call that began before the probe was attached has no entry and is
 * not counted. */
static __always_inline void call_exit(long ret)
{
	struct task_struct *task = bpf_get_current_task_btf();
	struct pending_call *c = bpf_task_storage_get(&pending_calls, task, 0, 0);
	__u32 kind;

	if (!c)
		return;
	kind = c->kind;
	c->kind = CALL_NONE;
	if (kind == CALL_COPY)
		copy_done(task, c->a, c->b, ret);
	else if (kind == CALL_AIO)
		aio_reaped(c->a, ret);
}

#define SC_CALL(name, kind, a, b)						\
SEC("tracepoint/syscalls/sys_enter_" #name)					\
int sc_enter_##name(struct sys_enter_ctx *ctx)					\
{ call_enter(kind, a, b); return 0; }						\
SEC("tracepoint/syscalls/sys_exit_" #name)					\
int sc_exit_##name(struct sys_exit_ctx *ctx)					\
{ call_exit(ctx->ret); return 0; }

SC_CALL(copy_file_range, CALL_COPY, ctx->args[0], ctx->args[2])
SC_CALL(splice, CALL_COPY, ctx->args[0], ctx->args[2])
SC_CALL(sendfile64, CALL_COPY, ctx->args[1], ctx->args[0])
SC_CALL(io_getevents, CALL_AIO, ctx->args[3], 0)
SC_CALL(io_pgetevents, CALL_AIO, ctx->args[3], 0)
