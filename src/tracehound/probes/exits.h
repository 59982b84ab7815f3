/* The exit probe's map layout contract: shared by exits.bpf.c and read by
 * tracehound/probes/exits.py, whose LAYOUTS a test checks against the BTF
 * of the built object. */
#ifndef TRACEHOUND_EXITS_H
#define TRACEHOUND_EXITS_H

/* Why a process ended. OOM wins over the signal it was killed with: the
 * victim dies of SIGKILL like any other killed process. */
enum exit_reason { REASON_CLEAN, REASON_SIGNAL, REASON_OOM, REASON_ERROR, REASON_MAX };

enum exit_health { H_COUNTERS_FULL, H_LAST_FULL, H_MAX };

#define EXIT_SIG_CORE 0x80     /* in exit_key.signal: the process dumped core */

struct exit_key {
	__u64 cgroup_id;       /* of the exiting task (its last thread) */
	__u32 reason;          /* enum exit_reason */
	__u32 signal;          /* the fatal signal | EXIT_SIG_CORE; 0 for error and clean */
};

/* The latest process that ended for one exit_key, so an event can name it. */
struct exit_last {
	__u64 ktime_ns;        /* CLOCK_MONOTONIC */
	__u32 pid;             /* the process (thread group) id */
	__u32 status;          /* exit status of an error exit, 0 otherwise */
	char comm[16];         /* the thread group leader's */
};

#endif
