/* libmlx5.so.1 of the emulated HCA: the DevX PRM commands
 * (mlx5dv_devx_obj_create/_modify/_query/_destroy, mlx5dv_devx_general_cmd).
 *
 * Command buffers are parsed and written with the DEVX bit rule and the
 * field offsets of reference §4.3-§4.5 (sigmatrace/mlx5.h) and emu_prm.h.
 * What the HCA answers is what the emulator does; what a real HCA refuses is
 * refused with its status (BAD_PARAM, BAD_RES for a resource that does not
 * exist, BAD_RES_STATE for a transition from the wrong state, BAD_OP for a
 * command it does not know), logged under SIGMATRACE_EMU_DEBUG=errors.
 *
 *   general  QUERY_HCA_CAP (general, atomic, RoCE, ODP pages), ALLOC_PD,
 *            DEALLOC_PD
 *   create   CREATE_CQ (umem ring, umem or address DBR, 64-byte CQEs,
 *            collapsed, overrun ignore), CREATE_QP (RC, and DCI where the
 *            HCA has DC), CREATE_DCT (where it has DC)
 *   modify   RST2INIT, INIT2RTR, RTR2RTS, RTS2RTS, 2ERR, 2RST (QPs),
 *            DRAIN_DCT
 *   query    QUERY_QP (the QP context as the emulator holds it), QUERY_DCT
 *
 * The capabilities are those of the ConnectX the emulator plays (vendor part
 * 4123, a ConnectX-6, IB port) limited to what it executes: NVSHMEM 3.4.5
 * reads cqe_version (must be 1), log_bf_reg_size and compact_address_vector
 * from the general page (ibgda.cpp ibgda_create_qp, ibgda_alloc_and_map_qp_uar,
 * ibgda_create_dct_shared_objects) and atomic_operations, atomic_size_qp/dc
 * and the 8-byte endianness mode from the atomic page
 * (transport_mlx5_common.cpp).
 *
 * Over 600 lines: one dispatcher of the PRM commands over the NIC's object tables; the
 * commands share its field accessors and state checks, and a split by command would scatter one switch.
 */
#include <errno.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "emu_devx.h"

/* ---- QUERY_HCA_CAP ------------------------------------------------------------------ */
#define CAP(field, v) st_devx_set(cap, EMU_AT(EMU_HCA_CAP_BASE_BITS, field), (uint64_t)(v))

static void caps_general(struct emu_nic *nic, uint8_t *cap)
{
	CAP(EMU_CAP_LOG_MAX_SRQ_SZ, 15);      /* SRQs of up to 32767 WQEs (srq.c) */
	CAP(EMU_CAP_LOG_MAX_QP_SZ, 15);       /* NVSHMEMI_IBGDA_MAX_QP_DEPTH 32768 WQEBBs */
	CAP(EMU_CAP_LOG_MAX_QP, 12);          /* EMU_MAX_QP */
	CAP(EMU_CAP_LOG_MAX_SRQ, 8);          /* 256 SRQs */
	CAP(EMU_CAP_LOG_MAX_CQ_SZ, 22);
	CAP(EMU_CAP_LOG_MAX_CQ, 12);          /* EMU_MAX_CQ */
	CAP(EMU_CAP_LOG_MAX_MKEY, 14);        /* EMU_MAX_MR */
	CAP(EMU_CAP_LOG_MAX_RA_REQ_DC, 4);    /* 16 outstanding RDMA reads/atomics (max_qp_rd_atom) */
	CAP(EMU_CAP_LOG_MAX_RA_RES_DC, 4);
	CAP(EMU_CAP_LOG_MAX_RA_REQ_QP, 4);
	CAP(EMU_CAP_LOG_MAX_RA_RES_QP, 4);
	CAP(EMU_CAP_PORT_TYPE, 0);            /* InfiniBand */
	CAP(EMU_CAP_NUM_PORTS, 1);
	CAP(EMU_CAP_LOG_MAX_MSG, 31);         /* 2 GiB messages */
	CAP(EMU_CAP_CQE_VERSION, 1);          /* CQEs carry the QP's user index (requester.c) */
	CAP(EMU_CAP_COMPACT_ADDRESS_VECTOR, 1); /* 16-byte AVs in DCI WQEs (requester.c dci_address) */
	CAP(EMU_CAP_DCT, nic->dc_enabled);    /* SIGMATRACE_EMU_DC */
	CAP(EMU_CAP_ROCE, 0);
	CAP(EMU_CAP_ATOMIC, 1);
	CAP(EMU_CAP_CQ_OI, 1);
	CAP(EMU_CAP_CQ_RESIZE, 0);            /* ibv_resize_cq: EOPNOTSUPP */
	CAP(EMU_CAP_XRC, 0);
	CAP(EMU_CAP_UD, 1);
	CAP(EMU_CAP_UC, 1);
	CAP(EMU_CAP_RC, 1);
	CAP(EMU_CAP_UAR_4K, 1);
	CAP(EMU_CAP_UMEM_UID_0, 1);
	CAP(EMU_CAP_LOG_PG_SZ, 12);
	CAP(EMU_CAP_BF, 1);
	CAP(EMU_CAP_LOG_BF_REG_SIZE, 9);      /* 512: two 256-byte BlueFlame halves (bf.size 256, doorbell.c) */
	CAP(EMU_CAP_MAX_WQE_SZ_SQ, ST_MLX5_SEND_WQE_MAX_WQEBBS * ST_MLX5_SEND_WQE_BB);
	CAP(EMU_CAP_MAX_WQE_SZ_RQ, 16 * (EMU_MAX_SGE - 2));
	CAP(EMU_CAP_MAX_WQE_SZ_SQ_DC, ST_MLX5_SEND_WQE_MAX_WQEBBS * ST_MLX5_SEND_WQE_BB);
	CAP(EMU_CAP_LOG_MAX_PD, 12);          /* EMU_MAX_PD */
	CAP(EMU_CAP_LOG_UAR_PAGE_SZ, 0);      /* 4 KiB UARs */
	CAP(EMU_CAP_NUM_OF_UARS_PER_PAGE, 1);
	CAP(EMU_CAP_LOG_MAX_DCT_CONNECTIONS, nic->dc_enabled ? 10 : 0);
	CAP(EMU_CAP_LOG_MAX_ATOMIC_SIZE_QP, 3); /* atomics up to 8 bytes */
	CAP(EMU_CAP_LOG_MAX_ATOMIC_SIZE_DC, 3);
}

