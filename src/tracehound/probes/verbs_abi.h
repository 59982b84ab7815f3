/* The parts of libibverbs' public structs the application probe reads, as
 * laid out by <infiniband/verbs.h> (rdma-core keeps them ABI-stable: programs
 * built against rdma-core 1.1 still run). Read from user memory by address,
 * so only offsets matter; tests/unit/test_verbs_abi.py compiles these beside
 * the real header and compares every offset. */
#ifndef TRACEHOUND_VERBS_ABI_H
#define TRACEHOUND_VERBS_ABI_H

#include <linux/types.h>

struct uv_device {
	__u64 ops[2];          /* struct _ibv_device_ops */
	__u32 node_type;
	__u32 transport_type;
	char name[64];         /* IBV_SYSFS_NAME_MAX */
};

struct uv_context {
	__u64 device;          /* struct ibv_device * */
};

/* every object starts with its context */
struct uv_pd {
	__u64 context;
	__u32 handle;
};

struct uv_cq {
	__u64 context;
	__u64 channel;
	__u64 cq_context;
	__u32 handle;
};

struct uv_srq {
	__u64 context;
	__u64 srq_context;
	__u64 pd;
	__u32 handle;
};

struct uv_qp {
	__u64 context;
	__u64 qp_context;
	__u64 pd;
	__u64 send_cq;
	__u64 recv_cq;
	__u64 srq;
	__u32 handle;
	__u32 qp_num;
};

struct uv_mr {
	__u64 context;
	__u64 pd;
	__u64 addr;
	__u64 length;
	__u32 handle;
	__u32 lkey;
	__u32 rkey;
};

#endif
