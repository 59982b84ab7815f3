/* Sampled timing of the I/O probe's calls. Included by io.bpf.c.
 *
 * A timed call costs two clock reads (about 60 ns each on a host, 170 ns
 * under an emulated HPET), more than the rest of its accounting. When calls
 * of a kind come fast on a CPU, one in an interval of about 2^k is timed and
 * counted in its histogram as every call since the last timed one (its
 * weight); when they come slowly every one is (k = 0), so a slow fsync among
 * few is never missed. Bytes, calls and errors are counted for every call.
 *
 * The decision costs a per-CPU count and one cheap helper call (the tick
 * counter; the caller hands over the task it already fetched): no clock, no
 * random number. Each timed call, which reads the clock anyway, sets the
 * next interval once its clock has stopped: k from the rate it measured since
 * the last timed one (about one call per settings.sample_gap_ns is timed),
 * the length drawn from the clock's bits among the odd numbers below
 * 2^(k+1), whose mean is 2^k, so a pattern in the calls cannot line up with
 * the sampling. A call is timed whatever the interval, standing for itself,
 * when the rate of its kind on its CPU fell (the last such call was in an
 * earlier tick than the one before, or its tick held fewer calls than one
 * interval) or when it comes from another task than the last one: after a
 * storm the calls that follow at a low rate are timed again within a tick,
 * calls rarer than one per tick always are, a task's rare calls are timed on
 * a CPU another task floods, and a weight only ever counts its own task's
 * calls. While calls keep coming fast a new tick changes nothing, so the
 * call after each timer interrupt is not timed more often than others. The
 * weights add up to the calls, less the untimed ones a fall in rate or a new
 * task cut short (at most one interval each), and never more: only calls
 * the probe counts reach the sampler (their file's mount is known at entry,
 * io_clocks.bpf.h), each once. An untimed call that sleeps keeps its place
 * (io_clocks.bpf.h move_clock). Where another task's call comes while it
 * sleeps, the cut drops it with the rest of its interval: calls that sleep
 * on a CPU other tasks call on weigh less than others (docs/io.md). */

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, HIST_MAX);
	__type(key, __u32);
	__type(value, struct io_sampler);
} io_samplers SEC(".maps");

/* With settings.audit (`tracehound run --latency audit`, for measuring the
 * sampler): every call is timed, the sampler still picks as it would and
 * only its picks reach io_stats' histograms with their weights, and every
 * call's latency is also counted once here, by its key: the sampled and the
 * full histogram of the same calls, read by the same clock, and how many of
 * the key's own calls the sampler picked (io_samplers count every key's
 * together, per CPU). Without it the
 * verifier drops every audit branch (settings is read-only) and the map
 * stays empty (no preallocation). */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 4096);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, struct io_key);
	__type(value, struct io_audit);
} io_audit SEC(".maps");

static const struct io_audit audit_zero = {};

static __always_inline void audit_add(struct io_key *key, __u32 hist, __u64 delta, __u32 weight)
{
	struct io_audit *a = bpf_map_lookup_elem(&io_audit, key);

	if (!a) {
		bpf_map_update_elem(&io_audit, key, &audit_zero, BPF_NOEXIST);
		a = bpf_map_lookup_elem(&io_audit, key);
		if (!a)
			return;
	}
	if (hist < HIST_MAX) {
		__sync_fetch_and_add(&a->hist[hist][log2_slot(delta)], 1);
		if (weight)
			__sync_fetch_and_add(&a->picked[hist], 1);
	}
}

static __always_inline struct io_sampler *sampler_of(__u32 op)
{
	__u32 key = hist_of(op);

	return key < HIST_MAX ? bpf_map_lookup_elem(&io_samplers, &key) : 0;
}

/* Whether to time this call, as the weight it will carry (0: not timed). */
static __always_inline __u32 sample_pick(struct io_sampler *s, __u64 task)
{
	__u64 tick;
	__u32 weight;

	if (!settings.sample_gap_ns || !s)
		return 1;
	tick = bpf_jiffies64();
	if (task != s->task || tick - s->tick > 1 ||
	    (tick != s->tick && s->in_tick < s->interval)) {
		/* the rate fell, or another task calls: timed, standing for
		 * itself. Calls left untimed before are not given to it, so a
		 * weight never counts another task's calls (nor another
		 * cgroup's), and a slow call after a storm never stands for the
		 * storm's fast ones. */
		s->tick = tick;
		s->task = task;
		s->in_tick = 1;
		s->since = 0;
		/* and its rate is not known yet: the next call is timed too */
		s->last_ts = 0;
		return 1;
	}
	if (tick != s->tick) {
		s->tick = tick;
		s->in_tick = 0;
	}
	s->in_tick++;
	weight = s->since + 1;
	if (weight < s->interval) {
		s->since = weight;
		return 0;
	}
	s->since = 0;
	return weight;
}

/* At a timed call's start (`now`, `weight` its calls): the next interval. */
static __always_inline void sample_next(struct io_sampler *s, __u64 now, __u32 weight)
{
	__u64 gap, want;
	__u32 k = 0, lw, lg;

	if (!settings.sample_gap_ns || !s)
		return;
	gap = now - s->last_ts;
	if (s->last_ts && gap < ((__u64)settings.sample_gap_ns << SAMPLE_K_MAX)) {
		/* log2 of the calls of this kind in one sample_gap_ns at the rate
		 * just seen (sample_gap_ns * weight / gap), without a division:
		 * this runs inside the timed call's clock window */
		want = (__u64)settings.sample_gap_ns * weight;
		lw = log2_slot(want);
		lg = log2_slot(gap | 1);
		k = lw > lg ? lw - lg : 0;
		if (k > SAMPLE_K_MAX)
			k = SAMPLE_K_MAX;
	}
	s->interval = 1 + (((now * 0x9E3779B97F4A7C15ULL) >> 40) & ((2u << k) - 2));
	s->last_ts = now;
	s->timed++;
}

/* A call of `op` starting now: its start time when it is to be timed, with
 * the calls it stands for in *weight; 0 when it is not. The one entry point
 * of every hook that starts a clock. With settings.audit every call gets its
 * start time, and *weight 0 marks one the sampler left out. The clock is
 * read last: nothing of the sampler's own work falls inside the call's
 * window, where a few ns on every timed call would shift the histograms
 * (and more than a few % of a quantile near a bucket's edge). */
static __always_inline __u64 sample_start(__u32 op, __u32 *weight, __u64 task)
{
	*weight = sample_pick(sampler_of(op), task);
	if (!*weight && !settings.audit)
		return 0;
	return bpf_ktime_get_ns();
}

/* After a timed call's clock stopped (or, for calls that complete
 * elsewhere, at once): the next interval of its CPU's sampler, from the
 * timed call's start. */
static __always_inline void sample_timed(__u32 op, __u64 start, __u32 weight)
{
	if (weight)
		sample_next(sampler_of(op), start, weight);
}
