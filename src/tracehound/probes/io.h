/* The I/O probe's map layout contract: shared by io.bpf.c and its hook
 * files, read by tracehound/probes/io.py, whose LAYOUTS a test checks against
 * the BTF of the built object. */
#ifndef TRACEHOUND_IO_H
#define TRACEHOUND_IO_H

enum io_op {
	OP_READ = 0,
	OP_WRITE,
	OP_OPEN,
	OP_CREATE,
	OP_UNLINK,
	OP_MKDIR,
	OP_RMDIR,
	OP_RENAME,
	OP_FSYNC,
	OP_MAX,
};

enum io_hist {
	HIST_READ = 0,
	HIST_WRITE,
	HIST_FSYNC,
	HIST_MAX,
	HIST_NONE = -1,
};

/* log2(ns) buckets: slot i counts latencies in [2^i, 2^(i+1)) ns; the last
 * slot also takes everything slower (2^31 ns ~ 2.1 s). */
#define HIST_SLOTS 32

/* key.flags: the mnt field holds a device number (s_dev) rather than a mount
 * id; used by VFS hooks that only see a dentry (mkdir, unlink, ...). */
#define IO_KEY_DEV 1
/* key.flags: a user owns the mount or file system (a user namespace made
 * it): such keys never take the slots kept for the node's own (settings.
 * reserved) */
#define IO_KEY_FOREIGN 2

struct io_key {
	__u64 cgroup_id;
	__u32 mnt;
	__u32 flags;
};

/* One (cgroup, mount) entry's counters, in a slot of the io_stats array.
 * `owner` is the key the slot belongs to: a CPU's remembered slot is used
 * only while it still matches. */
struct io_stats {
	struct io_key owner;
	__u64 bytes[2];          /* OP_READ, OP_WRITE: bytes actually transferred */
	__u64 calls[OP_MAX];     /* every call, timed or not */
	__u64 errors[OP_MAX];    /* every error but a name lookup's ENOENT */
	__u64 not_found[OP_MAX]; /* ENOENT from open..rename: a name that is not there */
	__u64 lat_sum_ns[HIST_MAX];          /* of the timed calls, each times its weight */
	__u64 hist[HIST_MAX][HIST_SLOTS];    /* timed calls, each counted as its weight */
	__u64 cache_fill;        /* bytes of file pages added to the page cache */
};

/* Index of counters in the io_health array. */
enum io_health {
	HEALTH_STATS_FULL = 0,   /* io_stats had no room for a new key */
	HEALTH_START_FULL,       /* no task storage for a call in flight */
	HEALTH_STATS_RESERVE,    /* a new key that may not take the slots kept
				  * for the node's own found only those left */
	HEALTH_MAX,
};

/* What the loader knows before load, fixed in .rodata: the verifier sees
 * the values and drops the code they switch off, and no event pays a map
 * read for them. */
/* settings.tp_ops bits above the enum io_op ones: syscalls the raw syscall
 * hooks count for groups that move data without read/write calls */
#define TP_COPY (1u << 16)    /* copy_file_range, sendfile, splice */
#define TP_AIO (1u << 17)     /* io_getevents, io_pgetevents */

struct io_settings {
	__u32 agent_mnt_ns;   /* inode of the agent's mount namespace */
	__u32 tp_ops;         /* bit per enum io_op counted by the syscall hooks, and TP_* */
	__u32 timed_ops;      /* bit per enum io_op whose latency is measured */
	__u32 slots;          /* max_entries of io_stats and io_slots */
	__u32 sample_gap_ns;  /* sampled timing: aim for one timed call of a kind per
			       * CPU per this many ns; 0: time every call */
	__u32 audit;          /* 1: time every call, sampled or not, into io_audit too
			       * (measuring the sampler on the same calls and clock) */
	__u32 reserved;       /* the last this many slots of io_stats go only to keys
			       * of a cgroup root made and a mount no user owns */
};

/* The full histograms of one (cgroup, mount) in io_audit: every timed op's
 * call counted once, sampled or not. */
struct io_audit {
	__u64 hist[HIST_MAX][HIST_SLOTS];
	__u64 picked[HIST_MAX];   /* calls the sampler picked (a weight): the key's own timed calls */
};

/* Sampled timing, per CPU and histogram (io_samplers): while calls of a kind
 * come fast on a CPU, one call in an interval of about 2^k is timed and its
 * latency stands for all the calls since the last timed one (its weight);
 * each timed call sets k from the call rate it measured, so rare calls are
 * always timed, and so is the first call of a kind on a CPU after the rate
 * fell (a tick with no such call, or with fewer than one interval) or from
 * another task. */
#define SAMPLE_K_MAX 8        /* intervals average at most 2^8 calls */

struct io_sampler {
	__u64 last_ts;        /* start of the last timed call */
	__u64 timed;          /* calls timed */
	__u64 tick;           /* jiffies at the last call */
	__u64 task;           /* the task that made it */
	__u32 since;          /* calls since the last timed one */
	__u32 interval;       /* the next timed call is the interval-th */
	__u32 in_tick;        /* calls in the tick of the last one */
	__u32 pad;
};

#define FSTYPE_LEN 16
struct fstype_name {
	char name[FSTYPE_LEN];
};

#define PATH_LEN 256
struct mnt_lpm_key {
	__u32 prefixlen;
	char path[PATH_LEN];
};

struct mnt_lpm_value {
	__u32 mnt_id;
	__u32 skip;
};

#endif
