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
	OP_MODIFY_QP, OP_UMEM_GET, OP_CLOSE_CTX, OP_NONE = 255,
};

enum rdma_health { H_OBJECTS_FULL, H_UNKNOWN_DEL, H_PENDING_FULL, H_APP_FULL, H_COUNTERS_FULL,
		   H_MAX };

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
	__u32 lkey;            /* an MR's local key (what the application is handed) */
	__u32 pad;
};

struct verb_key {
	__u32 op;
	__u32 err;             /* positive errno, 0 for success */
	__u64 cgroup_id;       /* of the calling task */
};

struct event_key {
	__u32 dev;
	__u32 port;
	__u32 event;
	__u32 tgid;            /* a QP event's QP owner; 0 for device and port events */
	__u64 cgroup_id;       /* the owner's cgroup; 0 without an owner */
};

struct dev_name {
	char name[64];
};

/* ---- the application's view: libibverbs calls, seen by uprobes ---------- */

#define APP_F_RELEASE_FAILED 1 /* a destroy of it returned an error */
#define APP_ERR_UNKNOWN 0xffffffff /* a create returned NULL, and no kernel call failed
				    * under it: refused in user space, errno not seen */
#define DEVICE_NAME_LEN 64

/* An object a process was handed, keyed by the address libibverbs gave it. */
struct app_key {
	__u32 tgid;
	__u32 type;            /* enum obj_type */
	__u64 handle;          /* address of the ibv_* struct in the process */
};

struct app_obj {
	__u64 context;         /* address of its ibv_context (its own for a context) */
	__u64 created_ns;      /* CLOCK_MONOTONIC */
	__u64 cgroup_id;
	__u64 release_ns;      /* when a destroy failed, 0 otherwise */
	__u32 ident;           /* QP number, MR lkey; the uverbs handle otherwise */
	__u32 flags;
	__u32 release_err;     /* errno of the failed destroy */
	__u32 pad;
	char comm[16];
	char device[DEVICE_NAME_LEN];
};

struct app_verb_key {
	__u32 op;              /* enum rdma_op */
	__u32 err;             /* positive errno, 0 for success, APP_ERR_UNKNOWN */
	__u64 cgroup_id;
	char device[DEVICE_NAME_LEN];
};

#endif
