/* Which cgroup a task's activity is counted under, chosen by the loader in
 * .rodata.cgroup_key (tracehound/probes/cgroup_key.py):
 *   CGROUP_KEY_V2       its cgroup v2 (the default)
 *   CGROUP_KEY_FREEZER, CGROUP_KEY_CPUSET, CGROUP_KEY_MEMORY
 *                       the cgroup of its css of that v1 subsystem
 * On a host where jobs are separated in a v1 hierarchy only (Slurm's
 * cgroup/v1 plugin on a hybrid or v1 host) every job shares one v2 cgroup;
 * counting by the v1 cgroup keeps them apart. The id is the cgroup's kernfs
 * id, the inode number of its directory in that hierarchy, as for v2.
 * The subsystem's number is the running kernel's (enum cgroup_subsys_id in
 * its BTF), never one compiled in. Needs struct task_struct with `cgroups`. */
#ifndef TRACEHOUND_CGROUP_KEY_H
#define TRACEHOUND_CGROUP_KEY_H

#define CGROUP_KEY_V2 0
#define CGROUP_KEY_FREEZER 1
#define CGROUP_KEY_CPUSET 2
#define CGROUP_KEY_MEMORY 3

const volatile __u32 cgroup_key SEC(".rodata.cgroup_key") = CGROUP_KEY_V2;

/* The v1 subsystem id the key names, or -1 (v2, or a subsystem this kernel
 * lacks). A load-time constant: the verifier drops the other branches. */
static __always_inline int cgroup_key_subsys(void)
{
	switch (cgroup_key) {
	case CGROUP_KEY_FREEZER:
		if (bpf_core_enum_value_exists(enum cgroup_subsys_id, freezer_cgrp_id))
			return bpf_core_enum_value(enum cgroup_subsys_id, freezer_cgrp_id);
		break;
	case CGROUP_KEY_CPUSET:
		if (bpf_core_enum_value_exists(enum cgroup_subsys_id, cpuset_cgrp_id))
			return bpf_core_enum_value(enum cgroup_subsys_id, cpuset_cgrp_id);
		break;
	case CGROUP_KEY_MEMORY:
		if (bpf_core_enum_value_exists(enum cgroup_subsys_id, memory_cgrp_id))
			return bpf_core_enum_value(enum cgroup_subsys_id, memory_cgrp_id);
		break;
	}
	return -1;
}

/* The key of any task pointer, read through helper calls (works from every
 * program type and on every kernel). 0 when it cannot be read. */
static __always_inline __u64 task_cgroup_key(struct task_struct *task)
{
	struct css_set *cgs = BPF_CORE_READ(task, cgroups);
	struct cgroup_subsys_state *css = 0;
	int s;

	if (cgroup_key == CGROUP_KEY_V2)
		return BPF_CORE_READ(cgs, dfl_cgrp, kn, id);
	s = cgroup_key_subsys();
	if (s < 0 || s >= CSS_SUBSYS_SLOTS || !cgs)
		return 0;
	bpf_probe_read_kernel(&css, sizeof(css),
			      (void *)cgs + bpf_core_field_offset(struct css_set, subsys) +
			      s * sizeof(css));
	return BPF_CORE_READ(css, cgroup, kn, id);
}

/* The same for the current task: the kernel's own helper when the key is v2. */
static __always_inline __u64 current_cgroup_key(void)
{
	if (cgroup_key == CGROUP_KEY_V2)
		return bpf_get_current_cgroup_id();
	return task_cgroup_key((struct task_struct *)bpf_get_current_task());
}

#endif
