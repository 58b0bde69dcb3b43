/* The emulated NIC's responder: it checks and executes the requests that
 * arrive in the inbox (SEND into receive WQEs, WRITE, READ, atomics),
 * answers them, and parks the requests a QP cannot take yet (no receive
 * WQE, not yet RTR). */
#include <stdlib.h>
#include <string.h>

#include "emu_internal.h"
#include "emu_prm.h"

/* Drop the requests still queued for a QP (destroy, error flush, reset). */
void emu_free_pending(struct emu_qp *qp)
{
	struct emu_pending *p = qp->pend;
	while (p) {
		struct emu_pending *n = p->next;
		free(p);
		p = n;
	}
	qp->pend = qp->pend_tail = NULL;
}

/* ---- responder -------------------------------------------------------------- */
/* The header of every answer to req: it goes back to the requesting QP with
 * the request's sequence number, which the requester matches (inflight_find). */
static void answer_header(struct emu_pkt *h, struct emu_nic *nic, const struct emu_pkt *req, uint16_t type,
			  uint32_t my_qpn)
{
	memset(h, 0, sizeof *h);
	h->type = type;
	h->dst_qpn = req->src_qpn;
	h->src_qpn = my_qpn;
	h->src_lid = nic->lid;
	h->seq = req->seq;
}

static void respond(struct emu_nic *nic, const struct emu_pkt *req, uint16_t type, uint32_t syndrome,
		    uint32_t my_qpn)
{
	struct emu_node *n = emu_node_by_lid(nic, req->src_lid);
	if (!n)
		return;
	struct emu_pkt h;
	answer_header(&h, nic, req, type, my_qpn);
	h.syndrome = syndrome;
	h.flags = PF_FIRST | PF_LAST;
	emu_node_send(n, &h, NULL, 0, 0);
}

static int check_remote(struct emu_nic *nic, struct emu_qp *qp, uint32_t rkey, uint64_t addr, uint64_t len, int access)
{
	struct emu_mr *m = emu_mr_lookup(nic, rkey);
	if (!m || !(m->access & access) || !(qp->qp_access & access))
		return -1;
	if (addr < m->addr || addr + len > m->addr + m->len || addr + len < addr)
		return -1;
	return 0;
}

/* Take the next receive WQE: returns 0 and its index, or -1 (RNR). */
static void count_recv(struct emu_qp *qp)
{
	if (qp->nic && qp->nic->stats)
		__atomic_fetch_add(&qp->nic->stats->recvs_consumed, 1, __ATOMIC_RELAXED);
}

static int take_recv(struct emu_qp *qp, uint32_t *wqe, int *from_srq)
{
	if (qp->srq) {
		if (emu_srq_take(qp->srq, wqe))
			return -1;
		*from_srq = 1;
		count_recv(qp);
		return 0;
	}
	if (!qp->rq_wqe_cnt)
		return -1;
	uint32_t prod = emu_dma_load_be32(&qp->dbrec[ST_MLX5_RCV_DBR]) & 0xffff;
	if ((uint16_t)(prod - qp->rq_ci) == 0)
		return -1;
	*wqe = qp->rq_ci++;
	*from_srq = 0;
	count_recv(qp);
	return 0;
}

