"""A real verbs program for the RDMA VM tests (python3-pyverbs).

Creates a context, PD, CQ, MR, SRQ and an RC QP on one device, optionally
connects the QP to itself (INIT -> RTR -> RTS over the loopback GID), prints
one line `RESULT {json}` with what each step returned, and then either exits
(objects freed by the kernel at close) or holds everything until a line
arrives on stdin.

    rdma_verbs_app.py [--device rxe0] [--mr-size BYTES] [--connect] [--hold]

Creation stops at the first step that fails; the result names its errno and
the wall-clock time of the failure, so a test can measure how long the agent
took to notice.
"""
import argparse
import errno
import json
import os
import sys
import time

import pyverbs.enums as e
from pyverbs.addr import AHAttr, GlobalRoute
from pyverbs.cq import CQ
from pyverbs.device import Context
from pyverbs.mr import MR
from pyverbs.pd import PD
from pyverbs.pyverbs_error import PyverbsError, PyverbsRDMAError
from pyverbs.qp import QP, QPAttr, QPCap, QPInitAttr
from pyverbs.srq import SRQ, SrqAttr, SrqInitAttr

PORT = 1
STEPS = ("ctx", "pd", "cq", "mr", "srq", "qp")


def connect_to_self(ctx, qp) -> None:
    gid = ctx.query_gid(port_num=PORT, index=0)
    attr = QPAttr(qp_state=e.IBV_QPS_INIT)
    attr.qp_access_flags = e.IBV_ACCESS_LOCAL_WRITE | e.IBV_ACCESS_REMOTE_WRITE
    attr.dest_qp_num = qp.qp_num
    attr.path_mtu = e.IBV_MTU_1024
    attr.max_dest_rd_atomic = 1
    attr.min_rnr_timer = 12
    attr.rq_psn = 0
    attr.sq_psn = 0
    attr.timeout = 14
    attr.retry_cnt = 7
    attr.rnr_retry = 7
    attr.max_rd_atomic = 1
    attr.ah_attr = AHAttr(port_num=PORT, is_global=1, gr=GlobalRoute(dgid=gid, sgid_index=0))
    qp.to_rts(attr)


def create(args, held: list) -> dict:
    steps: dict[str, str] = {}
    failed_at = None
    ctx = pd = cq = None
    makers = {
        "ctx": lambda: Context(name=args.device),
        "pd": lambda: PD(ctx),
        "cq": lambda: CQ(ctx, 16),
        "mr": lambda: MR(pd, args.mr_size, e.IBV_ACCESS_LOCAL_WRITE),
        "srq": lambda: SRQ(pd, SrqInitAttr(SrqAttr(max_wr=4, max_sge=1))),
        "qp": lambda: QP(pd, QPInitAttr(qp_type=e.IBV_QPT_RC, scq=cq, rcq=cq,
                                        cap=QPCap(max_send_wr=4, max_recv_wr=4))),
    }
    qp = None
    for step in STEPS:
        try:
            obj = makers[step]()
        except (PyverbsRDMAError, PyverbsError) as exc:
            failed_at = time.time()
            code = getattr(exc, "error_code", 0) or 0
            steps[step] = errno.errorcode.get(abs(code), str(exc))
            break
        held.append(obj)
        steps[step] = "ok"
        ctx = obj if step == "ctx" else ctx
        pd = obj if step == "pd" else pd
        cq = obj if step == "cq" else cq
        qp = obj if step == "qp" else qp
    result = {"pid": os.getpid(), "steps": steps, "failed_at": failed_at}
    if qp is not None:
        result["qpn"] = qp.qp_num
        if args.connect:
            # RTR resolves the destination's MAC; under emulation on a busy
            # host that can time out (ETIMEDOUT): the QP stays in INIT and
            # the transition may simply be asked for again.
            for attempt in range(5):
                try:
                    connect_to_self(ctx, qp)
                    result["connect"] = "ok"
                    break
                except (PyverbsRDMAError, PyverbsError) as exc:
                    result["connect"] = str(exc)
                    if getattr(exc, "error_code", 0) != errno.ETIMEDOUT:
                        break
                    time.sleep(1)
    return result


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--device", default="rxe0")
    parser.add_argument("--mr-size", type=int, default=65536)
    parser.add_argument("--connect", action="store_true")
    parser.add_argument("--hold", action="store_true")
    args = parser.parse_args()
    held: list = []
    result = create(args, held)
    print("RESULT " + json.dumps(result), flush=True)
    if args.hold:
        sys.stdin.readline()
    # explicit destroy verbs; a kill -9 leaves the freeing to the kernel instead
    for obj in reversed(held):
        obj.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
