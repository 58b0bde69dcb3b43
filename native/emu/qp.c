/* libibverbs.so.1 of the emulated HCA: QP create, modify (the IB state
 * machine), query and destroy.  A verbs QP owns its WQ buffer, doorbell
 * record and a UAR page (or a share of one, SIGMATRACE_EMU_BFREG). */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "emu_internal.h"
#include "emu_prm.h"

/* A QP that could not be made: its buffers go back, ENOMEM. */
static struct ibv_qp *qp_unmade(struct emu_qp *qp)
{
	emu_ring_free(&qp->qbuf, &qp->dbuf, qp->qp_buf);
	free(qp->sq_wrid); free(qp->sq_next); free(qp->rq_wrid); free(qp->inflight); free(qp);
	errno = ENOMEM;
	return NULL;
}

static struct ibv_qp *create_qp_common(struct ibv_context *c, struct ibv_pd *pd, struct ibv_qp_init_attr *ia,
				       uint64_t send_ops)
{
	struct emu_nic *nic = to_ectx(c)->nic;
	if (ia->qp_type != IBV_QPT_RC && ia->qp_type != IBV_QPT_UC && ia->qp_type != IBV_QPT_UD) {
		errno = EOPNOTSUPP; /* XRC/RAW/DRIVER (DC) are not emulated */
		return NULL;
	}
	if (!ia->send_cq || (!ia->recv_cq && !ia->srq) || ia->cap.max_send_wr > 16384 || ia->cap.max_recv_wr > 32768 ||
	    ia->cap.max_send_sge > EMU_MAX_SGE - 2 || ia->cap.max_recv_sge > EMU_MAX_SGE - 2 ||
	    ia->cap.max_inline_data > EMU_MAX_INLINE) {
		errno = EINVAL;
		return NULL;
	}
	struct emu_qp *qp = emu_zalloc(sizeof *qp);
	if (!qp)
		return NULL;
	/* send WQE size: ctrl + raddr (UD: ctrl + datagram segment) +
	 * max(sges, inline, atomic) (ref §1) */
	uint32_t hdr = ia->qp_type == IBV_QPT_UD ? 16 + (uint32_t)sizeof(struct mlx5_wqe_av) : 32;
	uint32_t sge_bytes = hdr + 16 * (ia->cap.max_send_sge ? ia->cap.max_send_sge : 1);
	uint32_t inl_bytes = hdr + ((4 + ia->cap.max_inline_data + 15) & ~15u);
	uint32_t wqe = sge_bytes > inl_bytes ? sge_bytes : inl_bytes;
	if (wqe < 64)
		wqe = 64;
	wqe = (wqe + 63) & ~63u;
	qp->sq_max_wqe_bb = wqe / 64;
	qp->max_inline = wqe - hdr - 4;
	if (qp->max_inline > EMU_MAX_INLINE)
		qp->max_inline = EMU_MAX_INLINE;
	qp->max_send_sge = (wqe - hdr) / 16;
	if (qp->max_send_sge > EMU_MAX_SGE - 2)
		qp->max_send_sge = EMU_MAX_SGE - 2;
	uint32_t swr = ia->cap.max_send_wr ? ia->cap.max_send_wr : 1;
	qp->sq_wqebb = roundup_pow2(swr * qp->sq_max_wqe_bb);
	qp->max_send_wr = qp->sq_wqebb / qp->sq_max_wqe_bb;
	size_t rq_bytes = 0;
	if (!ia->srq) {
		uint32_t rsge = ia->cap.max_recv_sge ? ia->cap.max_recv_sge : 1;
		qp->rq_stride = roundup_pow2(rsge * 16);
		qp->rq_max_sge = qp->rq_stride / 16;
		qp->rq_wqe_cnt = roundup_pow2(ia->cap.max_recv_wr ? ia->cap.max_recv_wr : 1);
		qp->max_recv_wr = qp->rq_wqe_cnt;
		rq_bytes = (size_t)qp->rq_wqe_cnt * qp->rq_stride;
		rq_bytes = (rq_bytes + 63) & ~(size_t)63;
	}
	size_t sq_bytes = (size_t)qp->sq_wqebb * 64;
	/* on a parent domain with allocators the ring and the doorbell record are
	 * the application's (pd.c); else the emulator's */
	int from_pd = emu_pd_of(pd) != (struct emu_pd *)pd;
	qp->qp_buf = emu_ring_alloc(&qp->qbuf, &qp->dbuf, pd, rq_bytes + sq_bytes, MLX5DV_RES_TYPE_QP);
	qp->sq_wrid = calloc(qp->sq_wqebb, sizeof(uint64_t));
	qp->sq_next = calloc(qp->sq_wqebb, sizeof(uint32_t));
	qp->rq_wrid = qp->rq_wqe_cnt ? calloc(qp->rq_wqe_cnt, sizeof(uint64_t)) : NULL;
	qp->inflight = calloc(qp->sq_wqebb, sizeof(struct emu_inflight));
	if (!qp->qp_buf || !qp->sq_wrid || !qp->sq_next || !qp->inflight || (qp->rq_wqe_cnt && !qp->rq_wrid)) {
		return qp_unmade(qp);
	}
	memset(qp->qp_buf, 0, rq_bytes + sq_bytes);
	qp->own_bufs = !from_pd;
	qp->pdn = emu_pd_num(pd);
	qp->rq_buf = qp->qp_buf;            /* RQ at offset 0, SQ after it (ref §1.1) */
	qp->sq_buf = qp->qp_buf + rq_bytes;
	qp->inflight_cap = qp->sq_wqebb;
	qp->dbrec = (volatile uint32_t *)(from_pd ? qp->dbuf.ptr : qp->dbr_storage);
	pthread_spin_init(&qp->sq_lock, PTHREAD_PROCESS_PRIVATE);
	pthread_spin_init(&qp->rq_lock, PTHREAD_PROCESS_PRIVATE);
	qp->scq = to_ecq(ia->send_cq);
	qp->rcq = ia->recv_cq ? to_ecq(ia->recv_cq) : NULL;
	qp->srq = ia->srq ? (struct emu_srq *)ia->srq : NULL;
	qp->sq_sig_all = ia->sq_sig_all;
	qp->qp_type = ia->qp_type;
	qp->state = IBV_QPS_RESET;
	pthread_mutex_lock(&nic->lock);
	qp->bf_off = ST_MLX5_BF_OFFSET;
	if (nic->bfreg_share) {
		/* a page shared like rdma-core's bfregs: polled (devx), with doorbell
		 * record recovery when two QPs' doorbells meet in one sample */
		if (!nic->shared_uar || (nic->bfreg_share == 1 && nic->shared_n == 2)) {
			nic->shared_uar = emu_uar_alloc(nic, 1);
			nic->shared_n = 0;
		} else {
			nic->shared_uar->refs++;
		}
		qp->uarobj = nic->shared_uar;
		if (nic->bfreg_share == 1)
			qp->bf_off += 0x200 * (uint32_t)nic->shared_n;
		nic->shared_n++;
	} else {
		qp->uarobj = emu_uar_alloc(nic, 0);
	}
	int r = qp->uarobj ? emu_qp_register(nic, qp) : -1;
	if (r && qp->uarobj && --qp->uarobj->refs == 0) { /* not registered: its share of the page goes */
		if (nic->shared_uar == qp->uarobj)
			nic->shared_uar = NULL;
		emu_uar_free(nic, qp->uarobj);
	}
	pthread_mutex_unlock(&nic->lock);
	if (r) {
		return qp_unmade(qp);
	}
	qp->uar = qp->uarobj->page;
	qp->atomic_mode = EMU_QPC_ATOMIC_MODE_UP_TO_8B; /* what the kernel gives a verbs RC QP: not checked for verbs */
	struct ibv_qp *b = &qp->qpx.qp_base;
	b->context = c;
	b->qp_context = ia->qp_context;
	b->pd = pd;
	b->send_cq = ia->send_cq;
	b->recv_cq = ia->recv_cq;
	b->srq = ia->srq;
	b->handle = qp->qpn;
	b->qp_num = qp->qpn;
	b->state = IBV_QPS_RESET;
	b->qp_type = ia->qp_type;
	pthread_mutex_init(&b->mutex, NULL);
	pthread_cond_init(&b->cond, NULL);
	qp->qpx.comp_mask = 0;
	emu_qp_init_ex_ops(qp);
	ia->cap.max_send_wr = qp->max_send_wr;
	ia->cap.max_send_sge = qp->max_send_sge;
	ia->cap.max_inline_data = qp->max_inline;
	if (!ia->srq) {
		ia->cap.max_recv_wr = qp->max_recv_wr;
		ia->cap.max_recv_sge = qp->rq_max_sge;
	}
	EMU_LOG("create qp 0x%x sq %u WQEBBs (max wqe %u BB, inline %u) rq %u x %u B", qp->qpn, qp->sq_wqebb,
		qp->sq_max_wqe_bb, qp->max_inline, qp->rq_wqe_cnt, qp->rq_stride);
	return b;
}