static void caps_atomic(uint8_t *cap)
{
	CAP(EMU_ACAP_ATOMIC_OPERATIONS,
	    EMU_ATOMIC_OP_CAS | EMU_ATOMIC_OP_FA | EMU_ATOMIC_OP_MASKED_CAS | EMU_ATOMIC_OP_MASKED_FA);
	CAP(EMU_ACAP_ATOMIC_SIZE_QP, EMU_ATOMIC_SIZE_4B | EMU_ATOMIC_SIZE_8B);
	CAP(EMU_ACAP_ATOMIC_SIZE_DC, EMU_ATOMIC_SIZE_4B | EMU_ATOMIC_SIZE_8B);
	/* 8-byte operands in host byte order (amo.c) */
	CAP(EMU_ACAP_8B_ENDIANNESS_MODE_1_SUPP, 1);
	CAP(EMU_ACAP_8B_ENDIANNESS_MODE, 1);
}
#undef CAP

static int query_hca_cap(struct emu_nic *nic, const void *in, size_t inlen, void *out, size_t outlen)
{
	uint32_t op_mod = (uint32_t)st_devx_get(in, ST_PRM_CMD_OP_MOD);
	uint32_t type = op_mod >> 1; /* bit 0: current (1) or maximum (0) values: the same here */
	if (inlen < EMU_QUERY_HCA_CAP_IN_SIZE)
		return cmd_status(out, outlen, CMD_BAD_INP_LEN, 0);
	if (outlen < EMU_HCA_CAP_BASE_BITS / 8 + EMU_HCA_CAP_PAGE_BYTES)
		return cmd_status(out, outlen, CMD_BAD_OUTP_LEN, 0);
	memset(out, 0, outlen);
	switch (type) {
	case EMU_CAPTYPE_GENERAL: caps_general(nic, out); break;
	case EMU_CAPTYPE_ATOMIC: caps_atomic(out); break;
	case EMU_CAPTYPE_ODP: break;  /* all zero: no on-demand paging */
	case EMU_CAPTYPE_ROCE: break; /* all zero: an InfiniBand port */
	default:
		EMU_ERR("DevX ERROR: QUERY_HCA_CAP of capability type 0x%x is not emulated (BAD_PARAM)", type);
		return cmd_status(out, outlen, CMD_BAD_PARAM, type);
	}
	EMU_LOG("devx QUERY_HCA_CAP type %u (%s)", type, (op_mod & 1) ? "current" : "maximum");
	return cmd_status(out, outlen, CMD_OK, 0);
}

EXPORT int mlx5dv_devx_general_cmd(struct ibv_context *ctx, const void *in, size_t inlen, void *out, size_t outlen)
{
	if (!ctx || !in || inlen < 8 || !out || outlen < 8)
		return EINVAL;
	uint32_t op = (uint32_t)st_devx_get(in, ST_PRM_CMD_OPCODE);
	struct emu_nic *nic = emu_ctx_nic(ctx);
	switch (op) {
	case ST_MLX5_CMD_OP_QUERY_HCA_CAP:
		return query_hca_cap(nic, in, inlen, out, outlen);
	case ST_MLX5_CMD_OP_ALLOC_PD: {
		if (outlen < 12)
			return cmd_status(out, outlen, CMD_BAD_OUTP_LEN, 0);
		memset(out, 0, outlen);
		uint32_t pdn = emu_pd_alloc_num(nic);
		if (!pdn)
			return cmd_status(out, outlen, CMD_BAD_RES, 0x1);
		cmd_status(out, outlen, CMD_OK, 0);
		st_devx_set(out, 0x48, 24, pdn); /* alloc_pd_out.pd */
		return 0;
	}
	case EMU_CMD_OP_DEALLOC_PD: {
		uint32_t pdn = (uint32_t)st_devx_get(in, 0x48, 24);
		uint8_t live = 1; /* free it only if it is allocated */
		int ok = pdn && pdn < EMU_MAX_PD &&
			 __atomic_compare_exchange_n(&nic->pd_live[pdn], &live, 0, 0, __ATOMIC_ACQ_REL, __ATOMIC_RELAXED);
		return cmd_status(out, outlen, ok ? CMD_OK : CMD_BAD_RES, ok ? 0 : pdn);
	}
	default:
		EMU_ERR("DevX ERROR: general command 0x%x is not emulated (BAD_OP)", op);
		return cmd_status(out, outlen, CMD_BAD_OP, op);
	}
}

/* ---- objects -------------------------------------------------------------------------- */
/* Tear down the QP, CQ or DCT behind a handle (the handle itself is the caller's). */
static void devx_obj_release(struct emu_devx_obj *o)
{
	struct emu_nic *nic = o->nic;
	if (o->kind == OBJ_QP || o->kind == OBJ_DCT) {
		struct emu_qp *qp = o->object;
		pthread_mutex_lock(&nic->lock);
		emu_qp_unregister(nic, qp);
		pthread_mutex_unlock(&nic->lock);
		free(qp->inflight);
		free(qp);
	} else if (o->kind == OBJ_CQ) {
		emu_cq_free(nic, o->object);
	}
}

/* The handle obj_create returns, with the command's OK status in out;
 * without memory for it the new object is released again and creation fails
 * with ENOMEM. */
static struct emu_devx_obj *devx_obj_new(int kind, void *p, struct emu_nic *nic, struct ibv_context *ctx, void *out,
					 size_t outlen)
{
	struct emu_devx_obj obj = { kind, p, nic, ctx };
	struct emu_devx_obj *o = calloc(1, sizeof *o);
	if (!o) {
		devx_obj_release(&obj);
		errno = ENOMEM;
		return NULL;
	}
	*o = obj;
	cmd_status(out, outlen, CMD_OK, 0);
	return o;
}

