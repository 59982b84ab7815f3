/* Attach points of the RDMA probe, in both modes. Included by rdma.bpf.c.
 * Program names are <fe|fx|kp|kr>_<kernel function>; probes/rdma.py lists
 * which of them each hook group needs in each mode. */

/* ---- fentry / fexit ------------------------------------------------------ */

SEC("fexit/rdma_restrack_add")
int BPF_PROG(fx_rdma_restrack_add, struct rdma_restrack_entry *res)
{ track_add(res); return 0; }

SEC("fentry/rdma_restrack_del")
int BPF_PROG(fe_rdma_restrack_del, struct rdma_restrack_entry *res)
{ track_del(res); return 0; }

/* Kernels that split deletion (begin, then commit or abort) destroy PD, CQ,
 * QP and SRQ that way: the object is gone once committed, and stays if the
 * driver's destroy failed and the deletion was aborted. */
SEC("fentry/rdma_restrack_commit_del")
int BPF_PROG(fe_rdma_restrack_commit_del, struct rdma_restrack_entry *res)
{ track_del(res); return 0; }

SEC("fexit/ib_uverbs_cmd_verbs")
int BPF_PROG(fx_ib_uverbs_cmd_verbs, void *ufile, void *hdr, const struct ib_uverbs_attr *uattrs, int ret)
{ count_verb(ioctl_op(hdr, uattrs), ret); return 0; }

SEC("fexit/ib_uverbs_write")
int BPF_PROG(fx_ib_uverbs_write, void *filp, const char *buf, __u64 count, void *pos, long ret)
{ count_verb(user_write_op(buf), ret); return 0; }