EXPORT struct ibv_qp *ibv_create_qp(struct ibv_pd *pd, struct ibv_qp_init_attr *ia)
{
	return create_qp_common(pd->context, pd, ia, 0);
}

struct ibv_qp *emu_create_qp_ex(struct ibv_context *c, struct ibv_qp_init_attr_ex *a)
{
	if (!(a->comp_mask & IBV_QP_INIT_ATTR_PD) || !a->pd) {
		errno = EINVAL;
		return NULL;
	}
	if (a->comp_mask & ~(uint32_t)(IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS |
				       IBV_QP_INIT_ATTR_CREATE_FLAGS)) {
		errno = EOPNOTSUPP;
		return NULL;
	}
	if ((a->comp_mask & IBV_QP_INIT_ATTR_CREATE_FLAGS) && a->create_flags) {
		errno = EOPNOTSUPP;
		return NULL;
	}
	struct ibv_qp_init_attr ia;
	memset(&ia, 0, sizeof ia);
	ia.qp_context = a->qp_context;
	ia.send_cq = a->send_cq;
	ia.recv_cq = a->recv_cq;
	ia.srq = a->srq;
	ia.cap = a->cap;
	ia.qp_type = a->qp_type;
	ia.sq_sig_all = a->sq_sig_all;
	struct ibv_qp *q = create_qp_common(c, a->pd, &ia, a->send_ops_flags);
	if (q) {
		a->cap = ia.cap;
		if (a->comp_mask & IBV_QP_INIT_ATTR_SEND_OPS_FLAGS)
			to_eqp(q)->qpx.comp_mask = 0;
	}
	return q;
}

