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

/* Whether any user could have made this: a super block or a mount namespace
 * owned by a user namespace other than the initial one (`unshare -Urm` and
 * a mount). `mount` is 0 where only the super block is known. A mount of no
 * namespace (the kernel's own: pipes, memfd) is the kernel's. */
static __always_inline bool users_own(struct super_block *sb, void *mount)
{
	struct mnt_namespace *ns;

	if (BPF_CORE_READ(sb, s_user_ns, level))
		return true;
	if (!mount)
		return false;
	ns = BPF_CORE_READ((struct mount *)mount, mnt_ns);
	return ns && BPF_CORE_READ(ns, user_ns, level);
}

/* What is known of mount `id` (or of a device, passed as the id with no
 * mount by hooks that see none): MNT_SKIPPED, MNT_FOREIGN, remembered while
 * the id, the device and the kind still match (a collision only costs one
 * slow path). */
static __always_inline __u64 mount_state(__u32 id, __u32 dev, struct super_block *sb,
					 void *mount)
{
	__u64 seen = (__u64)dev << 32 | (__u64)(id & MNT_ID_MASK) << 3 |
		     (mount ? 0 : MNT_BY_DEV) | MNT_SEEN;
	__u64 *slot = &mnt_seen[id & (MNT_SLOTS - 1)];
	__u64 state;

	if ((*slot & ~(__u64)(MNT_SKIPPED | MNT_FOREIGN)) == seen)
		return *slot;
	state = seen | (skip_sb(sb) ? MNT_SKIPPED : 0) | (users_own(sb, mount) ? MNT_FOREIGN : 0);
	*slot = state;
	return state;
}

/* key.flags for a key by device: IO_KEY_DEV, with IO_KEY_FOREIGN when a user
 * owns the super block; -1 when its file system is skipped. */
static __always_inline int dev_key_flags(struct super_block *sb)
{
	__u32 dev = BPF_CORE_READ(sb, s_dev);
	__u64 state = mount_state(dev, dev, sb, 0);

	if (state & MNT_SKIPPED)
		return -1;
	return IO_KEY_DEV | (state & MNT_FOREIGN ? IO_KEY_FOREIGN : 0);
}

/* Mount id from what mount_id_* read, with MNT_ID_FOREIGN when a user owns
 * the mount; -1 when its file system is skipped. */
static __always_inline int mount_id_of(__u32 id, __u32 dev, struct super_block *sb, void *mount)
{
	__u64 state = mount_state(id, dev, sb, mount);

	if (state & MNT_SKIPPED)
		return -1;
	return (int)(id & MNT_ID_MASK) | (state & MNT_FOREIGN ? MNT_ID_FOREIGN : 0);
}

/* The struct mount a vfsmount is embedded in. */
static __always_inline void *mount_around(struct vfsmount *vfsmnt)
{
	return (void *)vfsmnt - bpf_core_field_offset(struct mount, mnt);
}

/* Its id: the one step that needs a probe read where bpf_rdonly_cast is
 * missing. */
static __always_inline __u32 id_of_mount_around(struct vfsmount *vfsmnt)
{
#ifdef IO_PROBE_READS
	return BPF_CORE_READ((struct mount *)mount_around(vfsmnt), mnt_id);
#else
	return VIEW(struct mount, mount_around(vfsmnt))->mnt_id;
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
	return mount_id_of(id_of_mount_around(vfsmnt), BPF_CORE_READ(sb, s_dev), sb,
			   mount_around(vfsmnt));
#else
	sb = VIEW(struct vfsmount, vfsmnt)->mnt_sb;
	return mount_id_of(id_of_mount_around(vfsmnt), sb->s_dev, sb, mount_around(vfsmnt));
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
	return mount_id_of(id_of_mount_around(vfsmnt), sb->s_dev, sb, mount_around(vfsmnt));
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