/* A failed create: the status in out, errno set, NULL. */
static struct emu_devx_obj *refuse(void *out, size_t outlen, int status, uint32_t syndrome, const char *cmd,
				   const char *why)
{
	EMU_ERR("DevX ERROR: %s refused (status 0x%x): %s", cmd, status, why);
	errno = cmd_status(out, outlen, status, syndrome);
	return NULL;
}

static uint8_t *umem_ptr(struct emu_nic *nic, uint32_t id, uint64_t off, uint64_t len)
{
	if (id >= EMU_MAX_UMEM || !nic->umems[id])
		return NULL;
	struct emu_umem *u = nic->umems[id];
	if (off > u->size || len > u->size - off)
		return NULL;
	return (uint8_t *)u->addr + off;
}

/* A doorbell record: in a umem when the command says so (dbr_umem_valid),
 * else at the address the command gives. */
static uint8_t *dbr_ptr(struct emu_nic *nic, uint64_t in_umem, uint32_t umem_id, uint64_t addr)
{
	return in_umem ? umem_ptr(nic, umem_id, addr, 8) : (uint8_t *)(uintptr_t)addr;
}

static int uar_page_known(struct emu_nic *nic, uint32_t page)
{
	for (struct emu_uar *u = nic->uars; u; u = u->next)
		if (u->page_id == page)
			return 1;
	return 0;
}

/* ---- CREATE_CQ (ref §4.5) -------------------------------------------------------------- */
static struct emu_devx_obj *create_cq(struct ibv_context *ctx, struct emu_nic *nic, const void *in, void *out,
				      size_t outlen)
{
	uint32_t log = (uint32_t)st_devx_get(in, ST_PRM_CQC_LOG_CQ_SIZE);
	uint32_t cc = (uint32_t)st_devx_get(in, ST_PRM_CQC_CC);
	if (st_devx_get(in, ST_PRM_CQC_CQE_SZ) != 0)
		return refuse(out, outlen, CMD_BAD_PARAM, 0x1, "CREATE_CQ", "cqe_sz other than 64 bytes");
	if (!st_devx_get(in, ST_PRM_CREATE_CQ_UMEM_VALID) || log > 22)
		return refuse(out, outlen, CMD_BAD_PARAM, 0x1, "CREATE_CQ", "no cq umem, or log_cq_size > 22");
	if (st_devx_get(in, ST_PRM_CQC_C_EQN) >= (uint64_t)ctx->num_comp_vectors)
		return refuse(out, outlen, CMD_BAD_RES, 0x4, "CREATE_CQ", "c_eqn is not an EQ of the device");
	pthread_mutex_lock(&nic->lock);
	int uar_ok = uar_page_known(nic, (uint32_t)st_devx_get(in, ST_PRM_CQC_UAR_PAGE));
	pthread_mutex_unlock(&nic->lock);
	if (!uar_ok)
		return refuse(out, outlen, CMD_BAD_RES, 0x5, "CREATE_CQ", "uar_page is not an allocated UAR");
	uint32_t n = 1u << log;
	uint8_t *buf = umem_ptr(nic, (uint32_t)st_devx_get(in, ST_PRM_CREATE_CQ_UMEM_ID),
			       st_devx_get(in, ST_PRM_CREATE_CQ_UMEM_OFFSET), (uint64_t)(cc ? 1 : n) * 64);
	uint8_t *dbr = dbr_ptr(nic, st_devx_get(in, ST_PRM_CQC_DBR_UMEM_VALID), (uint32_t)st_devx_get(in, ST_PRM_CQC_DBR_UMEM_ID),
			       st_devx_get(in, ST_PRM_CQC_DBR_ADDR));
	if (!buf || !dbr)
		return refuse(out, outlen, CMD_BAD_PARAM, 0x2, "CREATE_CQ", "ring or doorbell record outside its umem");
	struct emu_cq *cq = emu_cq_new(nic, ctx, n, buf, (volatile uint32_t *)dbr, 1);
	if (!cq) {
		errno = ENOMEM;
		return NULL;
	}
	cq->collapsed = (int)cc;
	cq->ignore_overrun = (int)st_devx_get(in, ST_PRM_CQC_OI);
	struct emu_devx_obj *o = devx_obj_new(OBJ_CQ, cq, nic, ctx, out, outlen);
	if (!o)
		return NULL;
	if (outlen >= 16)
		st_devx_set(out, ST_PRM_CREATE_CQ_OUT_CQN, cq->cqn);
	EMU_LOG("devx CREATE_CQ cqn 0x%x log_size %u cc %u oi %d%s", cq->cqn, log, cc, cq->ignore_overrun,
		emu_dma_is_device((uint64_t)(uintptr_t)buf, 64) ? " (ring in GPU memory)" : "");
	return o;
}

