/* The paths from a task to its cgroup ids, for CO-RE: the v2 cgroup (what
 * bpf_get_current_cgroup_id returns: task->cgroups->dfl_cgrp->kn->id) and
 * the cgroup of each v1 subsystem's css (task->cgroups->subsys[S]->cgroup
 * ->kn->id). Shared by types.h and rdma_types.h; needs PRESERVE and __u64
 * defined first. */
#ifndef TRACEHOUND_CGROUP_TYPES_H
#define TRACEHOUND_CGROUP_TYPES_H

/* ia_uid: who made the directory or was handed it (chown); a directory with
 * no iattr is root's */
struct kernfs_iattrs {
	struct {
		__u32 val;
	} ia_uid;
} PRESERVE;

struct kernfs_node {
	__u64 id;
	struct kernfs_node *__parent;   /* since 6.15 */
	struct kernfs_iattrs *iattr;
} PRESERVE;

/* the parent's name before 6.15 */
struct kernfs_node___old {
	struct kernfs_node *parent;
} PRESERVE;

struct cgroup {
	struct kernfs_node *kn;
} PRESERVE;

struct cgroup_subsys_state {
	struct cgroup *cgroup;
} PRESERVE;

/* The kernel's array has CGROUP_SUBSYS_COUNT entries; CO-RE relocates the
 * array's offset only, the index is the running kernel's subsystem id. */
#define CSS_SUBSYS_SLOTS 32

struct css_set {
	struct cgroup_subsys_state *subsys[CSS_SUBSYS_SLOTS];
	struct cgroup *dfl_cgrp;
} PRESERVE;

/* Only the names matter: each value is relocated from the kernel's BTF. */
enum cgroup_subsys_id {
	cpuset_cgrp_id,
	memory_cgrp_id,
	freezer_cgrp_id,
};

#endif