/* Scatter into receive WQE; returns 0, or a syndrome. */
static int scatter_recv(struct emu_nic *nic, struct emu_qp *qp, uint32_t wqe, int from_srq,
			uint32_t off, const uint8_t *src, uint32_t len, uint32_t total)
{
	const uint8_t *ring;
	uint32_t nseg;
	if (from_srq) { /* SRQ WQE: next segment, then data segments */
		ring = qp->srq->buf + (size_t)(wqe & (qp->srq->wqe_cnt - 1)) * qp->srq->stride + 16;
		nseg = (qp->srq->stride - 16) / 16;
	} else {
		ring = qp->rq_buf + (size_t)(wqe & (qp->rq_wqe_cnt - 1)) * qp->rq_stride;
		nseg = qp->rq_stride / 16;
	}
	uint8_t wq[16 * EMU_MAX_SGE];
	if (nseg > EMU_MAX_SGE)
		nseg = EMU_MAX_SGE;
	if (emu_dma_read(wq, (uint64_t)(uintptr_t)ring, 16 * nseg)) /* the ring may be GPU memory (dma.c) */
		return ST_MLX5_CQE_SYNDROME_LOCAL_PROT_ERR;
	uint64_t cap = 0;
	for (uint32_t i = 0; i < nseg; i++) {
		const struct st_mlx5_wqe_data_seg *d = (const void *)(wq + 16 * i);
		if (be32toh(d->lkey) == ST_MLX5_INVALID_LKEY)
			break;
		cap += be32toh(d->byte_count);
	}
	if (total > cap)
		return ST_MLX5_CQE_SYNDROME_LOCAL_LENGTH_ERR;
	for (uint32_t i = 0; i < nseg && len; i++) {
		const struct st_mlx5_wqe_data_seg *d = (const void *)(wq + 16 * i);
		uint32_t lkey = be32toh(d->lkey), bl = be32toh(d->byte_count);
		if (lkey == ST_MLX5_INVALID_LKEY)
			break;
		if (off >= bl) {
			off -= bl;
			continue;
		}
		uint32_t n = bl - off;
		if (n > len)
			n = len;
		uint64_t addr = be64toh(d->addr) + off;
		if (emu_check_local(nic, lkey, addr, n, 1) || emu_dma_write(addr, src, n))
			return ST_MLX5_CQE_SYNDROME_LOCAL_PROT_ERR;
		src += n;
		len -= n;
		off = 0;
	}
	return 0;
}

static void cqe_resp(struct emu_qp *qp, uint8_t cqe_op, uint32_t wqe, int from_srq, const struct emu_pkt *p)
{
	struct emu_cq *cq = qp->rcq;
	if (!cq)
		return;
	struct st_mlx5_cqe64 c;
	memset(&c, 0, sizeof c);
	c.byte_cnt = htobe32(p->total);
	c.imm_inval_pkey = p->imm;
	c.sop_drop_qpn = htobe32(qp->qpn);
	c.flags_rqpn = htobe32(p->src_qpn & 0xffffff);
	c.slid = htobe16((uint16_t)p->src_lid);
	c.wqe_counter = htobe16((uint16_t)wqe);
	c.srqn_uidx = from_srq ? htobe32(qp->srq->srqn) : 0;
	c.op_own = (uint8_t)((cqe_op << 4) | ((p->flags & 0x10) ? 2 : 0));
	emu_cq_write(cq, &c);
}

static int qp_accepts(struct emu_qp *qp);

