/* The RDMA probe's map layout contract: shared by rdma.bpf.c and read by
 * tracehound/probes/rdma.py, whose LAYOUTS a test checks against the BTF of
 * the built object. */
#ifndef TRACEHOUND_RDMA_H
#define TRACEHOUND_RDMA_H

/* Object types as userspace sees them; the kernel's enum is translated
 * through CO-RE so a reordering there cannot mislabel objects. */
enum obj_type { OBJ_PD, OBJ_CQ, OBJ_QP, OBJ_CM_ID, OBJ_MR, OBJ_CTX, OBJ_SRQ, OBJ_OTHER = 255 };

enum rdma_op {
	OP_CREATE_CTX, OP_ALLOC_PD, OP_CREATE_CQ, OP_CREATE_QP, OP_REG_MR, OP_CREATE_SRQ,
	OP_DEALLOC_PD, OP_DESTROY_CQ, OP_DESTROY_QP, OP_DEREG_MR, OP_DESTROY_SRQ,
	OP_MODIFY_QP, OP_UMEM_GET, OP_NONE = 255,
};

enum rdma_health { H_OBJECTS_FULL, H_UNKNOWN_DEL, H_PENDING_FULL, H_MAX };

#define OBJ_F_USER 1           /* owned by a process (else by a kernel module) */
#define OBJ_F_SEEDED 2         /* set by userspace: present before the probe attached */

struct rdma_obj_key {
	__u32 dev;
	__u32 type;
	__u32 id;
	__u32 pad;
};

struct rdma_obj {
	__u64 cgroup_id;
	__u64 created_ns;      /* CLOCK_MONOTONIC; 0 when seeded by userspace */
	__u32 tgid;
	__u32 flags;
	char comm[16];         /* owner's comm, or the creating module's name */
};

struct verb_key {
	__u32 op;
	__u32 err;             /* positive errno, 0 for success */
};

struct event_key {
	__u32 dev;
	__u32 port;
	__u32 event;
	__u32 pad;
};

struct dev_name {
	char name[64];
};

#endif
