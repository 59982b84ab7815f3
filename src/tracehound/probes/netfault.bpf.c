// SPDX-License-Identifier: GPL-2.0
/* Packet loss and corruption for the chaos engine, on kernels without
 * sch_netem: a tc (clsact) classifier attached to one interface and
 * direction. Probabilities are thresholds on a 32-bit random number, set by
 * the loader through netfault_cfg before or while the filter runs; the same
 * map entry counts what was done, so a report can say how many packets the
 * fault really touched. */
#include <linux/bpf.h>
#include <linux/pkt_cls.h>
#include <bpf/bpf_helpers.h>

char LICENSE[] SEC("license") = "GPL";

#define ETH_HEADER_LEN 14

struct netfault_cfg {
	__u32 loss_threshold;    /* drop when prandom < this (0: never) */
	__u32 corrupt_threshold; /* flip one payload bit when prandom < this */
	__u64 seen;
	__u64 dropped;
	__u64 corrupted;
};

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct netfault_cfg);
} netfault_cfg SEC(".maps");

static __always_inline int hit(__u32 threshold)
{
	/* A threshold of 0xffffffff still misses one value in 2^32: callers
	 * treat 100% as "always" by passing 0xffffffff, which is close enough
	 * and keeps the comparison branch-free. */
	return threshold && bpf_get_prandom_u32() < threshold;
}

SEC("tc")
int netfault(struct __sk_buff *skb)
{
	__u32 zero = 0;
	struct netfault_cfg *cfg = bpf_map_lookup_elem(&netfault_cfg, &zero);

	if (!cfg)
		return TC_ACT_OK;
	__sync_fetch_and_add(&cfg->seen, 1);

	if (hit(cfg->loss_threshold)) {
		__sync_fetch_and_add(&cfg->dropped, 1);
		/* STOLEN, not SHOT: SHOT makes the local send fail (ENOBUFS),
		 * so ping resends and TCP backs off at once; STOLEN reports
		 * success and loses the packet, as a lossy wire (or netem) does. */
		return TC_ACT_STOLEN;
	}

	if (hit(cfg->corrupt_threshold) && skb->len > ETH_HEADER_LEN) {
		__u32 span = skb->len - ETH_HEADER_LEN;
		__u32 offset = ETH_HEADER_LEN + bpf_get_prandom_u32() % span;
		__u8 byte;

		/* Bound the offset for the verifier; load_bytes checks the rest. */
		if (offset > 0xffff)
			return TC_ACT_OK;
		if (bpf_skb_load_bytes(skb, offset, &byte, 1) < 0)
			return TC_ACT_OK;
		byte ^= 1 << (bpf_get_prandom_u32() & 7);
		/* No checksum fix-up: a corrupted packet must look corrupted to
		 * the receiver, as with netem's corrupt option. */
		if (bpf_skb_store_bytes(skb, offset, &byte, 1, 0) == 0)
			__sync_fetch_and_add(&cfg->corrupted, 1);
	}
	return TC_ACT_OK;
}