EXPORT int ibv_destroy_qp(struct ibv_qp *ibqp)
{
	struct emu_qp *qp = to_eqp(ibqp);
	struct emu_nic *nic = qp->nic;
	pthread_mutex_lock(&nic->lock);
	emu_qp_unregister(nic, qp);
	uint32_t reported = qp->async_reported;
	emu_cq_clean(qp->rcq, qp->qpn, qp->srq);
	if (qp->scq != qp->rcq)
		emu_cq_clean(qp->scq, qp->qpn, NULL);
	if (qp->uarobj && --qp->uarobj->refs == 0) {
		if (nic->shared_uar == qp->uarobj)
			nic->shared_uar = NULL;
		emu_uar_free(nic, qp->uarobj);
	}
	pthread_mutex_unlock(&nic->lock);
	emu_qp_wait_async_acks(qp, reported); /* async.c: no longer reported, so the count is final */
	if (qp->own_bufs)
		free(qp->qp_buf);
	emu_buf_free(&qp->qbuf);
	emu_buf_free(&qp->dbuf);
	free(qp->sq_wrid);
	free(qp->sq_next);
	free(qp->rq_wrid);
	free(qp->inflight);
	free(qp);
	return 0;
}

EXPORT const char *emu_state_name(int s)
{
	static const char *n[] = { "RESET", "INIT", "RTR", "RTS", "SQD", "SQE", "ERR" };
	return s >= 0 && s <= 6 ? n[s] : "?";
}