/* ---- CREATE_QP (ref §4.3): RC, and DCI where the HCA has DC --------------------------- */
static struct emu_devx_obj *create_qp(struct ibv_context *ctx, struct emu_nic *nic, const void *in, void *out,
				      size_t outlen)
{
	uint32_t service_type = (uint32_t)st_devx_get(in, ST_PRM_QPC_ST);
	if (service_type != ST_MLX5_QPC_ST_RC && !(service_type == ST_MLX5_QPC_ST_DCI && nic->dc_enabled))
		return refuse(out, outlen, CMD_BAD_PARAM, 0x10, "CREATE_QP",
			      service_type == ST_MLX5_QPC_ST_DCI ? "DCI on an HCA without DC (SIGMATRACE_EMU_DC=1)"
								 : "service type other than RC and DCI");
	if (!st_devx_get(in, ST_PRM_CREATE_QP_WQ_UMEM_VALID))
		return refuse(out, outlen, CMD_BAD_PARAM, 0x10, "CREATE_QP", "no wq umem (physical address lists are not emulated)");
	uint32_t log_sq = (uint32_t)st_devx_get(in, ST_PRM_QPC_LOG_SQ_SIZE);
	uint32_t rq_type = (uint32_t)st_devx_get(in, ST_PRM_QPC_RQ_TYPE);
	uint32_t log_rq = (uint32_t)st_devx_get(in, ST_PRM_QPC_LOG_RQ_SIZE);
	uint32_t rq_stride = 16u << st_devx_get(in, ST_PRM_QPC_LOG_RQ_STRIDE);
	uint64_t rq_bytes = rq_type == 0 && service_type == ST_MLX5_QPC_ST_RC ? ((uint64_t)1 << log_rq) * rq_stride : 0;
	uint32_t nbb = 1u << log_sq;
	uint32_t pdn = (uint32_t)st_devx_get(in, ST_PRM_QPC_PD);
	uint32_t page = (uint32_t)st_devx_get(in, ST_PRM_QPC_UAR_PAGE);
	uint64_t off = st_devx_get(in, ST_PRM_CREATE_QP_WQ_UMEM_OFFSET);
	uint8_t *wq = umem_ptr(nic, (uint32_t)st_devx_get(in, ST_PRM_CREATE_QP_WQ_UMEM_ID), off, rq_bytes + (uint64_t)nbb * 64);
	uint8_t *dbr = dbr_ptr(nic, st_devx_get(in, ST_PRM_QPC_DBR_UMEM_VALID), (uint32_t)st_devx_get(in, ST_PRM_QPC_DBR_UMEM_ID),
			       st_devx_get(in, ST_PRM_QPC_DBR_ADDR));
	uint32_t cqn_rcv = (uint32_t)st_devx_get(in, ST_PRM_QPC_CQN_RCV);
	struct emu_cq *scq = emu_cq_lookup(nic, (uint32_t)st_devx_get(in, ST_PRM_QPC_CQN_SND));
	struct emu_cq *rcq = emu_cq_lookup(nic, cqn_rcv);
	struct emu_srq *srq = rq_type == 1 ? emu_srq_lookup((uint32_t)st_devx_get(in, ST_PRM_QPC_SRQN)) : NULL;
	pthread_mutex_lock(&nic->lock);
	int pd_ok = emu_pd_alive(nic, pdn), uar_ok = uar_page_known(nic, page);
	pthread_mutex_unlock(&nic->lock);
	if (log_sq > 15)
		return refuse(out, outlen, CMD_BAD_PARAM, 0x11, "CREATE_QP", "log_sq_size > 15");
	if (!wq || !dbr)
		return refuse(out, outlen, CMD_BAD_PARAM, 0x11, "CREATE_QP", "WQ or doorbell record outside its umem");
	if (!pd_ok)
		return refuse(out, outlen, CMD_BAD_RES, pdn, "CREATE_QP", "pd is not an allocated protection domain");
	if (!uar_ok)
		return refuse(out, outlen, CMD_BAD_RES, page, "CREATE_QP", "uar_page is not an allocated UAR");
	if (!scq || (cqn_rcv && !rcq))
		return refuse(out, outlen, CMD_BAD_RES, 0x12, "CREATE_QP", "cqn_snd or cqn_rcv is not a CQ");
	if (rq_type == 1 && !srq)
		return refuse(out, outlen, CMD_BAD_RES, 0x13, "CREATE_QP", "rq_type SRQ with srqn not an SRQ");
	struct emu_qp *qp = emu_zalloc(sizeof *qp);
	if (!qp)
		return NULL;
	qp->devx = 1;
	qp->qp_type = service_type == ST_MLX5_QPC_ST_DCI ? EMU_QPT_DCI : IBV_QPT_RC;
	qp->rq_buf = rq_bytes ? wq : NULL;
	qp->rq_wqe_cnt = rq_bytes ? (1u << log_rq) : 0;
	qp->rq_stride = rq_stride;
	qp->sq_buf = wq + rq_bytes;
	qp->sq_wqebb = nbb;
	qp->sq_max_wqe_bb = ST_MLX5_SEND_WQE_MAX_WQEBBS;
	qp->dbrec = (volatile uint32_t *)dbr;
	qp->scq = scq;
	qp->rcq = rcq ? rcq : scq;
	qp->srq = srq;
	qp->pdn = pdn;
	qp->user_index = (uint32_t)st_devx_get(in, ST_PRM_QPC_USER_INDEX);
	qp->pm_state = (uint8_t)st_devx_get(in, ST_PRM_QPC_PM_STATE);
	qp->inflight = calloc(nbb, sizeof(struct emu_inflight));
	qp->inflight_cap = nbb;
	qp->state = IBV_QPS_RESET;
	pthread_mutex_lock(&nic->lock);
	qp->bf_off = ST_MLX5_BF_OFFSET;
	for (struct emu_uar *u = nic->uars; u; u = u->next)
		if (u->page_id == page)
			qp->uar = u->page;
	int r = qp->inflight ? emu_qp_register(nic, qp) : -1;
	pthread_mutex_unlock(&nic->lock);
	if (r) {
		free(qp->inflight);
		free(qp);
		errno = ENOMEM;
		return NULL;
	}
	qp->qpx.qp_base.context = ctx;
	qp->qpx.qp_base.qp_num = qp->qpn;
	qp->qpx.qp_base.qp_type = IBV_QPT_RC;
	struct emu_devx_obj *o = devx_obj_new(OBJ_QP, qp, nic, ctx, out, outlen);
	if (!o)
		return NULL;
	if (outlen >= 12)
		st_devx_set(out, ST_PRM_CREATE_QP_OUT_QPN, qp->qpn);
	EMU_LOG("devx CREATE_QP %s qpn 0x%x sq %u WQEBBs at %p (umem off %llu, rq %llu B%s) dbr %p uar_page %u cqn %u "
		"user_index %u", qp->qp_type == EMU_QPT_DCI ? "DCI" : "RC", qp->qpn, nbb, (void *)qp->sq_buf,
		(unsigned long long)off, (unsigned long long)rq_bytes,
		emu_dma_is_device((uint64_t)(uintptr_t)qp->sq_buf, 64) ? ", GPU memory" : "", (void *)dbr, page, scq->cqn,
		qp->user_index);
	return o;
}

