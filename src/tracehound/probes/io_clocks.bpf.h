/* Clocks of the I/O probe's timed calls, for the syscall hooks and fentry.
 * Included by io.bpf.c; uses its health counters.
 *
 * The start of the timed call in flight on each CPU: a per-CPU slot, read
 * and written without a helper call. When a task is switched out in the
 * middle of a call (tp_sched_switch), the slot's start moves to that task's
 * own storage and the slot is emptied, so a slot in use always belongs to
 * the task running on its CPU; exit looks in the task's storage when the
 * slot is empty. One slot for the syscall hooks, one for fentry.
 *
 * Entry also keeps the call's mount and cgroup, so that exit, which finds
 * them in the slot, needs neither the task (a helper call, the dearest step
 * of the hook after the clock) nor the file: a call is counted where it
 * started. */
enum clock_user { CLOCK_SYSCALL = 0, CLOCK_VFS, CLOCKS };

struct clock {
	__u64 ts;      /* 0: no call in flight; CLOCK_UNTIMED: one not sampled */
	long id;       /* syscall number, or op for VFS calls */
	__u32 weight;  /* the calls a timed one stands for (io_sample.bpf.h) */
	__u32 op;      /* its kind, whose sampler picked it */
	int mnt;       /* its file's mount, found at entry; < 0: not counted */
	__u32 pad;
	__u64 cgroup;  /* its task's cgroup key at entry (when mnt >= 0) */
};

/* what clock_stop says of the mount when it found no start of the call */
#define MNT_UNKNOWN (-2)

/* ts of a call in flight that is not timed: exit then knows it has no start
 * to look for elsewhere (no clock reads 1 ns after boot) */
#define CLOCK_UNTIMED 1

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, CLOCKS);
	__type(key, __u32);
	__type(value, struct clock);
} clocks SEC(".maps");

struct moved_clocks {
	struct clock c[CLOCKS];
};

struct {
	__uint(type, BPF_MAP_TYPE_TASK_STORAGE);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, int);
	__type(value, struct moved_clocks);
} moved_clocks SEC(".maps");

/* The slot of a clock user. The key is a copy: `user` itself must stay out
 * of memory, or older verifiers lose its bound when it is read back to
 * index moved_clocks. */
static __always_inline struct clock *clock_slot(__u32 user)
{
	__u32 key = user;

	return bpf_map_lookup_elem(&clocks, &key);
}

/* The start of a call of `op` by `task` on a file of mount `mnt` (< 0: a
 * file the probe does not count, a pipe or a socket: no clock, and the
 * sampler never sees it, so its weights count only calls that are counted). */
static __always_inline void clock_start(__u32 user, long id, __u32 op, int mnt,
					struct task_struct *task)
{
	struct clock *c = clock_slot(user);
	__u32 weight = 0;
	__u64 ts = mnt >= 0 ? sample_start(op, &weight, (__u64)task) : 0;

	if (!c)
		return;
	c->id = id;
	c->op = op;
	c->mnt = mnt;
	if (mnt >= 0)
		c->cgroup = cgroup_id_of(task);
	c->ts = ts ? ts : CLOCK_UNTIMED;
	c->weight = weight;
}

/* ns since this call's clock_start, or 0 when it has none (not sampled, or
 * it began before the probe was attached); *weight: the calls it stands for;
 * *mnt and *cgroup: its file's mount and its cgroup as found at its start,
 * *mnt MNT_UNKNOWN without one (then *cgroup is left alone) */
static __always_inline __u64 clock_stop(__u32 user, long id, __u32 *weight, int *mnt,
					__u64 *cgroup)
{
	struct clock *c = clock_slot(user);
	struct moved_clocks *moved;
	__u64 ts = 0, now;
	__u32 op = 0;

	if (!c || user >= CLOCKS)
		return 0;
	if (c->ts) {
		if (c->id == id) {
			*mnt = c->mnt;
			*cgroup = c->cgroup;
			if (c->ts != CLOCK_UNTIMED) {
				ts = c->ts;
				*weight = c->weight;
				op = c->op;
			}
		}
		c->ts = 0;
	} else {
		moved = bpf_task_storage_get(&moved_clocks, bpf_get_current_task_btf(), 0, 0);
		if (moved && moved->c[user].ts && moved->c[user].id == id) {
			ts = moved->c[user].ts;
			*weight = moved->c[user].weight;
			*mnt = moved->c[user].mnt;
			*cgroup = moved->c[user].cgroup;
			op = moved->c[user].op;
			moved->c[user].ts = 0;
		}
	}
	if (!ts)
		return 0;
	now = bpf_ktime_get_ns();
	sample_timed(op, ts, *weight);
	return now - ts;
}

static __always_inline void move_clock(__u32 user, struct task_struct *prev)
{
	struct clock *c = clock_slot(user);
	struct moved_clocks *moved;

	if (!c || !c->ts || user >= CLOCKS)
		return;
	if (c->ts == CLOCK_UNTIMED) {
		/* nothing to carry: exit finds its mount again and counts it
		 * untimed, on whatever CPU. Its place among the calls since this
		 * CPU's last timed one stays: a call that sleeps (a read from a
		 * disk) is one of the calls the next timed one stands for, like
		 * any other, or calls that sleep would weigh less than the rest */
		c->ts = 0;
		return;
	}
	moved = bpf_task_storage_get(&moved_clocks, prev, 0, BPF_LOCAL_STORAGE_GET_F_CREATE);
	if (moved)
		moved->c[user] = *c;
	else
		health_inc(HEALTH_START_FULL);
	c->ts = 0;
}

/* Attached whenever some call is timed in syscall or fentry mode. */
SEC("tp_btf/sched_switch")
int BPF_PROG(tp_sched_switch, bool preempt, struct task_struct *prev, struct task_struct *next)
{
	move_clock(CLOCK_SYSCALL, prev);
	move_clock(CLOCK_VFS, prev);
	return 0;
}
