// SPDX-License-Identifier: GPL-2.0
/* One building block of the I/O probe's per-event path per program, each on
 * the raw sys_exit tracepoint and acting on pread64 only: what a block costs
 * is its program's run time minus the `filter` program's, which does the
 * same dispatch and syscall test and nothing else. bench/hotpath_parts.py
 * loads them one at a time. */
#include "types.h"
#include <linux/bpf.h>
#include <asm/unistd.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>
#include <bpf/bpf_core_read.h>
#include "io.h"

char LICENSE[] SEC("license") = "GPL";

struct pt_regs___parts { unsigned long di, orig_ax; } PRESERVE;

struct {
	__uint(type, BPF_MAP_TYPE_TASK_STORAGE);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, int);
	__type(value, __u64);
} parts_start SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 8192);
	__type(key, struct io_key);
	__type(value, struct io_stats);
} parts_stats SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 8);
	__type(key, __u32);
	__type(value, struct io_key);
} parts_hints SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 8192);
	__type(key, __u32);
	__type(value, struct io_stats);
} parts_slots SEC(".maps");

/* weak: kernels before 6.2 lack it, and only its own part is left out */
extern void *bpf_rdonly_cast(const void *obj, __u32 btf_id) __ksym __weak;
#define VIEW(type, addr) ((type *)bpf_rdonly_cast((void *)(addr), bpf_core_type_id_kernel(type)))

/* written so the compiler cannot drop the work */
volatile __u64 sink;
static const struct io_stats zero;

#define PART(name) SEC("tp_btf/sys_exit") int BPF_PROG(name, struct pt_regs *regs, long ret)
#define PREAD_ONLY() if (((struct pt_regs___parts *)regs)->orig_ax != __NR_pread64) return 0
#define FD() ((long)((struct pt_regs___parts *)regs)->di)

PART(filter) { PREAD_ONLY(); sink++; return 0; }

PART(clock_read) { PREAD_ONLY(); sink += bpf_ktime_get_ns(); return 0; }

PART(task_storage)
{
	__u64 *v;

	PREAD_ONLY();
	v = bpf_task_storage_get(&parts_start, bpf_get_current_task_btf(), 0,
				 BPF_LOCAL_STORAGE_GET_F_CREATE);
	if (v)
		sink += *v;
	return 0;
}

PART(current_task) { PREAD_ONLY(); sink += bpf_get_current_task_btf()->files != 0; return 0; }

PART(cgroup_id_helper) { PREAD_ONLY(); sink += bpf_get_current_cgroup_id(); return 0; }

PART(cgroup_id_loads)
{
	PREAD_ONLY();
	sink += bpf_get_current_task_btf()->cgroups->dfl_cgrp->kn->id;
	return 0;
}

static __always_inline struct io_stats *stats(void)
{
	struct io_key k = { .cgroup_id = 1, .mnt = 1 };
	struct io_stats *s = bpf_map_lookup_elem(&parts_stats, &k);

	if (!s)
		bpf_map_update_elem(&parts_stats, &k, &zero, BPF_NOEXIST);
	return s;
}

/* what one event's accounting adds */
static __always_inline int count(struct io_stats *s, long ret)
{
	__sync_fetch_and_add(&s->bytes[0], ret);
	__sync_fetch_and_add(&s->lat_sum_ns[0], ret);
	__sync_fetch_and_add(&s->hist[0][3], 1);
	return 0;
}

PART(hash_lookup)
{
	struct io_stats *s;

	PREAD_ONLY();
	s = stats();
	if (s)
		sink += s->bytes[0];
	return 0;
}

PART(hash_lookup_3_atomic_adds)
{
	struct io_stats *s;

	PREAD_ONLY();
	s = stats();
	if (!s)
		return 0;
	return count(s, ret);
}

PART(fd_mount_probe_reads)
{
	struct task_struct *task = bpf_get_current_task_btf();
	struct fdtable *fdt = task->files->fdt;
	struct file *f = 0;
	struct vfsmount *m;
	long fd = FD();

	PREAD_ONLY();
	if (fd < 0 || fd >= fdt->max_fds)
		return 0;
	bpf_probe_read_kernel(&f, sizeof(f), &fdt->fd[fd]);
	m = BPF_CORE_READ(f, f_path.mnt);
	sink += BPF_CORE_READ((struct mount *)((void *)m - bpf_core_field_offset(struct mount, mnt)),
			      mnt_id);
	return 0;
}

PART(fd_mount_typed_loads)
{
	struct task_struct *task = bpf_get_current_task_btf();
	struct fdtable *fdt = task->files->fdt;
	unsigned long at;
	struct file *f;
	long fd = FD();

	PREAD_ONLY();
	if (fd < 0 || fd >= fdt->max_fds)
		return 0;
	at = (unsigned long)fdt->fd + fd * sizeof(struct file *);
	f = VIEW(struct kiocb, at - bpf_core_field_offset(struct kiocb, ki_filp))->ki_filp;
	if (!f)
		return 0;
	at = (unsigned long)f->f_path.mnt - bpf_core_field_offset(struct mount, mnt);
	sink += VIEW(struct mount, at)->mnt_id;
	return 0;
}

PART(percpu_array_lookup)
{
	__u32 way = bpf_get_current_task_btf()->files != 0;
	struct io_key *k;

	PREAD_ONLY();
	k = bpf_map_lookup_elem(&parts_hints, &way);
	if (k)
		sink += k->mnt;
	return 0;
}

PART(array_lookup_3_atomic_adds)
{
	__u32 slot = 5;
	struct io_stats *s;

	PREAD_ONLY();
	s = bpf_map_lookup_elem(&parts_slots, &slot);
	if (!s)
		return 0;
	return count(s, ret);
}