/* ---- CREATE_DCT ------------------------------------------------------------------------- */
static struct emu_devx_obj *create_dct(struct ibv_context *ctx, struct emu_nic *nic, const void *in, void *out,
				       size_t outlen)
{
#define DCTC(field) st_devx_get(in, EMU_AT(EMU_DCTC_BASE_BITS, field))
	if (!nic->dc_enabled)
		return refuse(out, outlen, CMD_BAD_OP, ST_MLX5_CMD_OP_CREATE_DCT, "CREATE_DCT",
			      "the HCA has no DC (SIGMATRACE_EMU_DC=1)");
	uint32_t pdn = (uint32_t)DCTC(EMU_DCTC_PD);
	struct emu_srq *srq = emu_srq_lookup((uint32_t)DCTC(EMU_DCTC_SRQN));
	struct emu_cq *cq = emu_cq_lookup(nic, (uint32_t)DCTC(EMU_DCTC_CQN));
	pthread_mutex_lock(&nic->lock);
	int pd_ok = emu_pd_alive(nic, pdn);
	pthread_mutex_unlock(&nic->lock);
	if (!pd_ok)
		return refuse(out, outlen, CMD_BAD_RES, pdn, "CREATE_DCT", "pd is not an allocated protection domain");
	if (!srq || !cq)
		return refuse(out, outlen, CMD_BAD_RES, 0x30, "CREATE_DCT", "srqn or cqn does not exist");
	uint32_t mtu = (uint32_t)DCTC(EMU_DCTC_MTU), port = (uint32_t)DCTC(EMU_DCTC_PORT);
	if (mtu < 1 || mtu > 5 || port != 1)
		return refuse(out, outlen, CMD_BAD_PARAM, 0x31, "CREATE_DCT", "mtu not 1..5 or port not 1");
	struct emu_qp *qp = emu_dct_new(nic, ctx, srq, cq, DCTC(EMU_DCTC_DC_ACCESS_KEY), pdn, 1);
	if (!qp)
		return NULL;
	qp->qp_access = (DCTC(EMU_DCTC_RRE) ? IBV_ACCESS_REMOTE_READ : 0) | (DCTC(EMU_DCTC_RWE) ? IBV_ACCESS_REMOTE_WRITE : 0) |
			(DCTC(EMU_DCTC_RAE) ? IBV_ACCESS_REMOTE_ATOMIC : 0);
	qp->atomic_mode = (uint8_t)DCTC(EMU_DCTC_ATOMIC_MODE);
	qp->user_index = (uint32_t)DCTC(EMU_DCTC_USER_INDEX);
	qp->min_rnr_timer = (uint8_t)DCTC(EMU_DCTC_MIN_RNR_NAK);
	qp->pkey_index = (uint16_t)DCTC(EMU_DCTC_PKEY_INDEX);
	qp->counter_set_id = (uint8_t)DCTC(EMU_DCTC_COUNTER_SET_ID);
	qp->mtu = (uint8_t)mtu;
	qp->port = (uint8_t)port;
	qp->state = IBV_QPS_RTR; /* a DevX DCT is active once created */
	qp->qpx.qp_base.state = IBV_QPS_RTR;
#undef DCTC
	struct emu_devx_obj *o = devx_obj_new(OBJ_DCT, qp, nic, ctx, out, outlen);
	if (!o)
		return NULL;
	if (outlen >= 12)
		st_devx_set(out, EMU_CREATE_DCT_OUT_DCTN, qp->qpn);
	EMU_LOG("devx CREATE_DCT dctn 0x%x srq %u cq 0x%x key 0x%llx", qp->qpn, srq->srqn, cq->cqn,
		(unsigned long long)qp->dc_key);
	emu_nic_kick(nic);
	return o;
}

EXPORT struct mlx5dv_devx_obj *mlx5dv_devx_obj_create(struct ibv_context *ctx, const void *in, size_t inlen, void *out,
						      size_t outlen)
{
	if (!ctx || !in || inlen < 16) {
		errno = EINVAL;
		return NULL;
	}
	struct emu_nic *nic = emu_ctx_nic(ctx);
	uint32_t op = (uint32_t)st_devx_get(in, ST_PRM_CMD_OPCODE);
	struct emu_devx_obj *o = NULL;
	switch (op) {
	case ST_MLX5_CMD_OP_CREATE_CQ:
		if (inlen < 0x60) {
			errno = cmd_status(out, outlen, CMD_BAD_INP_LEN, 0x3);
			return NULL;
		}
		o = create_cq(ctx, nic, in, out, outlen);
		break;
	case ST_MLX5_CMD_OP_CREATE_QP:
		if (inlen < ST_PRM_CREATE_QP_IN_SIZE) {
			errno = cmd_status(out, outlen, CMD_BAD_INP_LEN, 0x4);
			return NULL;
		}
		o = create_qp(ctx, nic, in, out, outlen);
		break;
	case ST_MLX5_CMD_OP_CREATE_DCT:
		if (inlen < EMU_CREATE_DCT_IN_SIZE) {
			errno = cmd_status(out, outlen, CMD_BAD_INP_LEN, 0x5);
			return NULL;
		}
		o = create_dct(ctx, nic, in, out, outlen);
		break;
	default:
		EMU_ERR("DevX ERROR: create command 0x%x is not emulated (BAD_OP)", op);
		errno = cmd_status(out, outlen, CMD_BAD_OP, op);
		return NULL;
	}
	if (o)
		emu_nic_kick(nic);
	return (struct mlx5dv_devx_obj *)o;
}

/* ---- modify (ref §4.4) ------------------------------------------------------------------- */
/* 2RST: the producer index starts again at 0, so the first doorbells after
 * it repeat values this QP rang before.  The NIC samples the UAR (it cannot
 * trap the stores, doorbell.c), and a repeated value would look like no
 * doorbell at all: the QP's registers on its page are cleared, as is the
 * sampler's memory of them (a register another QP rang last is left alone). */
static void forget_doorbells(struct emu_nic *nic, struct emu_qp *qp)
{
	for (struct emu_uar *u = nic->uars; u; u = u->next) {
		if (u->page != qp->uar)
			continue;
		for (int r = 0; r < 4; r++) {
			uint64_t *reg = (uint64_t *)(u->page + ST_MLX5_BF_OFFSET + 0x100 * r);
			uint8_t b[8];
			uint64_t v = __atomic_load_n(reg, __ATOMIC_ACQUIRE);
			memcpy(b, &v, 8);
			if (st_mlx5_decode_db(b).qpn == qp->qpn) {
				__atomic_store_n(reg, 0, __ATOMIC_RELEASE);
				u->last[r] = 0;
			}
		}
	}
}