/* Valid transitions (IB spec QP state machine, as the kernel enforces). */
EXPORT int emu_qp_modify_state(struct emu_qp *qp, int cur, int nw)
{
	if (nw == IBV_QPS_RESET || nw == IBV_QPS_ERR)
		return 0;
	switch (cur) {
	case IBV_QPS_RESET: return nw == IBV_QPS_INIT ? 0 : EINVAL;
	case IBV_QPS_INIT: return (nw == IBV_QPS_INIT || nw == IBV_QPS_RTR) ? 0 : EINVAL;
	case IBV_QPS_RTR: return nw == IBV_QPS_RTS ? 0 : EINVAL;
	case IBV_QPS_RTS: return (nw == IBV_QPS_RTS || nw == IBV_QPS_SQD) ? 0 : EINVAL;
	case IBV_QPS_SQD: return (nw == IBV_QPS_RTS || nw == IBV_QPS_SQD) ? 0 : EINVAL;
	case IBV_QPS_SQE: return nw == IBV_QPS_RTS ? 0 : EINVAL;
	default: return EINVAL;
	}
}

EXPORT void emu_qp_apply_reset(struct emu_qp *qp)
{
	emu_qp_reset_nic_state(qp);
	qp->sq_pi = qp->sq_tail = qp->sq_rung = 0;
	qp->rq_pi = qp->rq_tail = 0;
	qp->db_seen = 0;
	for (int i = 0; i < EMU_BF_SNAPS; i++)
		qp->bf_snap[i].valid = 0;
	if (qp->dbrec) {
		qp->dbrec[0] = 0;
		qp->dbrec[1] = 0;
	}
	if (qp->uarobj && !qp->uarobj->devx) {
		memset(qp->uar + ST_MLX5_BF_OFFSET, 0, 8);
		qp->uarobj->last[0] = 0;
	}
}

/* The attributes that ibv_modify_qp keeps as given and ibv_query_qp returns:
 * X(mask bit, field of struct emu_qp, field of struct ibv_qp_attr). */
#define EMU_QP_KEPT_ATTRS(X)                                  \
	X(IBV_QP_ACCESS_FLAGS, qp_access, qp_access_flags)    \
	X(IBV_QP_PORT, port, port_num)                        \
	X(IBV_QP_PATH_MTU, mtu, path_mtu)                     \
	X(IBV_QP_DEST_QPN, dest_qpn, dest_qp_num)             \
	X(IBV_QP_RQ_PSN, rq_psn, rq_psn)                      \
	X(IBV_QP_SQ_PSN, sq_psn, sq_psn)                      \
	X(IBV_QP_TIMEOUT, timeout, timeout)                   \
	X(IBV_QP_RETRY_CNT, retry_cnt, retry_cnt)             \
	X(IBV_QP_RNR_RETRY, rnr_retry, rnr_retry)             \
	X(IBV_QP_MIN_RNR_TIMER, min_rnr_timer, min_rnr_timer) \
	X(IBV_QP_QKEY, qkey, qkey)

