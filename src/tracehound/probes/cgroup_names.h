/* The cgroup name probe's map layout contract: shared by cgroup_names.bpf.c
 * and read by tracehound/probes/cgroup_names.py, whose LAYOUTS a test checks
 * against the BTF of the built object. */
#ifndef TRACEHOUND_CGROUP_NAMES_H
#define TRACEHOUND_CGROUP_NAMES_H

/* Longer paths are left out (a rescan of the tree can still place them):
 * a Kubernetes container's systemd path is about 190 bytes. */
#define CGROUP_NAME_LEN 512

/* The path of one cgroup below its hierarchy's root, as the kernel named it
 * at mkdir; keyed by the cgroup's kernfs id (its directory's inode). */
struct cgroup_name {
	char path[CGROUP_NAME_LEN];     /* NUL-terminated */
};

enum cgroup_names_health { N_TOO_LONG, N_MAX };

#endif
