// SPDX-License-Identifier: GPL-2.0
/* tracehound cgroup name probe: the path of every cgroup made in the
 * hierarchy the agent counts by, as the kernel names it at mkdir.
 *
 *   cgroup_names   kernfs id -> path (LRU: the oldest names go first)
 *   names_health   paths too long to keep
 *
 * The agent learns new cgroups' paths by watching the tree (inotify) and by
 * rescans, both racing the cgroup's removal: a cgroup that lives a few
 * milliseconds on a busy node can be gone before either looks, and its
 * counters would be exported under its bare id. The kernel hands the path
 * to this tracepoint while the cgroup exists, so no such race. The agent
 * looks an id up here only when it meets one it cannot place.
 * Layouts are in cgroup_names.h, the contract with probes/cgroup_names.py.
 */
#include <linux/types.h>
#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_core_read.h>

#include "cgroup_names.h"
#include "btf_keep.h"

char LICENSE[] SEC("license") = "GPL";

/* The classic tracepoint's record (include/trace/events/cgroup.h, class
 * "cgroup"); CO-RE relocates each field against the running kernel. */
struct trace_event_raw_cgroup {
	int root;                  /* the hierarchy's id: 0 for v2 */
	__u64 id;                  /* the cgroup's kernfs id */
	__u32 __data_loc_path;     /* offset (low 16 bits) and length of the path */
} __attribute__((preserve_access_index));

/* Set by the loader from /proc/cgroups: the hierarchy counted by. */
const volatile int hierarchy_id SEC(".rodata.hierarchy") = 0;

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 2048);
	__type(key, __u64);
	__type(value, struct cgroup_name);
} cgroup_names SEC(".maps");

/* a path is larger than the BPF stack allows: built here */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct cgroup_name);
} name_scratch SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, N_MAX);
	__type(key, __u32);
	__type(value, __u64);
} names_health SEC(".maps");

BTF_KEEP(cgroup_names, enum cgroup_names_health health)

SEC("tracepoint/cgroup/cgroup_mkdir")
int tp_cgroup_mkdir(struct trace_event_raw_cgroup *ctx)
{
	__u32 zero = 0, loc, idx = N_TOO_LONG;
	struct cgroup_name *name;
	__u64 id, *n;
	long len;

	if (BPF_CORE_READ(ctx, root) != hierarchy_id)
		return 0;
	name = bpf_map_lookup_elem(&name_scratch, &zero);
	if (!name)
		return 0;
	loc = BPF_CORE_READ(ctx, __data_loc_path);
	len = bpf_probe_read_kernel_str(name->path, sizeof(name->path),
					(void *)ctx + (loc & 0xffff));
	if (len <= 0 || len >= (long)sizeof(name->path)) {
		/* a full buffer may be a cut one: better no name than a wrong one */
		n = bpf_map_lookup_elem(&names_health, &idx);
		if (n)
			__sync_fetch_and_add(n, 1);
		return 0;
	}
	id = BPF_CORE_READ(ctx, id);
	bpf_map_update_elem(&cgroup_names, &id, name, BPF_ANY);
	return 0;
}
