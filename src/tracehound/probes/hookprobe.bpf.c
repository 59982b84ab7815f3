// SPDX-License-Identifier: GPL-2.0
/* Smallest possible fentry program: the loader retargets it at each VFS
 * function to learn, per function, whether this kernel accepts fentry. */
#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>

char LICENSE[] SEC("license") = "GPL";

SEC("fentry/vfs_read")
int probe_fentry(void *ctx)
{
	return 0;
}

/* BTF-typed raw tracepoint: what the syscall (tracepoint) mode is built on. */
SEC("tp_btf/sys_enter")
int probe_tp_btf(void *ctx)
{
	return 0;
}

/* Its exit twin: with probe_tp_btf, the floor the benchmark measures (two
 * programs that do nothing on every syscall). */
SEC("tp_btf/sys_exit")
int probe_tp_btf_exit(void *ctx)
{
	return 0;
}
