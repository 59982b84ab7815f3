// SPDX-License-Identifier: GPL-2.0
/* tracehound RDMA probe: a mirror of the kernel's RDMA resource tracker and
 * the outcome of every user verb, counted in kernel maps.
 *
 *   rdma_objects   (device index, type, restrack id) -> owner, cgroup, birth
 *   rdma_verbs     (op, errno)                       -> calls
 *   rdma_events    (device, port, async event)       -> count
 *   rdma_qp_states to_state                          -> successful transitions
 *   app_objects    (tgid, type, address)             -> what libibverbs handed a process
 *   app_verbs      (op, errno, cgroup, device)       -> libibverbs calls
 *
 * Hook groups (the loader enables one mode per group):
 *   restrack: rdma_restrack_add (exit: the id is assigned inside), _del and,
 *             where the kernel splits deletion, _commit_del (entry)
 *   verbs:    the two uverbs entry points, ib_uverbs_cmd_verbs (ioctl) and
 *             ib_uverbs_write (write), so a create refused before any driver
 *             code runs (rdma cgroup charge, uobject allocation) is still seen;
 *             the ib_core *_user destroy functions, which explicit destroys and
 *             the teardown of a dying process both go through;
 *             ib_modify_qp_with_udata (QP state); ib_umem_get (memory pinning)
 *   events:   ib_dispatch_event (device and port events), and
 *             ib_uverbs_qp_event_handler (QP events of user QPs)
 *   app:      uprobes on libibverbs' create, destroy and modify verbs
 *             (rdma_app.bpf.h), attached per library file by probes/rdma_app.py
 * fe_/fx_ programs are fentry/fexit; kp_/kr_ the kprobe/kretprobe fallback,
 * which keeps what an exit needs from the entry in rdma_pending.
 * Layouts of keys and values are in rdma.h, the contract with probes/rdma.py.
 */
#include "rdma_types.h"
#include <linux/bpf.h>
#include <rdma/ib_user_verbs.h>
#include <rdma/rdma_user_ioctl_cmds.h>
#include <rdma/ib_user_ioctl_cmds.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>
#include <bpf/bpf_core_read.h>
#include "rdma.h"
#include "cgroup_key.bpf.h"
#include "btf_keep.h"

char LICENSE[] SEC("license") = "GPL";

#define MAX_ERRNO 4095
#define IB_QP_STATE 1          /* enum ib_qp_attr_mask */
#define QP_STATES 8
#define INVOKE_WRITE_MAX_ATTRS 8

/* int-returning functions may leave the upper half of rax undefined. */
#define INT_RET(ctx) ((long)(int)PT_REGS_RC(ctx))

/* rdma_pending slots: one per hook that may nest inside another on a thread */
enum pending_slot { SLOT_ADD, SLOT_IOCTL, SLOT_WRITE, SLOT_MODIFY };

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 16384);
	__type(key, struct rdma_obj_key);
	__type(value, struct rdma_obj);
} rdma_objects SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 64);
	__type(key, __u32);
	__type(value, struct dev_name);
} rdma_devices SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 8192);        /* keys of removed cgroups are retired by the agent */
	__type(key, struct verb_key);
	__type(value, __u64);
} rdma_verbs SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 1024);
	__type(key, struct event_key);
	__type(value, __u64);
} rdma_events SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, QP_STATES);
	__type(key, __u32);
	__type(value, __u64);
} rdma_qp_states SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, H_MAX);
	__type(key, __u32);
	__type(value, __u64);
} rdma_health SEC(".maps");

BTF_KEEP(rdma, enum obj_type type, enum rdma_op op, enum rdma_health health)

/* kprobe mode: (thread id << 8 | slot) -> what the return probe needs */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 4096);
	__type(key, __u64);
	__type(value, __u64);
} rdma_pending SEC(".maps");

static __always_inline bool is_err(long ret)
{
	return ret < 0 && ret >= -MAX_ERRNO;
}