/* returns 1 if the packet must wait (RNR / QP not ready) */
static int responder_rx(struct emu_nic *nic, struct emu_qp *qp, const struct emu_pkt *p)
{
	uint32_t seqtag = p->seq + 1;
	switch (p->type) {
	case PKT_SEND:
	case PKT_WRITE: {
		int is_send = p->type == PKT_SEND;
		if (qp->resp_err == seqtag)
			return 0; /* rest of a failed message */
		if (!is_send) {
			if (p->len && check_remote(nic, qp, p->rkey, p->raddr, p->len, IBV_ACCESS_REMOTE_WRITE)) {
				qp->resp_err = seqtag;
				respond(nic, p, PKT_NAK, ST_MLX5_CQE_SYNDROME_REMOTE_ACCESS_ERR, qp->qpn);
				return 0;
			}
			if ((p->flags & PF_LAST) && (p->flags & PF_IMM)) {
				uint32_t wqe;
				int srq;
				if (take_recv(qp, &wqe, &srq))
					return 1;
				if (p->len)
					emu_dma_write(p->raddr, p->payload, p->len);
				struct emu_pkt tmp = *p;
				cqe_resp(qp, ST_MLX5_CQE_RESP_WR_IMM, wqe, srq, &tmp);
				respond(nic, p, PKT_ACK, 0, qp->qpn);
				return 0;
			}
			if (p->len)
				emu_dma_write(p->raddr, p->payload, p->len);
			if (p->flags & PF_LAST)
				respond(nic, p, PKT_ACK, 0, qp->qpn);
			return 0;
		}
		if (p->flags & PF_FIRST) {
			if (take_recv(qp, &qp->resp_wqe, &qp->resp_from_srq))
				return 1;
			qp->resp_active = 1;
		} else if (!qp->resp_active) {
			return 0;
		}
		int syn = scatter_recv(nic, qp, qp->resp_wqe, qp->resp_from_srq, p->offset, p->payload, p->len, p->total);
		if (syn) {
			qp->resp_err = seqtag;
			qp->resp_active = 0;
			emu_cqe_err(qp->rcq, qp, 1, (uint16_t)qp->resp_wqe, 0, (uint8_t)syn);
			respond(nic, p, PKT_NAK, syn == ST_MLX5_CQE_SYNDROME_LOCAL_LENGTH_ERR ?
				ST_MLX5_CQE_SYNDROME_REMOTE_INVAL_REQ_ERR : ST_MLX5_CQE_SYNDROME_REMOTE_OP_ERR, qp->qpn);
			emu_qp_to_error(qp);
			return 0;
		}
		if (p->flags & PF_LAST) {
			qp->resp_active = 0;
			uint8_t op = (p->flags & PF_IMM) ? ST_MLX5_CQE_RESP_SEND_IMM :
				     (p->flags & PF_INV) ? ST_MLX5_CQE_RESP_SEND_INV : ST_MLX5_CQE_RESP_SEND;
			cqe_resp(qp, op, qp->resp_wqe, qp->resp_from_srq, p);
			respond(nic, p, PKT_ACK, 0, qp->qpn);
		}
		return 0;
	}
	case PKT_READ_REQ: {
		if (p->total && check_remote(nic, qp, p->rkey, p->raddr, p->total, IBV_ACCESS_REMOTE_READ)) {
			respond(nic, p, PKT_NAK, ST_MLX5_CQE_SYNDROME_REMOTE_ACCESS_ERR, qp->qpn);
			return 0;
		}
		struct emu_node *n = emu_node_by_lid(nic, p->src_lid);
		if (!n)
			return 0;
		struct emu_pkt h;
		answer_header(&h, nic, p, PKT_READ_RESP, qp->qpn);
		h.total = p->total;
		struct emu_gather g = { (const uint8_t *)(uintptr_t)p->raddr, p->total };
		uint32_t o = 0;
		do {
			uint32_t len = p->total - o;
			if (len > EMU_PKT_MAX)
				len = EMU_PKT_MAX;
			h.offset = o;
			h.len = len;
			h.flags = (uint16_t)((o == 0 ? PF_FIRST : 0) | (o + len == p->total ? PF_LAST : 0));
			emu_node_send(n, &h, &g, 1, o);
			o += len;
		} while (o < p->total);
		return 0;
	}
	case PKT_ATOMIC_REQ: {
		/* 8-byte IB atomics and the masked/extended ones (amo.c).  An operand
		 * not aligned to its size is an invalid request, and so are 4-byte or
		 * masked atomics on a DevX QP whose atomic_mode (RST2INIT) does not
		 * allow them (UP_TO_8B, NVSHMEM's IBGDA_MLX5_QPC_ATOMIC_MODE_UP_TO_64BIT) */
		struct emu_amo amo = { .op = p->op, .opmod = p->opmod, .size = p->asize ? p->asize : 8, .a = p->swap_add,
				       .b = p->compare, .am = p->mask_a, .bm = p->mask_b };
		int ext = amo.size == 4 || amo.op == ST_MLX5_OPCODE_ATOMIC_MASKED_CS || amo.op == ST_MLX5_OPCODE_ATOMIC_MASKED_FA;
		int bad_mode = ext && qp->devx && qp->atomic_mode < EMU_QPC_ATOMIC_MODE_UP_TO_8B;
		if ((p->raddr & (amo.size - 1)) || bad_mode) {
			nic->stats->atomic_refused++;
			EMU_ERR("atomic ERROR: qpn 0x%x %u-byte op 0x%02x at 0x%llx refused (%s)", qp->qpn, amo.size, amo.op,
				(unsigned long long)p->raddr, bad_mode ? "QP atomic_mode does not allow it" : "misaligned");
			respond(nic, p, PKT_NAK, ST_MLX5_CQE_SYNDROME_REMOTE_INVAL_REQ_ERR, qp->qpn);
			return 0;
		}
		if (check_remote(nic, qp, p->rkey, p->raddr, amo.size, IBV_ACCESS_REMOTE_ATOMIC)) {
			respond(nic, p, PKT_NAK, ST_MLX5_CQE_SYNDROME_REMOTE_ACCESS_ERR, qp->qpn);
			return 0;
		}
		uint64_t orig = 0;
		if (emu_amo_apply(&amo, p->raddr, &orig)) {
			respond(nic, p, PKT_NAK, ST_MLX5_CQE_SYNDROME_REMOTE_OP_ERR, qp->qpn);
			return 0;
		}
		struct emu_node *n = emu_node_by_lid(nic, p->src_lid);
		struct emu_pkt h;
		answer_header(&h, nic, p, PKT_ATOMIC_RESP, qp->qpn);
		h.swap_add = orig;
		h.flags = PF_FIRST | PF_LAST;
		emu_node_send(n, &h, NULL, 0, 0);
		return 0;
	}
	}
	return 0;
}

