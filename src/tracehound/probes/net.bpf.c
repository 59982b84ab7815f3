// SPDX-License-Identifier: GPL-2.0
/* tracehound net probe: TCP trouble per cgroup, counted in kernel maps.
 *
 *   net_counters  cgroup id -> retransmitted segments, failed active opens,
 *                 resets received
 *   net_health    updates lost because net_counters was full
 *
 * Every hook runs where the socket is, often in softirq context on behalf of
 * no task in particular, so the cgroup is the socket's own (the one its
 * creator was in, inherited by accepted sockets), never the current task's.
 * The hooks fire on retransmits, state changes and resets only: nothing here
 * runs per packet.
 *
 * Hook groups, each on its own (the loader drops a group the kernel refuses):
 *   retransmit  tcp_retransmit_skb
 *   connect     inet_sock_set_state (SYN_SENT -> CLOSE of a TCP socket)
 *   reset       tcp_receive_reset
 * tb_ programs are tp_btf; rt_ the raw_tp fallback. Both read through
 * BPF_CORE_READ so one body serves the two.
 */
#include <linux/types.h>
#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>
#include <bpf/bpf_core_read.h>

#define PRESERVE __attribute__((preserve_access_index))
#include "cgroup_types.h"
#include "net.h"
#include "btf_keep.h"

char LICENSE[] SEC("license") = "GPL";

#define IPPROTO_TCP 6
#define TCP_SYN_SENT 2
#define TCP_CLOSE 7
#define EEXIST 17

struct sock_cgroup_data {
	struct cgroup *cgroup;
} PRESERVE;

struct sock {
	struct sock_cgroup_data sk_cgrp_data;
	__u16 sk_protocol;      /* a bitfield before 5.6: read as one */
} PRESERVE;

struct sk_buff {
	char cb[48];
} PRESERVE;

/* TCP's view of skb->cb: tcp_skb_pcount() is tcp_gso_segs */
struct tcp_skb_cb {
	union {
		struct {
			__u16 tcp_gso_segs;
		};
	};
} PRESERVE;

/* Present in kernels whose tcp_retransmit_skb tracepoint also fires for
 * retransmits that failed, passing their error as a third argument. */
struct trace_event_raw_tcp_retransmit_skb {
	int err;
} PRESERVE;

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 4096);        /* set by the loader; removed cgroups are retired */
	__type(key, __u64);
	__type(value, struct net_counters);
} net_counters SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, NH_MAX);
	__type(key, __u32);
	__type(value, __u64);
} net_health SEC(".maps");

BTF_KEEP(net, enum net_counter counter, enum net_health health)

static __always_inline __u64 sock_cgroup_id(const struct sock *sk)
{
	/* kernels before 5.15 packed the pointer with other data: no id there */
	if (!bpf_core_field_exists(sk->sk_cgrp_data.cgroup))
		return 0;
	return BPF_CORE_READ(sk, sk_cgrp_data.cgroup, kn, id);
}

static __always_inline void count(const struct sock *sk, __u32 what, __u64 n)
{
	__u64 cgid = sock_cgroup_id(sk);
	struct net_counters *c = bpf_map_lookup_elem(&net_counters, &cgid);

	if (!c) {
		struct net_counters zero = {};
		long err = bpf_map_update_elem(&net_counters, &cgid, &zero, BPF_NOEXIST);

		if (err && err != -EEXIST) {
			__u32 h = NH_COUNTERS_FULL;
			__u64 *full = bpf_map_lookup_elem(&net_health, &h);

			if (full)
				__sync_fetch_and_add(full, 1);
			return;
		}
		c = bpf_map_lookup_elem(&net_counters, &cgid);
		if (!c)
			return;
	}
	if (what < NC_MAX)
		__sync_fetch_and_add(&c->counts[what], n);
}

static __always_inline int on_retransmit(const struct sock *sk, const struct sk_buff *skb,
					 unsigned long long *ctx)
{
	struct tcp_skb_cb *cb;
	__u16 segs = 0;

	/* A constant at load time: a kernel without the argument never reads it. */
	if (bpf_core_field_exists(struct trace_event_raw_tcp_retransmit_skb, err) && (int)ctx[2])
		return 0;
	cb = (void *)skb + bpf_core_field_offset(skb->cb);
	bpf_core_read(&segs, sizeof(segs), &cb->tcp_gso_segs);
	count(sk, NC_RETRANSMITS, segs ? segs : 1);
	return 0;
}

static __always_inline int on_set_state(const struct sock *sk, int oldstate, int newstate)
{
	if (oldstate != TCP_SYN_SENT || newstate != TCP_CLOSE)
		return 0;
	if (BPF_CORE_READ_BITFIELD_PROBED(sk, sk_protocol) != IPPROTO_TCP)
		return 0;
	count(sk, NC_CONNECT_FAILURES, 1);
	return 0;
}

SEC("tp_btf/tcp_retransmit_skb")
int BPF_PROG(tb_tcp_retransmit_skb, const struct sock *sk, const struct sk_buff *skb)
{
	return on_retransmit(sk, skb, ctx);
}

SEC("tp_btf/inet_sock_set_state")
int BPF_PROG(tb_inet_sock_set_state, const struct sock *sk, int oldstate, int newstate)
{
	return on_set_state(sk, oldstate, newstate);
}

SEC("tp_btf/tcp_receive_reset")
int BPF_PROG(tb_tcp_receive_reset, const struct sock *sk)
{
	count(sk, NC_RESETS_RECEIVED, 1);
	return 0;
}

SEC("raw_tp/tcp_retransmit_skb")
int BPF_PROG(rt_tcp_retransmit_skb, const struct sock *sk, const struct sk_buff *skb)
{
	return on_retransmit(sk, skb, ctx);
}

SEC("raw_tp/inet_sock_set_state")
int BPF_PROG(rt_inet_sock_set_state, const struct sock *sk, int oldstate, int newstate)
{
	return on_set_state(sk, oldstate, newstate);
}

SEC("raw_tp/tcp_receive_reset")
int BPF_PROG(rt_tcp_receive_reset, const struct sock *sk)
{
	count(sk, NC_RESETS_RECEIVED, 1);
	return 0;
}