static __always_inline void array_inc(void *map, __u32 idx)
{
	__u64 *v = bpf_map_lookup_elem(map, &idx);

	if (v)
		__sync_fetch_and_add(v, 1);
}

static __always_inline void hash_inc(void *map, void *key)
{
	__u64 one = 1, *v = bpf_map_lookup_elem(map, key);

	if (v) {
		__sync_fetch_and_add(v, 1);
		return;
	}
	if (bpf_map_update_elem(map, key, &one, BPF_NOEXIST)) {
		v = bpf_map_lookup_elem(map, key);  /* lost a race with another CPU */
		if (v)
			__sync_fetch_and_add(v, 1);
		else
			array_inc(&rdma_health, H_COUNTERS_FULL);
	}
}

/* ---- resource tracker mirror -------------------------------------------- */

static __always_inline __u32 obj_type(__u32 t)
{
	if (t == bpf_core_enum_value(enum rdma_restrack_type, RDMA_RESTRACK_PD))
		return OBJ_PD;
	if (t == bpf_core_enum_value(enum rdma_restrack_type, RDMA_RESTRACK_CQ))
		return OBJ_CQ;
	if (t == bpf_core_enum_value(enum rdma_restrack_type, RDMA_RESTRACK_QP))
		return OBJ_QP;
	if (t == bpf_core_enum_value(enum rdma_restrack_type, RDMA_RESTRACK_CM_ID))
		return OBJ_CM_ID;
	if (t == bpf_core_enum_value(enum rdma_restrack_type, RDMA_RESTRACK_MR))
		return OBJ_MR;
	if (t == bpf_core_enum_value(enum rdma_restrack_type, RDMA_RESTRACK_CTX))
		return OBJ_CTX;
	if (bpf_core_enum_value_exists(enum rdma_restrack_type, RDMA_RESTRACK_SRQ) &&
	    t == bpf_core_enum_value(enum rdma_restrack_type, RDMA_RESTRACK_SRQ))
		return OBJ_SRQ;
	return OBJ_OTHER;
}

#define OBJ_OF(type, res) ((struct type *)((void *)(res) - bpf_core_field_offset(struct type, res)))

/* The kernel's res_to_dev(): each object type embeds the entry as `res`. */
static __always_inline struct ib_device *res_device(struct rdma_restrack_entry *res, __u32 type)
{
	switch (type) {
	case OBJ_PD:  return BPF_CORE_READ(OBJ_OF(ib_pd, res), device);
	case OBJ_CQ:  return BPF_CORE_READ(OBJ_OF(ib_cq, res), device);
	case OBJ_QP:  return BPF_CORE_READ(OBJ_OF(ib_qp, res), device);
	case OBJ_MR:  return BPF_CORE_READ(OBJ_OF(ib_mr, res), device);
	case OBJ_CTX: return BPF_CORE_READ(OBJ_OF(ib_ucontext, res), device);
	case OBJ_SRQ: return BPF_CORE_READ(OBJ_OF(ib_srq, res), device);
	case OBJ_CM_ID:
		/* rdma_cm's BTF exists only while the module is loaded */
		if (bpf_core_type_exists(struct rdma_id_private))
			return BPF_CORE_READ(OBJ_OF(rdma_id_private, res), id.device);
		return 0;
	}
	return 0;
}

/* Key of a tracked entry; false for entries the kernel's tracker does not
 * list either (failed insert, no_track, types we do not mirror). */
static __always_inline bool res_key(struct rdma_restrack_entry *res, struct rdma_obj_key *key,
				    struct ib_device **devp)
{
	struct ib_device *dev;
	__u32 type;

	if (!BPF_CORE_READ(res, valid) || BPF_CORE_READ_BITFIELD_PROBED(res, no_track))
		return false;
	type = obj_type(BPF_CORE_READ(res, type));
	if (type == OBJ_OTHER)
		return false;
	dev = res_device(res, type);
	if (!dev)
		return false;
	key->dev = BPF_CORE_READ(dev, index);
	key->type = type;
	key->id = BPF_CORE_READ(res, id);
	*devp = dev;
	return true;
}

