/* ibgda_common.h -- host-side pieces shared by the IBGDA-style test clients
 * (emu_ibgda_client.c, hijack_client.c, gpu_ibgda_client.cu).
 *
 * NVSHMEM host setup over DevX (reference §5.1): mlx5dv numbers of the verbs
 * objects, CREATE_CQ / CREATE_QP PRM commands over umems, the
 * RST2INIT -> INIT2RTR -> RTR2RTS modify commands, one-WQEBB WQE building
 * (reference §1) and the DBR / doorbell / CQ consumer values (reference §3.3).
 * Layouts come from sigmatrace/mlx5.h only.
 *
 * Static inline C, usable from C and from CUDA C++ host code (no __device__
 * code here: the GPU client's kernels build their WQEs themselves).  Nothing
 * here prints or exits: failures are returned, so that every client keeps its
 * own messages and exit codes.
 */
#ifndef SIGMATRACE_TESTS_IBGDA_COMMON_H
#define SIGMATRACE_TESTS_IBGDA_COMMON_H

#include <infiniband/mlx5dv.h>
#include <infiniband/verbs.h>
#include <stdint.h>
#include <string.h>
#include <time.h>

#include "sigmatrace/mlx5.h"

#define IBGDA_CREATE_CQ_INLEN 0x60 /* create_cq_in up to cq_umem_valid (reference §4.5) */
#define IBGDA_PRM_OUT_SIZE    ST_PRM_CREATE_QP_OUT_SIZE /* out buffer of every command below */

static inline double ibgda_now_s(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return t.tv_sec + t.tv_nsec * 1e-9;
}

/* ceil(log2(v)) */
static inline unsigned ibgda_ilog2(unsigned v)
{
	unsigned r = 0;
	while ((1u << r) < v)
		r++;
	return r;
}

/* ---- mlx5dv numbers of verbs objects (reference §5.1 steps 2-3); 0 on success */
static inline int ibgda_pdn(struct ibv_pd *pd, uint32_t *pdn)
{
	struct mlx5dv_pd dpd;
	struct mlx5dv_obj o;
	memset(&o, 0, sizeof o);
	o.pd.in = pd;
	o.pd.out = &dpd;
	if (mlx5dv_init_obj(&o, MLX5DV_OBJ_PD))
		return -1;
	*pdn = dpd.pdn;
	return 0;
}

static inline int ibgda_srqn(struct ibv_srq *srq, uint32_t *srqn)
{
	struct mlx5dv_srq dsrq;
	struct mlx5dv_obj o;
	memset(&dsrq, 0, sizeof dsrq);
	dsrq.comp_mask = MLX5DV_SRQ_MASK_SRQN;
	memset(&o, 0, sizeof o);
	o.srq.in = srq;
	o.srq.out = &dsrq;
	if (mlx5dv_init_obj(&o, MLX5DV_OBJ_SRQ))
		return -1;
	*srqn = dsrq.srqn;
	return 0;
}

static inline int ibgda_cqn(struct ibv_cq *cq, uint32_t *cqn)
{
	struct mlx5dv_cq dcq;
	struct mlx5dv_obj o;
	memset(&o, 0, sizeof o);
	o.cq.in = cq;
	o.cq.out = &dcq;
	if (mlx5dv_init_obj(&o, MLX5DV_OBJ_CQ))
		return -1;
	*cqn = dcq.cqn;
	return 0;
}

/* ---- DevX objects (reference §4.3-§4.5, §5.1 steps 5, 9) ----------------------
 * Each returns the object (NULL on failure, errno as the driver left it); `out`
 * (IBGDA_PRM_OUT_SIZE bytes) holds the command's output either way, for
 * st_devx_get(out, ST_PRM_OUT_STATUS) in the caller's message. */

/* Send CQ of ncqe 64-byte CQEs: ring in umem `umem_id`, DBR in umem
 * `dbr_umem_id` (both at offset 0), overrun ignore; `collapsed` sets cc=1. */
