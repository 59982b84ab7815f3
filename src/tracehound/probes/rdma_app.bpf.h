/* The application's view of its RDMA resources: uprobes on libibverbs.
 * Included by rdma.bpf.c (it shares the probe's maps, and the kernel hooks
 * tell a failed create why the kernel refused it).
 *
 * Entry programs (up_<function>) remember the call per thread; return
 * programs (ur_<function>) record what the process was handed or released.
 * libibverbs calls some of its own exported verbs (ibv_reg_mr calls
 * ibv_reg_mr_iova2): a per-thread depth keeps only the outermost call.
 * A process's objects are keyed by the address libibverbs gave it: that is
 * how the application names them; the QP number and MR lkey are kept to
 * match the kernel's objects one by one. */
#include "verbs_abi.h"

struct app_call {
	__u64 arg;             /* the verb's first argument */
	__u64 device;          /* address of the ibv_device it works on */
	__u32 op;
	__u32 depth;
	__u32 kernel_err;      /* a uverbs call under it failed with this errno */
	__u32 pad;
};

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 16384);          /* set to --rdma-max-objects */
	__type(key, struct app_key);
	__type(value, struct app_obj);
} app_objects SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 8192);        /* keys of removed cgroups are retired by the agent */
	__type(key, struct app_verb_key);
	__type(value, __u64);
} app_verbs SEC(".maps");

/* (tgid, context address) -> when ibv_close_device succeeded: the kernel
 * freed everything of that context, and userspace drops its objects */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 1024);
	__type(key, struct app_key);
	__type(value, __u64);
} app_closed SEC(".maps");

/* pid_tgid -> the verb in flight; LRU: a thread killed inside a verb never returns */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 4096);
	__type(key, __u64);
	__type(value, struct app_call);
} app_calls SEC(".maps");

static __always_inline __u64 user_u64(__u64 addr)
{
	__u64 v = 0;

	if (addr)
		bpf_probe_read_user(&v, sizeof(v), (void *)addr);
	return v;
}

static __always_inline __u32 user_u32(__u64 addr)
{
	__u32 v = 0;

	bpf_probe_read_user(&v, sizeof(v), (void *)addr);
	return v;
}

/* Called from the kernel's uverbs hooks on an error: the errno a create that
 * returns NULL to the process would have set. */
static __always_inline void app_note_kernel_error(__u32 err)
{
	__u64 id = bpf_get_current_pid_tgid();
	struct app_call *c = bpf_map_lookup_elem(&app_calls, &id);

	if (c)
		c->kernel_err = err;
}

/* hops: pointers from the argument to its ibv_device (0: the argument is the
 * device, 1: a context, 2: an object, whose first field is its context) */
static __always_inline void app_enter(__u32 op, __u64 arg, int hops)
{
	__u64 id = bpf_get_current_pid_tgid();
	struct app_call *c = bpf_map_lookup_elem(&app_calls, &id);
	struct app_call call = { .arg = arg, .op = op, .depth = 1 };

	if (c) {
		c->depth++;
		return;
	}
	call.device = arg;
	if (hops >= 2)
		call.device = user_u64(call.device);
	if (hops >= 1)
		call.device = user_u64(call.device);
	bpf_map_update_elem(&app_calls, &id, &call, BPF_ANY);
}

/* The outermost call, once it returns; false for a nested verb and for a
 * call that began before the probe was attached. */
static __always_inline bool app_leave(struct app_call *out)
{
	__u64 id = bpf_get_current_pid_tgid();
	struct app_call *c = bpf_map_lookup_elem(&app_calls, &id);

	if (!c)
		return false;
	if (c->depth > 1) {
		c->depth--;
		return false;
	}
	*out = *c;
	bpf_map_delete_elem(&app_calls, &id);
	return true;
}

static __always_inline void read_device_name(char *dst, __u64 device)
{
	if (device)
		bpf_probe_read_user_str(dst, DEVICE_NAME_LEN,
					(void *)(device + __builtin_offsetof(struct uv_device, name)));
}

static __always_inline void app_count(struct app_call *call, __u32 err)
{
	struct app_verb_key key = { .op = call->op, .err = err };

	key.cgroup_id = current_cgroup_key();
	read_device_name(key.device, call->device);
	hash_inc(&app_verbs, &key);
}

static __always_inline __u32 app_ident(__u32 type, __u64 obj)
{
	switch (type) {
	case OBJ_QP:  return user_u32(obj + __builtin_offsetof(struct uv_qp, qp_num));
	case OBJ_MR:  return user_u32(obj + __builtin_offsetof(struct uv_mr, lkey));
	case OBJ_PD:  return user_u32(obj + __builtin_offsetof(struct uv_pd, handle));
	case OBJ_CQ:  return user_u32(obj + __builtin_offsetof(struct uv_cq, handle));
	case OBJ_SRQ: return user_u32(obj + __builtin_offsetof(struct uv_srq, handle));
	}
	return 0;
}

