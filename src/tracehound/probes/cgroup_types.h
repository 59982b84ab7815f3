/* The path from a task to its cgroup v2 id, for CO-RE: what
 * bpf_get_current_cgroup_id returns, read with plain loads
 * (task->cgroups->dfl_cgrp->kn->id). Shared by types.h and rdma_types.h;
 * needs PRESERVE and __u64 defined first. */
#ifndef TRACEHOUND_CGROUP_TYPES_H
#define TRACEHOUND_CGROUP_TYPES_H

struct kernfs_node {
	__u64 id;
} PRESERVE;

struct cgroup {
	struct kernfs_node *kn;
} PRESERVE;

struct css_set {
	struct cgroup *dfl_cgrp;
} PRESERVE;

#endif