EXPORT int ibv_modify_qp(struct ibv_qp *ibqp, struct ibv_qp_attr *attr, int mask)
{
	struct emu_qp *qp = to_eqp(ibqp);
	struct emu_nic *nic = qp->nic;
	if (qp->qp_type == EMU_QPT_DCT)
		return emu_dct_modify(qp, attr, mask); /* dct.c */
	pthread_mutex_lock(&nic->lock);
	int cur = (mask & IBV_QP_CUR_STATE) ? (int)attr->cur_qp_state : qp->state;
	int nw = (mask & IBV_QP_STATE) ? (int)attr->qp_state : cur;
	int err = emu_qp_modify_state(qp, cur, nw);
	if (!err && (mask & IBV_QP_STATE)) {
		int rc = ibqp->qp_type == IBV_QPT_RC;
		int need = 0;
		if (ibqp->qp_type == IBV_QPT_UD) {
			/* UD: no path, no remote QP (IB spec; rdma-core/kernel masks) */
			if (cur == IBV_QPS_RESET && nw == IBV_QPS_INIT)
				need = IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_QKEY;
			else if (cur == IBV_QPS_RTR && nw == IBV_QPS_RTS)
				need = IBV_QP_SQ_PSN;
		} else if (cur == IBV_QPS_RESET && nw == IBV_QPS_INIT)
			need = IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS;
		else if (cur == IBV_QPS_INIT && nw == IBV_QPS_RTR)
			need = IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
			       (rc ? IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER : 0);
		else if (cur == IBV_QPS_RTR && nw == IBV_QPS_RTS)
			need = IBV_QP_SQ_PSN | (rc ? IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
						     IBV_QP_MAX_QP_RD_ATOMIC : 0);
		if ((mask & need) != need)
			err = EINVAL;
	}
	if (!err && (mask & IBV_QP_PORT) && attr->port_num != 1)
		err = EINVAL;
	if (err) {
		EMU_LOG("modify qp 0x%x %s->%s rejected (mask 0x%x)", qp->qpn, emu_state_name(cur), emu_state_name(nw), mask);
		pthread_mutex_unlock(&nic->lock);
		return err;
	}
#define KEEP_ATTR(bit, ours, theirs) \
	if (mask & (bit))            \
		qp->ours = attr->theirs;
	EMU_QP_KEPT_ATTRS(KEEP_ATTR)
#undef KEEP_ATTR
	if (mask & IBV_QP_AV) {
		qp->dlid = attr->ah_attr.dlid;
		qp->is_global = attr->ah_attr.is_global;
		memcpy(qp->dgid, attr->ah_attr.grh.dgid.raw, 16);
		qp->peer = NULL;
	}
	if (mask & IBV_QP_STATE) {
		if (nw == IBV_QPS_RESET) {
			emu_qp_apply_reset(qp);
			emu_cq_clean(qp->rcq, qp->qpn, qp->srq);
			if (qp->scq != qp->rcq)
				emu_cq_clean(qp->scq, qp->qpn, NULL);
		} else if (nw == IBV_QPS_ERR) {
			emu_qp_to_error(qp);
		} else if (nw == IBV_QPS_RTR && ibqp->qp_type != IBV_QPT_UD) {
			emu_resolve_peer(qp);
		}
		qp->state = nw;
		ibqp->state = (enum ibv_qp_state)nw;
		EMU_LOG("qp 0x%x -> %s (dest qpn 0x%x dlid %u)", qp->qpn, emu_state_name(nw), qp->dest_qpn, qp->dlid);
	}
	pthread_mutex_unlock(&nic->lock);
	emu_nic_kick(nic);
	return 0;
}

EXPORT int ibv_query_qp(struct ibv_qp *ibqp, struct ibv_qp_attr *attr, int mask, struct ibv_qp_init_attr *init)
{
	struct emu_qp *qp = to_eqp(ibqp);
	memset(attr, 0, sizeof *attr);
	attr->qp_state = (enum ibv_qp_state)qp->state;
	attr->cur_qp_state = attr->qp_state;
#define RETURN_ATTR(bit, ours, theirs) attr->theirs = qp->ours;
	EMU_QP_KEPT_ATTRS(RETURN_ATTR)
#undef RETURN_ATTR
	attr->port_num = qp->port ? qp->port : 1; /* a QP never given a port is on port 1 */
	attr->ah_attr.dlid = (uint16_t)qp->dlid;
	attr->ah_attr.is_global = (uint8_t)qp->is_global;
	memcpy(attr->ah_attr.grh.dgid.raw, qp->dgid, 16);
	attr->ah_attr.port_num = attr->port_num;
	attr->max_rd_atomic = 16;
	attr->max_dest_rd_atomic = 16;
	attr->cap.max_send_wr = qp->max_send_wr;
	attr->cap.max_send_sge = qp->max_send_sge;
	attr->cap.max_inline_data = qp->max_inline;
	attr->cap.max_recv_wr = qp->max_recv_wr;
	attr->cap.max_recv_sge = qp->rq_max_sge;
	if (init) {
		memset(init, 0, sizeof *init);
		init->qp_context = ibqp->qp_context;
		init->send_cq = ibqp->send_cq;
		init->recv_cq = ibqp->recv_cq;
		init->srq = ibqp->srq;
		init->cap = attr->cap;
		init->qp_type = ibqp->qp_type;
		init->sq_sig_all = qp->sq_sig_all;
	}
	return 0;
}

EXPORT int ibv_query_qp_data_in_order(struct ibv_qp *qp, enum ibv_wr_opcode op, uint32_t flags) { return 0; }