static int modify_dct(struct emu_devx_obj *o, uint32_t op, const void *in, void *out, size_t outlen)
{
	struct emu_qp *qp = o->object;
	if (op != EMU_CMD_OP_DRAIN_DCT)
		return cmd_status(out, outlen, CMD_BAD_OP, op);
	if (st_devx_get(in, EMU_DCT_DCTN) != qp->qpn)
		return cmd_status(out, outlen, CMD_BAD_PARAM, 0x32);
	pthread_mutex_lock(&o->nic->lock);
	qp->state = IBV_QPS_ERR; /* drained: no longer takes requests */
	qp->qpx.qp_base.state = IBV_QPS_ERR;
	pthread_mutex_unlock(&o->nic->lock);
	EMU_LOG("devx DRAIN_DCT 0x%x", qp->qpn);
	return cmd_status(out, outlen, CMD_OK, 0);
}

EXPORT int mlx5dv_devx_obj_modify(struct mlx5dv_devx_obj *obj, const void *in, size_t inlen, void *out, size_t outlen)
{
	struct emu_devx_obj *o = (struct emu_devx_obj *)obj;
	if (!o || !in || inlen < 16)
		return EINVAL;
	uint32_t op = (uint32_t)st_devx_get(in, ST_PRM_CMD_OPCODE);
	if (o->kind == OBJ_DCT)
		return modify_dct(o, op, in, out, outlen);
	if (o->kind != OBJ_QP)
		return cmd_status(out, outlen, CMD_BAD_OP, op);
	struct emu_qp *qp = o->object;
	if (st_devx_get(in, ST_PRM_MODIFY_QP_QPN) != qp->qpn)
		return cmd_status(out, outlen, CMD_BAD_PARAM, 0x20);
	if (op != ST_MLX5_CMD_OP_2ERR_QP && op != ST_MLX5_CMD_OP_2RST_QP && inlen < ST_PRM_MODIFY_QP_IN_SIZE)
		return cmd_status(out, outlen, CMD_BAD_INP_LEN, 0x21);
	int nw, need_cur = -1, dci = qp->qp_type == EMU_QPT_DCI;
	switch (op) {
	case ST_MLX5_CMD_OP_RST2INIT_QP: need_cur = IBV_QPS_RESET; nw = IBV_QPS_INIT; break;
	case ST_MLX5_CMD_OP_INIT2RTR_QP: need_cur = IBV_QPS_INIT; nw = IBV_QPS_RTR; break;
	case ST_MLX5_CMD_OP_RTR2RTS_QP: need_cur = IBV_QPS_RTR; nw = IBV_QPS_RTS; break;
	case ST_MLX5_CMD_OP_RTS2RTS_QP: need_cur = IBV_QPS_RTS; nw = IBV_QPS_RTS; break;
	case ST_MLX5_CMD_OP_2ERR_QP: nw = IBV_QPS_ERR; break;
	case ST_MLX5_CMD_OP_2RST_QP: nw = IBV_QPS_RESET; break;
	default:
		EMU_ERR("DevX ERROR: modify command 0x%x on qp 0x%x is not emulated (BAD_OP)", op, qp->qpn);
		return cmd_status(out, outlen, CMD_BAD_OP, op);
	}
	struct emu_nic *nic = o->nic;
	pthread_mutex_lock(&nic->lock);
	if (need_cur >= 0 && qp->state != need_cur) {
		EMU_ERR("DevX ERROR: modify 0x%x on qp 0x%x in state %s refused (BAD_RES_STATE)", op, qp->qpn,
			emu_state_name(qp->state));
		pthread_mutex_unlock(&nic->lock);
		return cmd_status(out, outlen, CMD_BAD_RES_STATE, 0x22);
	}
	const char *bad = NULL;
	switch (op) {
	case ST_MLX5_CMD_OP_RST2INIT_QP: {
		uint32_t port = (uint32_t)st_devx_get(in, ST_PRM_QPC_VHCA_PORT_NUM);
		if (port > 1) {
			bad = "vhca_port_num is not port 1";
			break;
		}
		qp->qp_access = (st_devx_get(in, ST_PRM_QPC_RRE) ? IBV_ACCESS_REMOTE_READ : 0) |
				(st_devx_get(in, ST_PRM_QPC_RWE) ? IBV_ACCESS_REMOTE_WRITE : 0) |
				(st_devx_get(in, ST_PRM_QPC_RAE) ? IBV_ACCESS_REMOTE_ATOMIC : 0);
		qp->atomic_mode = (uint8_t)st_devx_get(in, ST_PRM_QPC_ATOMIC_MODE);
		qp->port = (uint8_t)(port ? port : 1);
		qp->pkey_index = (uint16_t)st_devx_get(in, EMU_QPC_PKEY_INDEX);
		qp->pm_state = (uint8_t)st_devx_get(in, ST_PRM_QPC_PM_STATE);
		qp->counter_set_id = (uint8_t)st_devx_get(in, ST_PRM_QPC_COUNTER_SET_ID);
		if (dci)
			qp->dc_key = st_devx_get(in, EMU_QPC_DC_ACCESS_KEY);
		break;
	}
	case ST_MLX5_CMD_OP_INIT2RTR_QP: {
		uint32_t mtu = (uint32_t)st_devx_get(in, ST_PRM_QPC_MTU);
		if (mtu < 1 || mtu > 5) {
			bad = "mtu not 1..5 (256..4096)";
			break;
		}
		qp->mtu = (uint8_t)mtu;
		qp->log_msg_max = (uint8_t)st_devx_get(in, ST_PRM_QPC_LOG_MSG_MAX);
		qp->sl = (uint8_t)st_devx_get(in, EMU_QPC_SL);
		if (dci)
			break; /* a DCI has no remote QP: each WQE names its DCT */
		qp->log_rra_max = (uint8_t)st_devx_get(in, ST_PRM_QPC_LOG_RRA_MAX);
		qp->dest_qpn = (uint32_t)st_devx_get(in, ST_PRM_QPC_REMOTE_QPN);
		qp->dlid = (uint32_t)st_devx_get(in, ST_PRM_QPC_RLID);
		qp->is_global = (int)st_devx_get(in, ST_PRM_QPC_GRH);
		memcpy(qp->dgid, (const uint8_t *)in + ST_PRM_QPC_RGID_BYTE, 16);
		qp->rq_psn = (uint32_t)st_devx_get(in, ST_PRM_QPC_NEXT_RCV_PSN);
		qp->min_rnr_timer = (uint8_t)st_devx_get(in, ST_PRM_QPC_MIN_RNR_NAK);
		qp->peer = NULL;
		emu_resolve_peer(qp);
		break;
	}
	case ST_MLX5_CMD_OP_RTR2RTS_QP:
		qp->retry_cnt = (uint8_t)st_devx_get(in, ST_PRM_QPC_RETRY_COUNT);
		qp->rnr_retry = (uint8_t)st_devx_get(in, ST_PRM_QPC_RNR_RETRY);
		qp->sq_psn = (uint32_t)st_devx_get(in, ST_PRM_QPC_NEXT_SEND_PSN);
		qp->timeout = (uint8_t)st_devx_get(in, ST_PRM_QPC_ACK_TIMEOUT);
		qp->log_sra_max = (uint8_t)st_devx_get(in, EMU_QPC_LOG_SRA_MAX);
		qp->log_ack_req_freq = (uint8_t)st_devx_get(in, EMU_QPC_LOG_ACK_REQ_FREQ);
		break;
	case ST_MLX5_CMD_OP_2ERR_QP:
		emu_qp_to_error(qp);
		break;
	case ST_MLX5_CMD_OP_2RST_QP:
		emu_qp_reset_nic_state(qp);
		forget_doorbells(nic, qp);
		break;
	}
	if (bad) {
		EMU_ERR("DevX ERROR: modify 0x%x on qp 0x%x refused (BAD_PARAM): %s", op, qp->qpn, bad);
		pthread_mutex_unlock(&nic->lock);
		return cmd_status(out, outlen, CMD_BAD_PARAM, 0x23);
	}
	qp->state = nw;
	qp->qpx.qp_base.state = (enum ibv_qp_state)nw;
	EMU_LOG("devx qp 0x%x -> %s (remote qpn 0x%x rlid %u)", qp->qpn, emu_state_name(nw), qp->dest_qpn, qp->dlid);
	pthread_mutex_unlock(&nic->lock);
	emu_nic_kick(nic);
	return cmd_status(out, outlen, CMD_OK, 0);
}

