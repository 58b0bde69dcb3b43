/* rc_qp.h -- connecting an RC QP with plain verbs, for the test clients that
 * drive the emulated HCA (port 1, LID addressing, PSN 0). */
#ifndef SIGMATRACE_TESTS_RC_QP_H
#define SIGMATRACE_TESTS_RC_QP_H

#include <stdint.h>
#include <infiniband/verbs.h>

static inline int rc_to_init(struct ibv_qp *qp)
{
	struct ibv_qp_attr a = { .qp_state = IBV_QPS_INIT, .pkey_index = 0, .port_num = 1,
				 .qp_access_flags = IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC };
	return ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS);
}

/* RTR toward (dlid, dqpn), then RTS; rd_atomic outstanding RDMA reads/atomics each way */
static inline int rc_to_rtr_rts(struct ibv_qp *qp, uint32_t dqpn, uint16_t dlid, uint8_t rd_atomic)
{
	struct ibv_qp_attr a = { .qp_state = IBV_QPS_RTR, .path_mtu = IBV_MTU_1024, .dest_qp_num = dqpn, .rq_psn = 0,
				 .max_dest_rd_atomic = rd_atomic, .min_rnr_timer = 12,
				 .ah_attr = { .dlid = dlid, .port_num = 1 } };
	int r = ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
					      IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER);
	if (r)
		return r;
	a.qp_state = IBV_QPS_RTS;
	a.timeout = 14;
	a.retry_cnt = 7;
	a.rnr_retry = 7;
	a.sq_psn = 0;
	a.max_rd_atomic = rd_atomic;
	return ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN |
					     IBV_QP_MAX_QP_RD_ATOMIC);
}

#endif
