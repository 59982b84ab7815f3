/* Minimal RDMA and task types for the CO-RE RDMA probe.
 *
 * The RDMA types live in the BTF of the ib_core / ib_uverbs / rdma_cm
 * modules, not in vmlinux; libbpf searches module BTF for CO-RE candidates,
 * so only names and field types matter here, never layout or order.
 * Standalone (does not include types.h) because it needs other task_struct
 * fields than the I/O probe.
 */
#ifndef TRACEHOUND_RDMA_TYPES_H
#define TRACEHOUND_RDMA_TYPES_H

#include <linux/types.h>

typedef __u8 u8;
typedef __u16 u16;
typedef __u32 u32;
typedef __u64 u64;
typedef _Bool bool;
#define true 1
#define false 0

#define PRESERVE __attribute__((preserve_access_index))

#include "cgroup_types.h"

struct task_struct {
	int tgid;
	char comm[16];
	struct css_set *cgroups;
} PRESERVE;

enum rdma_restrack_type {
	RDMA_RESTRACK_PD,
	RDMA_RESTRACK_CQ,
	RDMA_RESTRACK_QP,
	RDMA_RESTRACK_CM_ID,
	RDMA_RESTRACK_MR,
	RDMA_RESTRACK_CTX,
	RDMA_RESTRACK_COUNTER,
	RDMA_RESTRACK_SRQ,
};

struct rdma_restrack_entry {
	bool valid;
	u8 no_track: 1;
	struct task_struct *task;
	const char *kern_name;
	enum rdma_restrack_type type;
	bool user;
	u32 id;
} PRESERVE;

struct ib_device {
	char name[64];
	u32 index;
} PRESERVE;

/* Every tracked object embeds its restrack entry as `res` and points at its
 * device: the kernel's own res_to_dev() is a container_of per type. */
struct ib_pd {
	struct ib_device *device;
	struct rdma_restrack_entry res;
} PRESERVE;

struct ib_cq {
	struct ib_device *device;
	struct rdma_restrack_entry res;
} PRESERVE;

struct ib_qp {
	struct ib_device *device;
	u32 port;
	struct rdma_restrack_entry res;
} PRESERVE;

struct ib_mr {
	struct ib_device *device;
	u32 lkey;
	struct rdma_restrack_entry res;
} PRESERVE;

struct ib_srq {
	struct ib_device *device;
	struct rdma_restrack_entry res;
} PRESERVE;

struct ib_ucontext {
	struct ib_device *device;
	struct rdma_restrack_entry res;
} PRESERVE;

/* rdma_cm module: present only when it is loaded. */
struct rdma_cm_id {
	struct ib_device *device;
} PRESERVE;

struct rdma_id_private {
	struct rdma_cm_id id;
	struct rdma_restrack_entry res;
} PRESERVE;

enum ib_qp_state {
	IB_QPS_RESET,
};

struct ib_qp_attr {
	enum ib_qp_state qp_state;
} PRESERVE;

enum ib_event_type {
	IB_EVENT_CQ_ERR,
};

struct ib_event {
	struct ib_device *device;
	union {
		struct ib_qp *qp;
		u32 port_num;
	} element;
	enum ib_event_type event;
} PRESERVE;

/* The uapi pt_regs is enough for PT_REGS_PARMn in kprobe programs. */
#include <asm/ptrace.h>

#endif