static inline struct mlx5dv_devx_obj *ibgda_create_cq(struct ibv_context *ctx, uint32_t umem_id,
						      uint32_t dbr_umem_id, uint32_t ncqe, uint32_t uar_page,
						      uint32_t eqn, int collapsed, uint8_t *out, uint32_t *cqn)
{
	uint8_t in[IBGDA_CREATE_CQ_INLEN];
	memset(in, 0, sizeof in);
	memset(out, 0, IBGDA_PRM_OUT_SIZE);
	st_devx_set(in, ST_PRM_CMD_OPCODE, ST_MLX5_CMD_OP_CREATE_CQ);
	st_devx_set(in, ST_PRM_CREATE_CQ_UMEM_ID, umem_id);
	st_devx_set(in, ST_PRM_CREATE_CQ_UMEM_VALID, 1);
	st_devx_set(in, ST_PRM_CREATE_CQ_UMEM_OFFSET, 0);
	st_devx_set(in, ST_PRM_CQC_DBR_UMEM_VALID, 1);
	st_devx_set(in, ST_PRM_CQC_DBR_UMEM_ID, dbr_umem_id);
	st_devx_set(in, ST_PRM_CQC_DBR_ADDR, 0);
	st_devx_set(in, ST_PRM_CQC_CQE_SZ, 0);
	st_devx_set(in, ST_PRM_CQC_CC, collapsed ? 1 : 0);
	st_devx_set(in, ST_PRM_CQC_OI, 1);
	st_devx_set(in, ST_PRM_CQC_LOG_CQ_SIZE, ibgda_ilog2(ncqe));
	st_devx_set(in, ST_PRM_CQC_UAR_PAGE, uar_page);
	st_devx_set(in, ST_PRM_CQC_C_EQN, eqn);
	st_devx_set(in, ST_PRM_CQC_LOG_PAGE_SIZE, 4);
	struct mlx5dv_devx_obj *obj = mlx5dv_devx_obj_create(ctx, in, sizeof in, out, IBGDA_PRM_OUT_SIZE);
	if (obj)
		*cqn = (uint32_t)st_devx_get(out, ST_PRM_CREATE_CQ_OUT_CQN);
	return obj;
}

/* RC QP whose receives go to SRQ `srqn`: SQ of nwqebb WQEBBs in umem
 * `wq_umem_id`, DBR in umem `dbr_umem_id` (both at offset 0), no RQ. */
static inline struct mlx5dv_devx_obj *ibgda_create_qp(struct ibv_context *ctx, uint32_t pdn, uint32_t uar_page,
						      uint32_t srqn, uint32_t cqn_snd, uint32_t cqn_rcv,
						      uint32_t wq_umem_id, uint32_t nwqebb, uint32_t dbr_umem_id,
						      uint8_t *out, uint32_t *qpn)
{
	uint8_t in[ST_PRM_CREATE_QP_IN_SIZE];
	memset(in, 0, sizeof in);
	memset(out, 0, IBGDA_PRM_OUT_SIZE);
	st_devx_set(in, ST_PRM_CMD_OPCODE, ST_MLX5_CMD_OP_CREATE_QP);
	st_devx_set(in, ST_PRM_CREATE_QP_WQ_UMEM_ID, wq_umem_id);
	st_devx_set(in, ST_PRM_CREATE_QP_WQ_UMEM_OFFSET, 0);
	st_devx_set(in, ST_PRM_CREATE_QP_WQ_UMEM_VALID, 1);
	st_devx_set(in, ST_PRM_QPC_ST, ST_MLX5_QPC_ST_RC);
	st_devx_set(in, ST_PRM_QPC_PM_STATE, 3);
	st_devx_set(in, ST_PRM_QPC_PD, pdn);
	st_devx_set(in, ST_PRM_QPC_UAR_PAGE, uar_page);
	st_devx_set(in, ST_PRM_QPC_RQ_TYPE, 1);
	st_devx_set(in, ST_PRM_QPC_SRQN, srqn);
	st_devx_set(in, ST_PRM_QPC_CQN_SND, cqn_snd);
	st_devx_set(in, ST_PRM_QPC_CQN_RCV, cqn_rcv);
	st_devx_set(in, ST_PRM_QPC_LOG_SQ_SIZE, ibgda_ilog2(nwqebb));
	st_devx_set(in, ST_PRM_QPC_LOG_RQ_SIZE, 0);
	st_devx_set(in, ST_PRM_QPC_DBR_UMEM_VALID, 1);
	st_devx_set(in, ST_PRM_QPC_DBR_ADDR, 0);
	st_devx_set(in, ST_PRM_QPC_DBR_UMEM_ID, dbr_umem_id);
	st_devx_set(in, ST_PRM_QPC_USER_INDEX, 0);
	struct mlx5dv_devx_obj *obj = mlx5dv_devx_obj_create(ctx, in, sizeof in, out, IBGDA_PRM_OUT_SIZE);
	if (obj)
		*qpn = (uint32_t)st_devx_get(out, ST_PRM_CREATE_QP_OUT_QPN);
	return obj;
}

/* One step of RST2INIT -> INIT2RTR(rqpn, rlid) -> RTR2RTS with NVSHMEM's values
 * (reference §4.4); returns mlx5dv_devx_obj_modify's result. */