static __always_inline void app_created(__u64 ret, __u32 type)
{
	struct app_call call;
	struct app_key key = {};
	struct app_obj obj = {};

	if (!app_leave(&call))
		return;
	if (!ret) {
		app_count(&call, call.kernel_err ? call.kernel_err : APP_ERR_UNKNOWN);
		return;
	}
	app_count(&call, 0);
	key.tgid = bpf_get_current_pid_tgid() >> 32;
	key.type = type;
	key.handle = ret;
	obj.context = type == OBJ_CTX ? ret : user_u64(ret);
	obj.created_ns = bpf_ktime_get_ns();
	obj.cgroup_id = current_cgroup_key();
	obj.ident = app_ident(type, ret);
	bpf_get_current_comm(obj.comm, sizeof(obj.comm));
	read_device_name(obj.device, call.device);
	/* an address libibverbs reuses after a free replaces the old record */
	if (bpf_map_update_elem(&app_objects, &key, &obj, BPF_ANY))
		array_inc(&rdma_health, H_APP_FULL);
}

/* libibverbs' destroys return 0 or a positive errno */
static __always_inline void app_released(int ret, __u32 type)
{
	struct app_call call;
	struct app_key key = {};
	struct app_obj *obj;
	__u32 err = ret < 0 ? -ret : ret;

	if (!app_leave(&call))
		return;
	app_count(&call, err);
	key.tgid = bpf_get_current_pid_tgid() >> 32;
	key.type = type;
	key.handle = call.arg;
	if (!err) {
		bpf_map_delete_elem(&app_objects, &key);
		if (type == OBJ_CTX) {
			__u64 now = bpf_ktime_get_ns();

			bpf_map_update_elem(&app_closed, &key, &now, BPF_ANY);
		}
		return;
	}
	/* the process may carry on as if it were gone: the kernel keeps it */
	obj = bpf_map_lookup_elem(&app_objects, &key);
	if (obj && !(obj->flags & APP_F_RELEASE_FAILED)) {
		obj->flags |= APP_F_RELEASE_FAILED;
		obj->release_err = err;
		obj->release_ns = bpf_ktime_get_ns();
	}
}

#define APP_CREATE(fn, op, type, hops)					\
SEC("uprobe") int BPF_KPROBE(up_##fn, void *arg)				\
{ app_enter(op, (__u64)arg, hops); return 0; }				\
SEC("uretprobe") int BPF_KRETPROBE(ur_##fn, void *ret)			\
{ app_created((__u64)ret, type); return 0; }

#define APP_DESTROY(fn, op, type, hops)					\
SEC("uprobe") int BPF_KPROBE(up_##fn, void *arg)				\
{ app_enter(op, (__u64)arg, hops); return 0; }				\
SEC("uretprobe") int BPF_KRETPROBE(ur_##fn)				\
{ app_released(INT_RET(ctx), type); return 0; }

APP_CREATE(ibv_open_device, OP_CREATE_CTX, OBJ_CTX, 0)
APP_CREATE(ibv_alloc_pd, OP_ALLOC_PD, OBJ_PD, 1)
APP_CREATE(ibv_create_cq, OP_CREATE_CQ, OBJ_CQ, 1)
APP_CREATE(ibv_create_qp, OP_CREATE_QP, OBJ_QP, 2)
APP_CREATE(ibv_create_srq, OP_CREATE_SRQ, OBJ_SRQ, 2)
APP_CREATE(ibv_reg_mr, OP_REG_MR, OBJ_MR, 2)
APP_CREATE(ibv_reg_mr_iova, OP_REG_MR, OBJ_MR, 2)
APP_CREATE(ibv_reg_mr_iova2, OP_REG_MR, OBJ_MR, 2)
APP_DESTROY(ibv_close_device, OP_CLOSE_CTX, OBJ_CTX, 1)
APP_DESTROY(ibv_dealloc_pd, OP_DEALLOC_PD, OBJ_PD, 2)
APP_DESTROY(ibv_destroy_cq, OP_DESTROY_CQ, OBJ_CQ, 2)
APP_DESTROY(ibv_destroy_qp, OP_DESTROY_QP, OBJ_QP, 2)
APP_DESTROY(ibv_destroy_srq, OP_DESTROY_SRQ, OBJ_SRQ, 2)
APP_DESTROY(ibv_dereg_mr, OP_DEREG_MR, OBJ_MR, 2)

/* modify_qp changes no ownership: counted, with its errno */
SEC("uprobe") int BPF_KPROBE(up_ibv_modify_qp, void *qp)
{ app_enter(OP_MODIFY_QP, (__u64)qp, 2); return 0; }
SEC("uretprobe") int BPF_KRETPROBE(ur_ibv_modify_qp)
{
	struct app_call call;
	int ret = INT_RET(ctx);

	if (app_leave(&call))
		app_count(&call, ret < 0 ? -ret : ret);
	return 0;
}