static __always_inline void remember_device(struct ib_device *dev, __u32 index)
{
	struct dev_name name = {};

	if (bpf_map_lookup_elem(&rdma_devices, &index))
		return;
	bpf_probe_read_kernel_str(name.name, sizeof(name.name), dev->name);
	bpf_map_update_elem(&rdma_devices, &index, &name, BPF_NOEXIST);
}

static __always_inline void track_add(struct rdma_restrack_entry *res)
{
	struct rdma_obj_key key = {};
	struct rdma_obj obj = {};
	struct task_struct *task;
	struct ib_device *dev;

	if (!res_key(res, &key, &dev))
		return;
	remember_device(dev, key.dev);
	obj.created_ns = bpf_ktime_get_ns();
	task = BPF_CORE_READ(res, task);
	if (BPF_CORE_READ(res, user) && task) {
		obj.flags = OBJ_F_USER;
		obj.tgid = BPF_CORE_READ(task, tgid);
		BPF_CORE_READ_STR_INTO(&obj.comm, task, comm);
		/* a child object may be attributed to its parent's task */
		if ((void *)task == (void *)bpf_get_current_task())
			obj.cgroup_id = current_cgroup_key();
		else
			obj.cgroup_id = task_cgroup_key(task);
	} else {
		bpf_probe_read_kernel_str(obj.comm, sizeof(obj.comm), BPF_CORE_READ(res, kern_name));
	}
	if (key.type == OBJ_MR)
		obj.lkey = BPF_CORE_READ(OBJ_OF(ib_mr, res), lkey);
	if (bpf_map_update_elem(&rdma_objects, &key, &obj, BPF_ANY))
		array_inc(&rdma_health, H_OBJECTS_FULL);
}

static __always_inline void track_del(struct rdma_restrack_entry *res)
{
	struct rdma_obj_key key = {};
	struct ib_device *dev;

	if (!res_key(res, &key, &dev))
		return;
	/* an object older than the probe that userspace could not seed */
	if (bpf_map_delete_elem(&rdma_objects, &key))
		array_inc(&rdma_health, H_UNKNOWN_DEL);
}

#include "rdma_app.bpf.h"

/* ---- verbs ---------------------------------------------------------------- */

static __always_inline void count_verb(__u32 op, long ret)
{
	struct verb_key key = { .op = op, .err = is_err(ret) ? -ret : 0 };

	if (key.err)
		app_note_kernel_error(key.err);
	if (op == OP_NONE)
		return;
	key.cgroup_id = current_cgroup_key();
	hash_inc(&rdma_verbs, &key);
}

/* Creates only: destroys and modify_qp are counted in ib_core, where the
 * teardown of an exiting process goes too. */
static __always_inline __u32 write_cmd_op(__u32 cmd)
{
	switch (cmd & IB_USER_VERBS_CMD_COMMAND_MASK) {
	case IB_USER_VERBS_CMD_GET_CONTEXT: return OP_CREATE_CTX;
	case IB_USER_VERBS_CMD_ALLOC_PD:    return OP_ALLOC_PD;
	case IB_USER_VERBS_CMD_REG_MR:      return OP_REG_MR;
	case IB_USER_VERBS_CMD_CREATE_CQ:   return OP_CREATE_CQ;  /* also the _ex form */
	case IB_USER_VERBS_CMD_CREATE_QP:   return OP_CREATE_QP;
	case IB_USER_VERBS_CMD_CREATE_SRQ:
	case IB_USER_VERBS_CMD_CREATE_XSRQ: return OP_CREATE_SRQ;
	}
	return OP_NONE;
}

static __always_inline __u32 user_write_op(const void *ubuf)
{
	struct ib_uverbs_cmd_hdr hdr;

	if (bpf_probe_read_user(&hdr, sizeof(hdr), ubuf))
		return OP_NONE;
	return write_cmd_op(hdr.command);
}