#define FX_DESTROY(fn, op)						\
SEC("fexit/" #fn) int BPF_PROG(fx_##fn, void *obj, void *udata, int ret)	\
{ count_verb(op, ret); return 0; }

FX_DESTROY(ib_dealloc_pd_user, OP_DEALLOC_PD)
FX_DESTROY(ib_destroy_cq_user, OP_DESTROY_CQ)
FX_DESTROY(ib_destroy_qp_user, OP_DESTROY_QP)
FX_DESTROY(ib_destroy_srq_user, OP_DESTROY_SRQ)
FX_DESTROY(ib_dereg_mr_user, OP_DEREG_MR)

SEC("fexit/ib_modify_qp_with_udata")
int BPF_PROG(fx_ib_modify_qp_with_udata, struct ib_qp *qp, struct ib_qp_attr *attr, int mask,
	     void *udata, int ret)
{
	count_verb(OP_MODIFY_QP, ret);
	count_transition(ret, modify_target(attr, mask));
	return 0;
}

SEC("fexit/ib_umem_get")
int BPF_PROG(fx_ib_umem_get, void *device, unsigned long addr, __u64 size, int access, long ret)
{ count_verb(OP_UMEM_GET, ret); return 0; }

SEC("fentry/ib_dispatch_event")
int BPF_PROG(fe_ib_dispatch_event, struct ib_event *ev)
{ device_event(ev); return 0; }

SEC("fentry/ib_uverbs_qp_event_handler")
int BPF_PROG(fe_ib_uverbs_qp_event_handler, struct ib_event *ev)
{ qp_event(ev); return 0; }

/* ---- kprobe / kretprobe -------------------------------------------------- */

static __always_inline __u64 pending_key(__u32 slot)
{
	__u64 tid = (__u32)bpf_get_current_pid_tgid();

	return (tid << 8) | slot;
}

static __always_inline void pending_put(__u32 slot, __u64 value)
{
	__u64 key = pending_key(slot);

	if (bpf_map_update_elem(&rdma_pending, &key, &value, BPF_ANY))
		array_inc(&rdma_health, H_PENDING_FULL);
}

/* false when the call began before the probe was attached */
static __always_inline bool pending_take(__u32 slot, __u64 *value)
{
	__u64 key = pending_key(slot);
	__u64 *v = bpf_map_lookup_elem(&rdma_pending, &key);

	if (!v)
		return false;
	*value = *v;
	bpf_map_delete_elem(&rdma_pending, &key);
	return true;
}

SEC("kprobe/rdma_restrack_add")
int BPF_KPROBE(kp_rdma_restrack_add, struct rdma_restrack_entry *res)
{ pending_put(SLOT_ADD, (__u64)res); return 0; }

SEC("kretprobe/rdma_restrack_add")
int BPF_KRETPROBE(kr_rdma_restrack_add)
{
	__u64 res;

	if (pending_take(SLOT_ADD, &res))
		track_add((struct rdma_restrack_entry *)res);
	return 0;
}

SEC("kprobe/rdma_restrack_del")
int BPF_KPROBE(kp_rdma_restrack_del, struct rdma_restrack_entry *res)
{ track_del(res); return 0; }

SEC("kprobe/rdma_restrack_commit_del")
int BPF_KPROBE(kp_rdma_restrack_commit_del, struct rdma_restrack_entry *res)
{ track_del(res); return 0; }

SEC("kprobe/ib_uverbs_cmd_verbs")
int BPF_KPROBE(kp_ib_uverbs_cmd_verbs, void *ufile, void *hdr, const struct ib_uverbs_attr *uattrs)
{
	__u32 op = ioctl_op(hdr, uattrs);

	if (op != OP_NONE)
		pending_put(SLOT_IOCTL, op);
	return 0;
}

SEC("kretprobe/ib_uverbs_cmd_verbs")
int BPF_KRETPROBE(kr_ib_uverbs_cmd_verbs)
{
	__u64 op;

	if (pending_take(SLOT_IOCTL, &op))
		count_verb(op, INT_RET(ctx));
	return 0;
}

SEC("kprobe/ib_uverbs_write")
int BPF_KPROBE(kp_ib_uverbs_write, void *filp, const char *buf)
{
	__u32 op = user_write_op(buf);

	if (op != OP_NONE)
		pending_put(SLOT_WRITE, op);
	return 0;
}

SEC("kretprobe/ib_uverbs_write")
int BPF_KRETPROBE(kr_ib_uverbs_write, long ret)
{
	__u64 op;

	if (pending_take(SLOT_WRITE, &op))
		count_verb(op, ret);
	return 0;
}

#define KR_DESTROY(fn, op)						\
SEC("kretprobe/" #fn) int BPF_KRETPROBE(kr_##fn)			\
{ count_verb(op, INT_RET(ctx)); return 0; }

KR_DESTROY(ib_dealloc_pd_user, OP_DEALLOC_PD)
KR_DESTROY(ib_destroy_cq_user, OP_DESTROY_CQ)
KR_DESTROY(ib_destroy_qp_user, OP_DESTROY_QP)
KR_DESTROY(ib_destroy_srq_user, OP_DESTROY_SRQ)
KR_DESTROY(ib_dereg_mr_user, OP_DEREG_MR)

SEC("kprobe/ib_modify_qp_with_udata")
int BPF_KPROBE(kp_ib_modify_qp_with_udata, struct ib_qp *qp, struct ib_qp_attr *attr, int mask)
{ pending_put(SLOT_MODIFY, modify_target(attr, mask)); return 0; }

SEC("kretprobe/ib_modify_qp_with_udata")
int BPF_KRETPROBE(kr_ib_modify_qp_with_udata)
{
	long ret = INT_RET(ctx);
	__u64 to_state;

	count_verb(OP_MODIFY_QP, ret);
	if (pending_take(SLOT_MODIFY, &to_state))
		count_transition(ret, to_state);
	return 0;
}

SEC("kretprobe/ib_umem_get")
int BPF_KRETPROBE(kr_ib_umem_get, long ret)
{ count_verb(OP_UMEM_GET, ret); return 0; }

SEC("kprobe/ib_dispatch_event")
int BPF_KPROBE(kp_ib_dispatch_event, struct ib_event *ev)
{ device_event(ev); return 0; }

SEC("kprobe/ib_uverbs_qp_event_handler")
int BPF_KPROBE(kp_ib_uverbs_qp_event_handler, struct ib_event *ev)
{ qp_event(ev); return 0; }
