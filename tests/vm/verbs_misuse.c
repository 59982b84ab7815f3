/* A verbs program that uses libibverbs the way real programs get it wrong,
 * for the RDMA application-view tests in the VM.
 *
 *   verbs_misuse DEVICE busy-cq   create a PD, CQ, QP on that CQ and an MR,
 *                                 then destroy the CQ while the QP still uses
 *                                 it (the kernel refuses: EBUSY) and carry on
 *   verbs_misuse DEVICE hold      the same objects, released by nobody
 *   verbs_misuse DEVICE churn     create and destroy the objects in a loop, so
 *                                 a kill lands in the middle of a setup
 *
 * Prints "READY pid=<pid> qpn=<n> lkey=<k> destroy_cq=<ret>" once its objects
 * exist, then waits for a line on stdin (or a signal) and exits without
 * releasing anything: the kernel frees what a process leaves at exit.
 */
#include <infiniband/verbs.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static struct ibv_context *open_named(const char *name)
{
	int n = 0;
	struct ibv_device **list = ibv_get_device_list(&n);
	struct ibv_context *ctx = NULL;

	for (int i = 0; list && i < n; i++)
		if (!strcmp(ibv_get_device_name(list[i]), name))
			ctx = ibv_open_device(list[i]);
	if (list)
		ibv_free_device_list(list);
	return ctx;
}

static char buf[1 << 16];

int main(int argc, char **argv)
{
	struct ibv_qp_init_attr attr = { .cap = { .max_send_wr = 4, .max_recv_wr = 4,
						  .max_send_sge = 1, .max_recv_sge = 1 },
					 .qp_type = IBV_QPT_RC };
	struct ibv_context *ctx;
	struct ibv_pd *pd;
	struct ibv_cq *cq;
	struct ibv_qp *qp;
	struct ibv_mr *mr;
	int destroyed = -1, rounds = 0;
	char line[16];

	if (argc != 3) {
		fprintf(stderr, "usage: %s DEVICE busy-cq|hold|churn\n", argv[0]);
		return 2;
	}
	setvbuf(stdout, NULL, _IONBF, 0);
	ctx = open_named(argv[1]);
	if (!ctx) {
		perror("ibv_open_device");
		return 1;
	}
	do {
		pd = ibv_alloc_pd(ctx);
		cq = pd ? ibv_create_cq(ctx, 8, NULL, NULL, 0) : NULL;
		attr.send_cq = attr.recv_cq = cq;
		qp = cq ? ibv_create_qp(pd, &attr) : NULL;
		mr = qp ? ibv_reg_mr(pd, buf, sizeof(buf), IBV_ACCESS_LOCAL_WRITE) : NULL;
		if (!mr) {
			perror("setup");
			return 1;
		}
		if (!strcmp(argv[2], "busy-cq"))
			destroyed = ibv_destroy_cq(cq);      /* EBUSY: the QP uses it */
		if (!rounds++)
			printf("READY pid=%d qpn=%u lkey=%u destroy_cq=%d\n", getpid(), qp->qp_num,
			       mr->lkey, destroyed);
		if (strcmp(argv[2], "churn"))
			break;
		ibv_dereg_mr(mr);
		ibv_destroy_qp(qp);
		ibv_destroy_cq(cq);
		ibv_dealloc_pd(pd);
	} while (1);
	if (!fgets(line, sizeof(line), stdin))
		return 0;
	return 0;
}