/* libibverbs sends many write commands through ioctl (INVOKE_WRITE): the
 * command number is then a constant attribute. */
static __always_inline __u32 invoke_write_op(const struct ib_uverbs_attr *uattrs, __u16 n)
{
	struct ib_uverbs_attr a;

	for (int i = 0; i < INVOKE_WRITE_MAX_ATTRS && i < n; i++) {
		if (bpf_probe_read_user(&a, sizeof(a), &uattrs[i]))
			break;
		if (a.attr_id == UVERBS_ATTR_WRITE_CMD)
			return write_cmd_op((__u32)a.data);
	}
	return OP_NONE;
}

static __always_inline __u32 ioctl_op(const void *khdr, const struct ib_uverbs_attr *uattrs)
{
	struct ib_uverbs_ioctl_hdr hdr;

	if (bpf_probe_read_kernel(&hdr, sizeof(hdr), khdr))
		return OP_NONE;
	switch (hdr.object_id) {
	case UVERBS_OBJECT_DEVICE:
		if (hdr.method_id == UVERBS_METHOD_GET_CONTEXT)
			return OP_CREATE_CTX;
		if (hdr.method_id == UVERBS_METHOD_INVOKE_WRITE)
			return invoke_write_op(uattrs, hdr.num_attrs);
		return OP_NONE;
	case UVERBS_OBJECT_CQ:  return hdr.method_id == UVERBS_METHOD_CQ_CREATE ? OP_CREATE_CQ : OP_NONE;
	case UVERBS_OBJECT_QP:  return hdr.method_id == UVERBS_METHOD_QP_CREATE ? OP_CREATE_QP : OP_NONE;
	case UVERBS_OBJECT_SRQ: return hdr.method_id == UVERBS_METHOD_SRQ_CREATE ? OP_CREATE_SRQ : OP_NONE;
	case UVERBS_OBJECT_MR:
		return hdr.method_id == UVERBS_METHOD_REG_DMABUF_MR ||
		       hdr.method_id == UVERBS_METHOD_DM_MR_REG ? OP_REG_MR : OP_NONE;
	}
	return OP_NONE;
}

static __always_inline void count_transition(long ret, __u32 to_state)
{
	if (ret == 0 && to_state < QP_STATES)
		array_inc(&rdma_qp_states, to_state);
}

static __always_inline __u32 modify_target(struct ib_qp_attr *attr, int mask)
{
	return (mask & IB_QP_STATE) ? BPF_CORE_READ(attr, qp_state) : QP_STATES;
}

/* ---- async events --------------------------------------------------------- */

static __always_inline void count_event(struct ib_device *dev, struct event_key *key)
{
	if (!dev)
		return;
	key->dev = BPF_CORE_READ(dev, index);
	remember_device(dev, key->dev);
	hash_inc(&rdma_events, key);
}

static __always_inline void device_event(struct ib_event *ev)
{
	struct event_key key = { .port = BPF_CORE_READ(ev, element.port_num),
				 .event = BPF_CORE_READ(ev, event) };

	count_event(BPF_CORE_READ(ev, device), &key);
}

/* A QP event names the QP's owner: the task that created it (events are
 * dispatched from the driver's context, not the owner's). */
static __always_inline void qp_event(struct ib_event *ev)
{
	struct ib_qp *qp = BPF_CORE_READ(ev, element.qp);
	struct task_struct *owner = BPF_CORE_READ(qp, res.task);
	struct event_key key = { .port = BPF_CORE_READ(qp, port), .event = BPF_CORE_READ(ev, event) };

	if (owner) {
		key.tgid = BPF_CORE_READ(owner, tgid);
		key.cgroup_id = task_cgroup_key(owner);
	}
	count_event(BPF_CORE_READ(ev, device), &key);
}

#include "rdma_hooks.bpf.h"