static void park(struct emu_qp *qp, const struct emu_pkt *p)
{
	struct emu_pending *e = malloc(sizeof *e + p->len);
	memcpy(&e->pkt, p, sizeof *p + p->len);
	e->next = NULL;
	if (!qp->pend) {
		qp->pend = e;
		qp->pend_since_ns = emu_now_ns();
	} else {
		qp->pend_tail->next = e;
	}
	qp->pend_tail = e;
}

static int qp_accepts(struct emu_qp *qp)
{
	return qp->state == IBV_QPS_RTR || qp->state == IBV_QPS_RTS || qp->state == IBV_QPS_SQD;
}

/* A UD datagram (ref §1.8, IB spec 9.8): for a UD QP in RTR/RTS whose Q_Key
 * matches, into the next receive WQE -- the 40-byte GRH first (written when
 * the datagram carries one, else those bytes are left alone), then the
 * payload; the CQE's byte count includes the 40 bytes.  Unreliable: without
 * such a QP, or a receive WQE, the datagram is dropped. */
void emu_ud_rx(struct emu_nic *nic, const struct emu_pkt *p)
{
	struct emu_qp *qp = emu_qp_lookup(nic, p->dst_qpn);
	if (!qp || qp->qp_type != IBV_QPT_UD || !qp_accepts(qp) || p->syndrome != qp->qkey) {
		nic->stats->ud_dropped++;
		EMU_LOG("UD datagram for qpn 0x%x dropped (%s)", p->dst_qpn,
			!qp ? "no such QP" : qp->qp_type != IBV_QPT_UD ? "not UD" : !qp_accepts(qp) ? "not RTR" : "Q_Key");
		return;
	}
	uint32_t wqe;
	int srq;
	if (take_recv(qp, &wqe, &srq)) {
		nic->stats->ud_dropped++;
		EMU_LOG("UD datagram for qpn 0x%x dropped (no receive WQE)", p->dst_qpn);
		return;
	}
	uint32_t total = 40 + p->len;
	int syn = 0;
	if (p->grh) {
		struct ibv_grh grh;
		memset(&grh, 0, sizeof grh);
		grh.version_tclass_flow = htobe32(6u << 28);
		grh.paylen = htobe16((uint16_t)(p->len + 8 + 12 + 8 + 4)); /* BTH + DETH + payload + ICRC */
		grh.next_hdr = 0x1b;
		grh.hop_limit = 64;
		memcpy(grh.sgid.raw, p->sgid, 16);
		memcpy(grh.dgid.raw, p->dgid, 16);
		syn = scatter_recv(nic, qp, wqe, srq, 0, (const uint8_t *)&grh, 40, total);
	}
	if (!syn)
		syn = scatter_recv(nic, qp, wqe, srq, 40, p->payload, p->len, total);
	if (syn) {
		emu_cqe_err(qp->rcq, qp, 1, (uint16_t)wqe, 0, (uint8_t)syn);
		return;
	}
	nic->stats->ud_received++;
	struct emu_cq *cq = qp->rcq;
	if (!cq)
		return;
	struct st_mlx5_cqe64 c;
	memset(&c, 0, sizeof c);
	c.byte_cnt = htobe32(total);
	c.imm_inval_pkey = p->imm;
	c.sop_drop_qpn = htobe32(qp->qpn);
	c.flags_rqpn = htobe32((p->grh ? 1u << 28 : 0) | (p->src_qpn & 0xffffff)); /* L3 (GRH) in data */
	c.slid = htobe16((uint16_t)p->src_lid);
	c.wqe_counter = htobe16((uint16_t)wqe);
	c.srqn_uidx = srq ? htobe32(qp->srq->srqn) : 0;
	uint8_t op = (p->flags & PF_IMM) ? ST_MLX5_CQE_RESP_SEND_IMM : ST_MLX5_CQE_RESP_SEND;
	c.op_own = (uint8_t)((op << 4) | ((p->flags & 0x10) ? 2 : 0));
	emu_cq_write(cq, &c);
}

