/* The net probe's map layout contract: shared by net.bpf.c and read by
 * tracehound/probes/net.py, whose LAYOUTS a test checks against the BTF of
 * the built object.
 *
 *   net_counters  cgroup id (__u64) -> struct net_counters
 *   net_health    enum net_health   -> __u64 count
 */
#ifndef TRACEHOUND_NET_H
#define TRACEHOUND_NET_H

/* Indexes into struct net_counters.counts. */
enum net_counter {
	NC_RETRANSMITS = 0,     /* TCP segments retransmitted */
	NC_CONNECT_FAILURES,    /* active opens that went SYN_SENT -> CLOSE */
	NC_RESETS_RECEIVED,     /* RSTs that reset a socket */
	NC_MAX,
};

enum net_health {
	NH_COUNTERS_FULL = 0,   /* an update found net_counters full */
	NH_MAX,
};

struct net_counters {
	__u64 counts[NC_MAX];
};

#endif
