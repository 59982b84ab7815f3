/* SPDX-License-Identifier: GPL-2.0 */
/* Which mount an I/O call is on, for io.bpf.c (included after its maps):
 * from an open file, a descriptor, or a path a namespace call names
 * (resolved against the agent's mount prefixes in mounts_by_path), and
 * whether that mount's file system type is on the skip list. A skipped
 * mount is -1: nothing on it is counted.
 */
#ifndef TRACEHOUND_IO_MOUNTS_BPF_H
#define TRACEHOUND_IO_MOUNTS_BPF_H

/* true when the super block's file system type is on the skip list */
static __always_inline bool skip_sb(struct super_block *sb)
{
	struct fstype_name name = {};

	bpf_probe_read_kernel_str(name.name, sizeof(name.name), BPF_CORE_READ(sb, s_type, name));
	return bpf_map_lookup_elem(&skip_fstypes, &name) != 0;
}

/* Whether the file system under mount `id` is skipped: a remembered
 * decision while the id and device still match. Hooks that see no mount
 * pass the device as the id (a collision only costs one slow path). */
static __always_inline bool skipped(__u32 id, __u32 dev, struct super_block *sb)
{
	__u64 seen = (__u64)dev << 32 | (id & 0x3fffffff) << 2 | MNT_SEEN;
	__u64 *slot = &mnt_seen[id & (MNT_SLOTS - 1)];
	bool skip;

	if ((*slot & ~(__u64)MNT_SKIPPED) == seen)
		return *slot & MNT_SKIPPED;
	skip = skip_sb(sb);
	*slot = seen | (skip ? MNT_SKIPPED : 0);
	return skip;
}

/* Mount id from what mount_id_* read, or -1 when its file system is skipped. */
static __always_inline int mount_id_of(__u32 id, __u32 dev, struct super_block *sb)
{
	return skipped(id, dev, sb) ? -1 : (int)id;
}

/* Id of the struct mount a vfsmount is embedded in: the one step that needs
 * a probe read where bpf_rdonly_cast is missing. */
static __always_inline __u32 id_of_mount_around(struct vfsmount *vfsmnt)
{
	unsigned long mount = (unsigned long)vfsmnt - bpf_core_field_offset(struct mount, mnt);

#ifdef IO_PROBE_READS
	return BPF_CORE_READ((struct mount *)mount, mnt_id);
#else
	return VIEW(struct mount, mount)->mnt_id;
#endif
}

/* Mount id of a vfsmount at any kernel address. */
static __always_inline int mount_id(struct vfsmount *vfsmnt)
{
	struct super_block *sb;

	if (!vfsmnt)
		return -1;
#ifdef IO_PROBE_READS
	sb = BPF_CORE_READ(vfsmnt, mnt_sb);
	return mount_id_of(id_of_mount_around(vfsmnt), BPF_CORE_READ(sb, s_dev), sb);
#else
	sb = VIEW(struct vfsmount, vfsmnt)->mnt_sb;
	return mount_id_of(id_of_mount_around(vfsmnt), sb->s_dev, sb);
#endif
}

/* Mount id of a vfsmount the verifier knows the type of (reached from a
 * traced function's arguments): its super block is read with plain loads
 * in both builds. */
static __always_inline int mount_id_typed(struct vfsmount *vfsmnt)
{
	struct super_block *sb;

	if (!vfsmnt)
		return -1;
	sb = vfsmnt->mnt_sb;
	return mount_id_of(id_of_mount_around(vfsmnt), sb->s_dev, sb);
}

static __always_inline struct vfsmount *file_vfsmount(struct file *f)
{
#ifdef IO_PROBE_READS
	return BPF_CORE_READ(f, f_path.mnt);
#else
	return VIEW(struct file, f)->f_path.mnt;
#endif
}

/* `task`: the current one, BTF-typed (plain loads instead of a helper call
 * per pointer); the hot paths fetch it once and pass it down. */
static __always_inline struct file *fd_file(struct task_struct *task, long fd)
{
	struct fdtable *fdt = task->files->fdt;
	unsigned long at;

	if (fd < 0 || fd >= fdt->max_fds)
		return 0;
	at = (unsigned long)fdt->fd + fd * sizeof(struct file *);
#ifdef IO_PROBE_READS
	struct file *f = 0;

	bpf_probe_read_kernel(&f, sizeof(f), (void *)at);
	return f;
#else
	/* the fd array is untyped memory: read the slot as the file pointer
	 * member of a struct that has one */
	return VIEW(struct kiocb, at - bpf_core_field_offset(struct kiocb, ki_filp))->ki_filp;
#endif
}

static __always_inline int fd_mount(struct task_struct *task, long fd)
{
	struct file *f = fd_file(task, fd);

	return f ? mount_id(file_vfsmount(f)) : -1;
}

/* Mount a path argument starts from: the longest mount-point prefix for an
 * absolute path in the agent's mount namespace, otherwise the directory it is
 * relative to (dirfd, cwd or the task's root). */
static __always_inline int path_mount(struct task_struct *task, long dirfd, const char *upath)
{
	__u32 zero = 0, ns = 0;
	struct mnt_lpm_key *key = bpf_map_lookup_elem(&path_scratch, &zero);
	struct mnt_lpm_value *val;
	long len;

	if (!key)
		return -1;
	len = bpf_probe_read_user_str(key->path, sizeof(key->path), upath);
	if (len <= 0)
		return -1;
	if (key->path[0] == '/') {
		if (bpf_core_field_exists(struct ns_common, inum))
			ns = BPF_CORE_READ(task, nsproxy, mnt_ns, ns.inum);
		if (ns == settings.agent_mnt_ns) {
			key->prefixlen = (len - 1) * 8;
			val = bpf_map_lookup_elem(&mounts_by_path, key);
			if (val)
				return val->skip ? -1 : (int)val->mnt_id;
		}
		return mount_id(BPF_CORE_READ(task, fs, root.mnt));
	}
	if (dirfd == AT_FDCWD)
		return mount_id(BPF_CORE_READ(task, fs, pwd.mnt));
	return fd_mount(task, dirfd);
}

#endif /* TRACEHOUND_IO_MOUNTS_BPF_H */
