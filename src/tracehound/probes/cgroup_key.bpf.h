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

/* The kernfs node of a task's keyed cgroup, read through helper calls (works
 * from every program type and on every kernel). 0 when it cannot be read. */
static __always_inline struct kernfs_node *task_cgroup_kn(struct task_struct *task)
{
	struct css_set *cgs = BPF_CORE_READ(task, cgroups);
	struct cgroup_subsys_state *css = 0;
	int s;

	if (cgroup_key == CGROUP_KEY_V2)
		return BPF_CORE_READ(cgs, dfl_cgrp, kn);
	s = cgroup_key_subsys();
	if (s < 0 || s >= CSS_SUBSYS_SLOTS || !cgs)
		return 0;
	bpf_probe_read_kernel(&css, sizeof(css),
			      (void *)cgs + bpf_core_field_offset(struct css_set, subsys) +
			      s * sizeof(css));
	return BPF_CORE_READ(css, cgroup, kn);
}

/* The key of any task pointer. 0 when it cannot be read. */
static __always_inline __u64 task_cgroup_key(struct task_struct *task)
{
	return BPF_CORE_READ(task_cgroup_kn(task), id);
}

/* Whether the task's keyed cgroup was made in a directory root owns, so that
 * only root could have made it (a scheduler's job or step, a service, a
 * pod). A directory handed to a user (systemd's delegation, Slurm's step
 * under cgroup/v1) is the user's: whatever they make below it is not. The
 * root cgroup counts as root's. */
static __always_inline int cgroup_made_by_root(struct task_struct *task)
{
	struct kernfs_node *kn = task_cgroup_kn(task), *parent;
	struct kernfs_iattrs *attrs;

	if (!kn)
		return 0;
	if (bpf_core_field_exists(((struct kernfs_node___old *)kn)->parent))
		parent = BPF_CORE_READ((struct kernfs_node___old *)kn, parent);
	else
		parent = BPF_CORE_READ(kn, __parent);
	if (!parent)
		return 1;
	attrs = BPF_CORE_READ(parent, iattr);
	return !attrs || BPF_CORE_READ(attrs, ia_uid.val) == 0;
}

/* The same for the current task: the kernel's own helper when the key is v2. */
static __always_inline __u64 current_cgroup_key(void)
{
	if (cgroup_key == CGROUP_KEY_V2)
		return bpf_get_current_cgroup_id();
	return task_cgroup_key((struct task_struct *)bpf_get_current_task());
}

#endif