static inline int ibgda_modify_qp(struct mlx5dv_devx_obj *qp, uint32_t qpn, uint16_t op, uint32_t rqpn,
				  uint32_t rlid, uint8_t *out)
{
	uint8_t in[ST_PRM_MODIFY_QP_IN_SIZE];
	memset(in, 0, sizeof in);
	memset(out, 0, IBGDA_PRM_OUT_SIZE);
	st_devx_set(in, ST_PRM_CMD_OPCODE, op);
	st_devx_set(in, ST_PRM_MODIFY_QP_QPN, qpn);
	switch (op) {
	case ST_MLX5_CMD_OP_RST2INIT_QP:
		st_devx_set(in, ST_PRM_QPC_RWE, 1);
		st_devx_set(in, ST_PRM_QPC_RRE, 1);
		st_devx_set(in, ST_PRM_QPC_RAE, 1);
		st_devx_set(in, ST_PRM_QPC_ATOMIC_MODE, 3);
		st_devx_set(in, ST_PRM_QPC_VHCA_PORT_NUM, 1);
		st_devx_set(in, ST_PRM_QPC_PM_STATE, 3);
		break;
	case ST_MLX5_CMD_OP_INIT2RTR_QP:
		st_devx_set(in, ST_PRM_QPC_MTU, 5);
		st_devx_set(in, ST_PRM_QPC_LOG_MSG_MAX, 30);
		st_devx_set(in, ST_PRM_QPC_REMOTE_QPN, rqpn);
		st_devx_set(in, ST_PRM_QPC_MIN_RNR_NAK, 12);
		st_devx_set(in, ST_PRM_QPC_LOG_RRA_MAX, 4);
		st_devx_set(in, ST_PRM_QPC_RLID, rlid);
		break;
	default: /* RTR2RTS */
		st_devx_set(in, ST_PRM_QPC_RETRY_COUNT, 7);
		st_devx_set(in, ST_PRM_QPC_RNR_RETRY, 7);
		st_devx_set(in, ST_PRM_QPC_ACK_TIMEOUT, 20);
		st_devx_set(in, ST_PRM_QPC_NEXT_SEND_PSN, 0);
		break;
	}
	return mlx5dv_devx_obj_modify(qp, in, sizeof in, out, IBGDA_PRM_OUT_SIZE);
}

/* ---- WQEs and doorbells (reference §1, §3.3) ------------------------------------ */

/* One-WQEBB WQE at w (64 contiguous bytes): RDMA WRITE / READ (DS 3: ctrl,
 * raddr, data) or ATOMIC CS / FA (DS 4: ctrl, raddr, atomic(swap_add,
 * compare), data).  Only the segments are written, the ctrl segment last; the
 * rest of the WQEBB is left as it is.  Returns the DS. */
static inline uint32_t ibgda_build_wqe(uint8_t *w, uint8_t opcode, uint16_t idx, uint32_t qpn, uint8_t fm_ce_se,
				       uint64_t raddr, uint32_t rkey, uint64_t laddr, uint32_t lkey, uint32_t len,
				       uint64_t swap_add, uint64_t compare)
{
	int atomic = opcode == ST_MLX5_OPCODE_ATOMIC_CS || opcode == ST_MLX5_OPCODE_ATOMIC_FA;
	uint32_t ds = atomic ? 4 : 3;
	st_mlx5_set_raddr_seg((struct st_mlx5_wqe_raddr_seg *)(w + 16), raddr, rkey);
	if (atomic)
		st_mlx5_set_atomic_seg((struct st_mlx5_wqe_atomic_seg *)(w + 32), swap_add, compare);
	st_mlx5_set_data_seg((struct st_mlx5_wqe_data_seg *)(w + 16 * (ds - 1)), len, lkey, laddr);
	st_mlx5_set_ctrl_seg((struct st_mlx5_wqe_ctrl_seg *)w, 0, idx, opcode, qpn, ds, fm_ce_se, 0);
	return ds;
}

/* DBR send counter (DBR dword ST_MLX5_SND_DBR) announcing producer index pi. */
static inline uint32_t ibgda_dbr_value(uint32_t pi) { return htobe32(pi & 0xffff); }

/* The 8-byte UAR doorbell for producer index pi, NVSHMEM/DeepEP convention
 * {BE32(pi<<8), BE32(qpn<<8)}, as one 64-bit store value. */
static inline uint64_t ibgda_db_value(uint32_t pi, uint32_t qpn)
{
	uint8_t db[8];
	uint64_t v;
	st_mlx5_make_nvshmem_db(db, pi, qpn);
	memcpy(&v, db, 8);
	return v;
}

/* CQ DBR consumer counter after consuming up to ci. */
static inline uint32_t ibgda_cq_ci_value(uint32_t ci) { return htobe32(ci & 0xffffff); }

/* The next CQE of a ring of ncqe 64-byte CQEs in host memory once software owns it (the caller
 * reads it), the consumer index *ci advanced and published in the CQ's doorbell record; NULL while
 * the NIC still owns it. */
static inline const struct st_mlx5_cqe64 *ibgda_cq_next(uint8_t *cq_buf, uint8_t *cq_dbr, uint32_t ncqe, uint32_t *ci)
{
	const struct st_mlx5_cqe64 *c = (const struct st_mlx5_cqe64 *)(cq_buf + (*ci & (ncqe - 1)) * 64);
	(void)__atomic_load_n(&c->op_own, __ATOMIC_ACQUIRE);
	if (!st_mlx5_cqe_valid(c, *ci, ncqe))
		return NULL;
	(*ci)++;
	uint32_t v = ibgda_cq_ci_value(*ci);
	memcpy(cq_dbr, &v, 4);
	return c;
}

#endif /* SIGMATRACE_TESTS_IBGDA_COMMON_H */