/* ---- query ------------------------------------------------------------------------------- */
static const uint8_t qpc_state[] = { ST_MLX5_QPC_STATE_RST, ST_MLX5_QPC_STATE_INIT, ST_MLX5_QPC_STATE_RTR,
				     ST_MLX5_QPC_STATE_RTS, 7 /* SQD */, ST_MLX5_QPC_STATE_SQER, ST_MLX5_QPC_STATE_ERR };

/* query_qp_out: the qpc (at bit 0xc0 as in create_qp_in) as the emulator holds it */
static int query_qp(struct emu_qp *qp, void *out, size_t outlen)
{
	if (outlen < EMU_QUERY_QP_OUT_SIZE)
		return cmd_status(out, outlen, CMD_BAD_OUTP_LEN, 0);
	memset(out, 0, outlen);
	cmd_status(out, outlen, CMD_OK, 0);
#define Q(field, v) st_devx_set(out, field, (uint64_t)(v))
	Q(EMU_QPC_STATE, qpc_state[qp->state <= 6 ? qp->state : 6]);
	Q(ST_PRM_QPC_ST, qp->qp_type == EMU_QPT_DCI ? ST_MLX5_QPC_ST_DCI : ST_MLX5_QPC_ST_RC);
	Q(ST_PRM_QPC_PM_STATE, qp->pm_state);
	Q(ST_PRM_QPC_PD, qp->pdn);
	Q(ST_PRM_QPC_MTU, qp->mtu);
	Q(ST_PRM_QPC_LOG_MSG_MAX, qp->log_msg_max);
	Q(ST_PRM_QPC_LOG_SQ_SIZE, __builtin_ctz(qp->sq_wqebb));
	if (qp->rq_wqe_cnt) {
		Q(ST_PRM_QPC_LOG_RQ_SIZE, __builtin_ctz(qp->rq_wqe_cnt));
		Q(ST_PRM_QPC_LOG_RQ_STRIDE, __builtin_ctz(qp->rq_stride) - 4);
	}
	Q(ST_PRM_QPC_COUNTER_SET_ID, qp->counter_set_id);
	for (struct emu_uar *u = qp->nic->uars; u; u = u->next)
		if (u->page == qp->uar)
			Q(ST_PRM_QPC_UAR_PAGE, u->page_id);
	Q(ST_PRM_QPC_USER_INDEX, qp->user_index);
	Q(ST_PRM_QPC_REMOTE_QPN, qp->dest_qpn);
	Q(EMU_QPC_PKEY_INDEX, qp->pkey_index);
	Q(ST_PRM_QPC_GRH, qp->is_global);
	Q(ST_PRM_QPC_RLID, qp->dlid);
	Q(ST_PRM_QPC_ACK_TIMEOUT, qp->timeout);
	Q(EMU_QPC_SL, qp->sl);
	Q(ST_PRM_QPC_VHCA_PORT_NUM, qp->port);
	if (qp->is_global)
		memcpy((uint8_t *)out + ST_PRM_QPC_RGID_BYTE, qp->dgid, 16);
	Q(EMU_QPC_LOG_ACK_REQ_FREQ, qp->log_ack_req_freq);
	Q(EMU_QPC_LOG_SRA_MAX, qp->log_sra_max);
	Q(ST_PRM_QPC_RETRY_COUNT, qp->retry_cnt);
	Q(ST_PRM_QPC_RNR_RETRY, qp->rnr_retry);
	Q(ST_PRM_QPC_NEXT_SEND_PSN, qp->sq_psn);
	Q(ST_PRM_QPC_CQN_SND, qp->scq ? qp->scq->cqn : 0);
	Q(ST_PRM_QPC_LOG_RRA_MAX, qp->log_rra_max);
	Q(ST_PRM_QPC_ATOMIC_MODE, qp->atomic_mode);
	Q(ST_PRM_QPC_RRE, !!(qp->qp_access & IBV_ACCESS_REMOTE_READ));
	Q(ST_PRM_QPC_RWE, !!(qp->qp_access & IBV_ACCESS_REMOTE_WRITE));
	Q(ST_PRM_QPC_RAE, !!(qp->qp_access & IBV_ACCESS_REMOTE_ATOMIC));
	Q(ST_PRM_QPC_MIN_RNR_NAK, qp->min_rnr_timer);
	Q(ST_PRM_QPC_NEXT_RCV_PSN, qp->rq_psn);
	Q(ST_PRM_QPC_CQN_RCV, qp->rcq ? qp->rcq->cqn : 0);
	Q(ST_PRM_QPC_RQ_TYPE, qp->srq ? 1 : qp->rq_wqe_cnt ? 0 : 3);
	Q(ST_PRM_QPC_SRQN, qp->srq ? qp->srq->srqn : 0);
	Q(EMU_QPC_HW_SQ_WQEBB_COUNTER, qp->sq_exec & 0xffff);   /* WQEBBs the NIC executed */
	Q(EMU_QPC_SW_SQ_WQEBB_COUNTER, qp->sq_announced & 0xffff); /* WQEBBs doorbells announced */
	if (qp->qp_type == EMU_QPT_DCI)
		Q(EMU_QPC_DC_ACCESS_KEY, qp->dc_key);
#undef Q
	return 0;
}