void emu_inbox_dispatch(struct emu_nic *nic, const struct emu_pkt *p)
{
	if (p->type == PKT_UD_SEND) {
		emu_ud_rx(nic, p);
		return;
	}
	struct emu_qp *qp = emu_qp_lookup(nic, p->dst_qpn);
	int is_resp = p->type >= PKT_ACK;
	if (is_resp) {
		if (qp && qp->state != IBV_QPS_RESET)
			emu_requester_rx(nic, qp, p);
		return;
	}
	if (!qp || qp->state == IBV_QPS_ERR || qp->state == IBV_QPS_RESET || (p->dc && qp->qp_type != EMU_QPT_DCT) ||
	    (!p->dc && qp->qp_type == EMU_QPT_DCT)) {
		/* a real fabric drops these and the requester times out: report the
		 * timeout outcome at once */
		if (p->flags & PF_LAST || p->type == PKT_READ_REQ || p->type == PKT_ATOMIC_REQ)
			respond(nic, p, PKT_NAK, ST_MLX5_CQE_SYNDROME_TRANSPORT_RETRY_EXC_ERR, p->dst_qpn);
		return;
	}
	if (p->dc && p->dc_key != qp->dc_key) {
		/* a DC request with the wrong access key: the DCT counts a key
		 * violation and the initiator sees an access error */
		nic->stats->dc_key_violations++;
		EMU_ERR("DC ERROR: DCT 0x%x got access key 0x%llx (its key is 0x%llx)", qp->qpn,
			(unsigned long long)p->dc_key, (unsigned long long)qp->dc_key);
		if (p->flags & PF_LAST || p->type == PKT_READ_REQ || p->type == PKT_ATOMIC_REQ)
			respond(nic, p, PKT_NAK, ST_MLX5_CQE_SYNDROME_REMOTE_ACCESS_ERR, p->dst_qpn);
		return;
	}
	if (qp->pend || !qp_accepts(qp)) {
		park(qp, p);
		return;
	}
	if (responder_rx(nic, qp, p))
		park(qp, p);
}

int emu_service_pending(struct emu_nic *nic, struct emu_qp *qp)
{
	int work = 0;
	if (!qp->pend)
		return 0;
	if (!qp_accepts(qp)) {
		if (emu_now_ns() - qp->pend_since_ns > 2000000000ull) {
			while (qp->pend) {
				struct emu_pending *e = qp->pend;
				qp->pend = e->next;
				if (e->pkt.flags & PF_LAST || e->pkt.type != PKT_SEND)
					respond(nic, &e->pkt, PKT_NAK, ST_MLX5_CQE_SYNDROME_TRANSPORT_RETRY_EXC_ERR, qp->qpn);
				free(e);
			}
			qp->pend_tail = NULL;
		}
		return 0;
	}
	while (qp->pend) {
		struct emu_pending *e = qp->pend;
		if (responder_rx(nic, qp, &e->pkt))
			break;
		qp->pend = e->next;
		if (!qp->pend)
			qp->pend_tail = NULL;
		free(e);
		qp->pend_since_ns = emu_now_ns();
		work++;
	}
	return work;
}

void emu_flush_rq(struct emu_qp *qp)
{
	if (qp->srq || !qp->rq_wqe_cnt || !qp->dbrec)
		return;
	uint32_t prod = emu_dma_load_be32(&qp->dbrec[ST_MLX5_RCV_DBR]) & 0xffff;
	while ((uint16_t)(prod - qp->rq_ci) != 0) {
		emu_cqe_err(qp->rcq, qp, 1, (uint16_t)qp->rq_ci, 0, ST_MLX5_CQE_SYNDROME_WR_FLUSH_ERR);
		qp->rq_ci++;
	}
}