/* query_dct_out: the dctc at bit 0x80 */
static int query_dct(struct emu_qp *qp, void *out, size_t outlen)
{
	if (outlen < EMU_QUERY_DCT_OUT_SIZE)
		return cmd_status(out, outlen, CMD_BAD_OUTP_LEN, 0);
	memset(out, 0, outlen);
	cmd_status(out, outlen, CMD_OK, 0);
#define D(field, v) st_devx_set(out, EMU_AT(EMU_DCTC_BASE_BITS, field), (uint64_t)(v))
	D(EMU_DCTC_STATE, qp->state == IBV_QPS_ERR ? EMU_DCTC_STATE_DRAINED : EMU_DCTC_STATE_ACTIVE);
	D(EMU_DCTC_USER_INDEX, qp->user_index);
	D(EMU_DCTC_CQN, qp->rcq ? qp->rcq->cqn : 0);
	D(EMU_DCTC_COUNTER_SET_ID, qp->counter_set_id);
	D(EMU_DCTC_ATOMIC_MODE, qp->atomic_mode);
	D(EMU_DCTC_RRE, !!(qp->qp_access & IBV_ACCESS_REMOTE_READ));
	D(EMU_DCTC_RWE, !!(qp->qp_access & IBV_ACCESS_REMOTE_WRITE));
	D(EMU_DCTC_RAE, !!(qp->qp_access & IBV_ACCESS_REMOTE_ATOMIC));
	D(EMU_DCTC_MIN_RNR_NAK, qp->min_rnr_timer);
	D(EMU_DCTC_SRQN, qp->srq ? qp->srq->srqn : 0);
	D(EMU_DCTC_PD, qp->pdn);
	D(EMU_DCTC_DC_ACCESS_KEY, qp->dc_key);
	D(EMU_DCTC_MTU, qp->mtu);
	D(EMU_DCTC_PORT, qp->port);
	D(EMU_DCTC_PKEY_INDEX, qp->pkey_index);
#undef D
	return 0;
}

EXPORT int mlx5dv_devx_obj_query(struct mlx5dv_devx_obj *obj, const void *in, size_t inlen, void *out, size_t outlen)
{
	struct emu_devx_obj *o = (struct emu_devx_obj *)obj;
	if (!o || !in || inlen < 8 || !out)
		return EINVAL;
	uint32_t op = (uint32_t)st_devx_get(in, ST_PRM_CMD_OPCODE);
	struct emu_qp *qp = o->object;
	int r;
	pthread_mutex_lock(&o->nic->lock);
	if (op == ST_MLX5_CMD_OP_QUERY_QP && o->kind == OBJ_QP)
		r = st_devx_get(in, ST_PRM_MODIFY_QP_QPN) == qp->qpn ? query_qp(qp, out, outlen)
								      : cmd_status(out, outlen, CMD_BAD_PARAM, 0x24);
	else if (op == EMU_CMD_OP_QUERY_DCT && o->kind == OBJ_DCT)
		r = st_devx_get(in, EMU_DCT_DCTN) == qp->qpn ? query_dct(qp, out, outlen)
							      : cmd_status(out, outlen, CMD_BAD_PARAM, 0x33);
	else
		r = cmd_status(out, outlen, CMD_BAD_OP, op);
	pthread_mutex_unlock(&o->nic->lock);
	return r;
}

EXPORT int mlx5dv_devx_obj_destroy(struct mlx5dv_devx_obj *obj)
{
	struct emu_devx_obj *o = (struct emu_devx_obj *)obj;
	if (!o)
		return EINVAL;
	struct emu_nic *nic = o->nic;
	if (o->kind == OBJ_CQ) {
		pthread_mutex_lock(&nic->lock);
		for (int i = 0; i < nic->nq; i++)
			if (nic->qlist[i]->scq == o->object || nic->qlist[i]->rcq == o->object) {
				pthread_mutex_unlock(&nic->lock);
				return EBUSY;
			}
		pthread_mutex_unlock(&nic->lock);
	}
	devx_obj_release(o);
	free(o);
	return 0;
}

EXPORT int mlx5dv_devx_qp_query(struct ibv_qp *qp, const void *in, size_t inlen, void *out, size_t outlen)
{ return EOPNOTSUPP; }
EXPORT int mlx5dv_devx_qp_modify(struct ibv_qp *qp, const void *in, size_t inlen, void *out, size_t outlen)
{ return EOPNOTSUPP; }
EXPORT int mlx5dv_devx_cq_query(struct ibv_cq *cq, const void *in, size_t inlen, void *out, size_t outlen)
{ return EOPNOTSUPP; }
EXPORT int mlx5dv_devx_cq_modify(struct ibv_cq *cq, const void *in, size_t inlen, void *out, size_t outlen)
{ return EOPNOTSUPP; }
