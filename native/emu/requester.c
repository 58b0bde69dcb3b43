/* The emulated NIC's requester: it parses the send WQEs that doorbells
 * announced, turns them into fabric packets, matches the responses to the
 * WQEs in flight and writes the CQEs, in SQ order (ref §1, §2.2).  The CQE
 * writer serves the responder too.
 *
 * Over 600 lines: the execution of every send opcode, which share the WQE walk, the in-flight
 * table and the CQE writer; one file keeps the SQ-order rule in one place.
 */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "emu_internal.h"

/* The executed-WQE ground truth (SIGMATRACE_EMU_STATS): counted when a WQE leaves for the wire. */
EXPORT void emu_count_wqe(struct emu_nic *nic, uint32_t opcode, uint64_t bytes)
{
	if (!nic->stats)
		return;
	__atomic_fetch_add(&nic->stats->wqes_by_opcode[opcode & 63], 1, __ATOMIC_RELAXED);
	__atomic_fetch_add(&nic->stats->bytes_by_opcode[opcode & 63], bytes, __ATOMIC_RELAXED);
}

/* ---- CQE writing (ref §2.2) ------------------------------------------------ */
void emu_cq_written(struct emu_cq *cq, uint8_t op_own); /* cq.c: the arm */

EXPORT void emu_cq_write(struct emu_cq *cq, const struct st_mlx5_cqe64 *cqe)
{
	pthread_mutex_lock(&cq->lock);
	uint32_t n = cq->ncqe;
	if (!cq->collapsed && !cq->ignore_overrun) {
		/* the doorbell record is host memory the consumer updates while the NIC reads it */
		uint32_t ci = emu_dma_load_be32(&cq->dbrec[ST_MLX5_CQ_SET_CI]) & 0xffffff;
		if (((cq->pi - ci) & 0xffffff) >= n) {
			static int warned;
			if (!warned++)
				fprintf(stderr, "sigmatrace-emu: CQ 0x%x overrun (pi %u ci %u n %u)\n", cq->cqn, cq->pi, ci, n);
		}
	}
	uint8_t *slot = (uint8_t *)emu_cqe_at(cq, cq->collapsed ? 0 : cq->pi);
	uint8_t op_own = (uint8_t)((cqe->op_own & 0xfe) | (!!(cq->pi & n)));
	/* Bytes 0..55, then the last 8 (sop_drop_qpn, wqe_counter, signature,
	 * op_own) in one store: a poller that sees op_own -- or, on a collapsed
	 * CQ whose slot always holds a valid CQE, the new wqe_counter, as
	 * NVSHMEM's ibgda_poll_cq reads it -- sees the whole CQE, never a new
	 * counter beside the previous CQE's opcode. */
	uint64_t tail;
	memcpy(&tail, (const uint8_t *)cqe + 56, 8);
	((uint8_t *)&tail)[7] = op_own;
	if (emu_dma_is_device((uint64_t)(uintptr_t)slot, 64)) {
		/* a CQ ring in GPU memory (NVSHMEM's default): two copies, the last 8 bytes second */
		emu_dma_write((uint64_t)(uintptr_t)slot, cqe, 56);
		emu_dma_write((uint64_t)(uintptr_t)slot + 56, &tail, 8);
	} else {
		memcpy(slot, cqe, 56);
		__atomic_store_n((uint64_t *)(slot + 56), tail, __ATOMIC_RELEASE);
	}
	cq->pi++;
	emu_cq_written(cq, op_own);
	pthread_mutex_unlock(&cq->lock);
}

static void cqe_req(struct emu_qp *qp, uint16_t wqe_idx, uint8_t opcode, uint32_t byte_len)
{
	if (!qp->scq)
		return;
	struct st_mlx5_cqe64 c;
	memset(&c, 0, sizeof c);
	c.byte_cnt = htobe32(byte_len);
	c.sop_drop_qpn = htobe32(((uint32_t)opcode << 24) | qp->qpn);
	c.wqe_counter = htobe16(wqe_idx);
	c.srqn_uidx = htobe32(qp->user_index & 0xffffff); /* cqe_version 1: the QP's user index (DevX) */
	c.op_own = ST_MLX5_CQE_REQ << 4;
	emu_cq_write(qp->scq, &c);
}

void emu_cqe_err(struct emu_cq *cq, struct emu_qp *qp, int resp, uint16_t wqe_idx, uint8_t opcode, uint8_t syndrome)
{
	if (!cq)
		return;
	struct st_mlx5_err_cqe e;
	memset(&e, 0, sizeof e);
	e.syndrome = syndrome;
	e.vendor_err_synd = syndrome == ST_MLX5_CQE_SYNDROME_WR_FLUSH_ERR ? 0xf9 : 0x81;
	e.s_wqe_opcode_qpn = htobe32(((uint32_t)opcode << 24) | qp->qpn);
	e.wqe_counter = htobe16(wqe_idx);
	if (!resp)
		e.srqn = htobe32(qp->user_index & 0xffffff);
	e.op_own = (uint8_t)((resp ? ST_MLX5_CQE_RESP_ERR : ST_MLX5_CQE_REQ_ERR) << 4);
	emu_cq_write(cq, (struct st_mlx5_cqe64 *)&e);
}

/* ---- requester ------------------------------------------------------------ */
static struct emu_inflight *inflight_push(struct emu_qp *qp)
{
	if (qp->inflight_tail - qp->inflight_head >= qp->inflight_cap)
		return NULL;
	struct emu_inflight *f = &qp->inflight[qp->inflight_tail++ % qp->inflight_cap];
	memset(f, 0, offsetof(struct emu_inflight, sge));
	f->nsge = 0;
	return f;
}

void emu_drain_inflight(struct emu_qp *qp)
{
	while (qp->inflight_head != qp->inflight_tail) {
		struct emu_inflight *f = &qp->inflight[qp->inflight_head % qp->inflight_cap];
		if (!f->done)
			break;
		qp->inflight_head++;
		if (f->syndrome) {
			emu_cqe_err(qp->scq, qp, 0, f->wqe_idx, f->opcode, f->syndrome);
			if (f->syndrome != ST_MLX5_CQE_SYNDROME_WR_FLUSH_ERR)
				EMU_LOG("qp 0x%x wqe %u opcode 0x%x error syndrome 0x%x", qp->qpn, f->wqe_idx, f->opcode, f->syndrome);
			if (qp->state != IBV_QPS_ERR)
				emu_qp_to_error(qp);
		} else if (f->signaled) {
			cqe_req(qp, f->wqe_idx, f->opcode, f->byte_len);
		}
	}
}

EXPORT void emu_qp_to_error(struct emu_qp *qp)
{
	int was_err = qp->state == IBV_QPS_ERR;
	qp->state = IBV_QPS_ERR;
	qp->qpx.qp_base.state = IBV_QPS_ERR;
	for (uint32_t i = qp->inflight_head; i != qp->inflight_tail; i++) {
		struct emu_inflight *f = &qp->inflight[i % qp->inflight_cap];
		if (!f->done) {
			f->done = 1;
			f->syndrome = ST_MLX5_CQE_SYNDROME_WR_FLUSH_ERR;
		}
	}
	emu_drain_inflight(qp);
	emu_free_pending(qp);
	qp->resp_active = 0;
	emu_flush_rq(qp);
	/* IB spec 11.6.3: a QP on an SRQ that enters the error state raises Last WQE Reached */
	if (!was_err && qp->srq && !qp->devx)
		emu_async_event(qp->qpx.qp_base.context, IBV_EVENT_QP_LAST_WQE_REACHED, &qp->qpx.qp_base);
}

EXPORT void emu_qp_reset_nic_state(struct emu_qp *qp)
{
	qp->inflight_head = qp->inflight_tail = 0;
	qp->sq_exec = qp->sq_announced = 0;
	qp->rq_ci = 0;
	qp->resp_active = 0;
	qp->resp_err = 0;
	emu_free_pending(qp);
	qp->peer = NULL;
	qp->db_seen = 0;
	for (int i = 0; i < EMU_BF_SNAPS; i++)
		qp->bf_snap[i].valid = 0;
}

/* Copy `len` bytes of the WQE that starts at WQEBB index `idx` (ring wrap
 * aware; the ring may be GPU memory, dma.c): 0, or -1 when it could not be read. */
static int sq_read(struct emu_qp *qp, uint32_t idx, uint32_t off, void *dst, uint32_t len)
{
	uint32_t ring = qp->sq_wqebb * 64;
	uint32_t pos = ((idx & (qp->sq_wqebb - 1)) * 64 + off) & (ring - 1);
	uint8_t *d = dst;
	int r = 0;
	while (len) {
		uint32_t n = ring - pos;
		if (n > len)
			n = len;
		r |= emu_dma_read(d, (uint64_t)(uintptr_t)(qp->sq_buf + pos), n);
		d += n;
		len -= n;
		pos = 0;
	}
	return r;
}

/* The WQE at idx as the NIC takes it: the SQ's bytes, except for the first
 * bytes of a BlueFlame copy taken for it (doorbell.c), which win. */
static int wqe_fetch(struct emu_qp *qp, uint32_t idx, void *dst, uint32_t len, int consume)
{
	int r = sq_read(qp, idx, 0, dst, len);
	for (int i = 0; i < EMU_BF_SNAPS; i++) {
		struct emu_bf_snap *b = &qp->bf_snap[i];
		if (!b->valid || b->idx != (uint16_t)idx)
			continue;
		memcpy(dst, b->b, b->len < len ? b->len : len);
		if (consume)
			b->valid = 0;
	}
	return r;
}

/* A WQE whose fence mode (ctrl fm_ce_se bits 7:5, ref §1.2) makes it wait:
 * FENCE (2), SMALL_AND_FENCE (4) and INITIATOR_SMALL_FENCE (1) wait until the
 * RDMA READs and atomics posted before it have completed (their responses
 * written locally), STRONG_ORDERING (3) until every earlier WQE has.  1 while
 * it must wait. */
static int fence_blocks(const struct emu_qp *qp, uint32_t fm)
{
	for (uint32_t i = qp->inflight_head; i != qp->inflight_tail; i++) {
		const struct emu_inflight *f = &qp->inflight[i % qp->inflight_cap];
		if (f->done)
			continue;
		if (fm == 3)
			return 1;
		switch (f->opcode) {
		case ST_MLX5_OPCODE_RDMA_READ:
		case ST_MLX5_OPCODE_ATOMIC_CS:
		case ST_MLX5_OPCODE_ATOMIC_FA:
		case ST_MLX5_OPCODE_ATOMIC_MASKED_CS:
		case ST_MLX5_OPCODE_ATOMIC_MASKED_FA:
			return 1;
		}
	}
	return 0;
}

/* The address vector of a DCI WQE (ref §1.8; NVSHMEM writes the 16-byte
 * compact form unless the extended bit of dqp_dct is set) at w + 16: the
 * destination node (*node, NULL when there is none) and DCT, the DC access
 * key into h; the bytes it takes, or 0 when it does not fit in the WQE. */
static uint32_t dci_address(struct emu_nic *nic, struct emu_qp *qp, const uint8_t *w, uint32_t ds, struct emu_pkt *h,
			    struct emu_node **node)
{
	struct mlx5_wqe_av av;
	memset(&av, 0, sizeof av);
	uint32_t dqp_dct;
	memcpy(&dqp_dct, w + 16 + offsetof(struct mlx5_wqe_av, dqp_dct), 4);
	int ext = !!(be32toh(dqp_dct) & MLX5_EXTENDED_UD_AV);
	uint32_t avlen = ext ? sizeof av : 16;
	if (16 + avlen > ds * 16)
		return 0;
	memcpy(&av, w + 16, avlen);
	h->dst_qpn = be32toh(av.dqp_dct) & 0xffffff;
	h->dc = 1;
	h->dc_key = be64toh(av.key.dc_key);
	int global = ext && (be32toh(av.grh_gid_fl) & (1u << 30));
	if (global)
		*node = !memcmp(av.rgid, nic->gid, 16) ? nic->self : emu_node_by_gid(nic, av.rgid);
	else
		*node = be16toh(av.rlid) == nic->lid ? nic->self : emu_node_by_lid(nic, be16toh(av.rlid));
	(void)qp;
	return avlen;
}

/* The payload of a send WQE's data and inline segments from byte off of its ds 16-byte units (ref
 * §1.6, §1.7): pieces into g (*ng of them, EMU_MAX_SGE + 4 at most), their bytes added to *total.
 * 0, or the CQE syndrome: an inline segment past the WQE, a data segment the local keys refuse. */
static uint8_t gather_segments(struct emu_nic *nic, const uint8_t *w, uint32_t off, uint32_t ds, struct emu_gather *g,
			       int *ng, uint64_t *total)
{
	while (off + 4 <= ds * 16 && *ng < EMU_MAX_SGE + 4) {
		uint32_t bc;
		memcpy(&bc, w + off, 4);
		bc = be32toh(bc);
		if (bc & ST_MLX5_INLINE_SEG) {
			uint32_t len = bc & 0x3ff;
			if (off + 4 + len > ds * 16)
				return ST_MLX5_CQE_SYNDROME_LOCAL_LENGTH_ERR;
			g[*ng].data = w + off + 4;
			g[(*ng)++].len = len;
			*total += len;
			off += (4 + len + 15) & ~15u;
		} else {
			if (off + 16 > ds * 16)
				break;
			const struct st_mlx5_wqe_data_seg *d = (const void *)(w + off);
			off += 16;
			uint32_t len = bc, lkey = be32toh(d->lkey);
			uint64_t addr = be64toh(d->addr);
			if (emu_check_local(nic, lkey, addr, len, 0))
				return ST_MLX5_CQE_SYNDROME_LOCAL_PROT_ERR;
			g[*ng].data = (const uint8_t *)(uintptr_t)addr;
			g[(*ng)++].len = len;
			*total += len;
		}
	}
	return 0;
}

enum { EXEC_DONE = 0, EXEC_STALL = 1 };

/* A UD SEND (ref §1.8): ctrl, datagram segment (the AV: destination LID or
 * GID, QPN, Q_Key), then data/inline segments.  Unreliable: the datagram goes
 * to the fabric (or nowhere) and the WQE completes at once. */
static int exec_ud(struct emu_nic *nic, struct emu_qp *qp, struct emu_inflight *f, const uint8_t *w, uint32_t ds,
		   uint32_t opcode, const struct st_mlx5_wqe_ctrl_seg *ctrl)
{
	f->done = 1;
	if (opcode != ST_MLX5_OPCODE_SEND && opcode != ST_MLX5_OPCODE_SEND_IMM) {
		nic->stats->wqe_bad_opcode++; /* UD sends only SENDs */
		EMU_ERR("WQE ERROR: UD qp 0x%x opcode 0x%02x: not a SEND (local QP operation error)", qp->qpn, opcode);
		f->syndrome = ST_MLX5_CQE_SYNDROME_LOCAL_QP_OP_ERR;
		return EXEC_DONE;
	}
	if (ds * 16 < 16 + 16) {
		f->syndrome = ST_MLX5_CQE_SYNDROME_LOCAL_QP_OP_ERR;
		return EXEC_DONE;
	}
	struct mlx5_wqe_av av;
	memset(&av, 0, sizeof av);
	uint32_t dqp_dct;
	memcpy(&dqp_dct, w + 16 + offsetof(struct mlx5_wqe_av, dqp_dct), 4);
	int ext = !!(be32toh(dqp_dct) & MLX5_EXTENDED_UD_AV);
	uint32_t avlen = ext ? sizeof av : 16; /* a compact AV is its first 16 bytes */
	memcpy(&av, w + 16, avlen);
	uint32_t off = 16 + avlen;
	struct emu_pkt h;
	memset(&h, 0, sizeof h);
	h.type = PKT_UD_SEND;
	h.flags = PF_FIRST | PF_LAST;
	h.dst_qpn = be32toh(av.dqp_dct) & 0xffffff;
	h.src_qpn = qp->qpn;
	h.src_lid = nic->lid;
	h.op = (uint8_t)opcode;
	uint32_t qkey = be32toh(av.key.qkey.qkey);
	h.syndrome = (qkey & 0x80000000u) ? qp->qkey : qkey; /* high bit: the QP's own Q_Key */
	if (opcode == ST_MLX5_OPCODE_SEND_IMM) {
		h.imm = ctrl->imm;
		h.flags |= PF_IMM;
	}
	if (ctrl->fm_ce_se & ST_MLX5_WQE_CTRL_SOLICITED)
		h.flags |= 0x10;
	int global = ext && (be32toh(av.grh_gid_fl) & (1u << 30));
	if (global) {
		h.grh = 1;
		memcpy(h.sgid, nic->gid, 16);
		memcpy(h.dgid, av.rgid, 16);
	}
	struct emu_gather g[EMU_MAX_SGE + 4];
	int ng = 0;
	uint64_t total = 0;
	uint8_t syndrome = gather_segments(nic, w, off, ds, g, &ng, &total);
	if (syndrome) {
		f->syndrome = syndrome;
		return EXEC_DONE;
	}
	if (total > EMU_PKT_MAX) {
		f->syndrome = ST_MLX5_CQE_SYNDROME_LOCAL_LENGTH_ERR;
		return EXEC_DONE;
	}
	f->byte_len = (uint32_t)total;
	h.len = h.total = (uint32_t)total;
	struct emu_node *n;
	if (global)
		n = !memcmp(av.rgid, nic->gid, 16) ? nic->self : emu_node_by_gid(nic, av.rgid);
	else
		n = emu_node_by_lid(nic, be16toh(av.rlid));
	nic->stats->ud_sent++;
	if (!n || n->dead) {
		EMU_LOG("qp 0x%x UD datagram to %s %u: no such node (dropped)", qp->qpn, global ? "gid of lid" : "lid",
			be16toh(av.rlid));
		return EXEC_DONE;
	}
	EMU_LOG("qp 0x%x UD send %u B to lid %u qpn 0x%x%s", qp->qpn, (unsigned)total, n->lid, h.dst_qpn,
		global ? " (GRH)" : "");
	emu_node_send(n, &h, g, ng, 0);
	return EXEC_DONE;
}

static int exec_wqe(struct emu_nic *nic, struct emu_qp *qp)
{
	uint32_t idx = qp->sq_exec & 0xffff;
	uint8_t w[ST_MLX5_SEND_WQE_MAX_WQEBBS * 64];
	struct st_mlx5_wqe_ctrl_seg ctrl;
	int fetch_err = wqe_fetch(qp, idx, &ctrl, sizeof ctrl, 0);
	uint32_t ds = st_mlx5_ctrl_ds(&ctrl);
	uint32_t opcode = st_mlx5_ctrl_opcode(&ctrl), opmod = st_mlx5_ctrl_opmod(&ctrl);
	if (ds == 0)
		ds = 1;
	uint32_t nbb = st_mlx5_wqebbs(ds);
	if (nbb > ST_MLX5_SEND_WQE_MAX_WQEBBS)
		nbb = ST_MLX5_SEND_WQE_MAX_WQEBBS, ds = nbb * 4;
	if (qp->peer && qp->peer->outq_bytes > EMU_OUTQ_LIMIT)
		return EXEC_STALL;
	if (qp->inflight_tail - qp->inflight_head >= qp->inflight_cap)
		return EXEC_STALL;
	uint32_t fm = ctrl.fm_ce_se >> 5;
	if (fm && qp->state != IBV_QPS_ERR && fence_blocks(qp, fm)) {
		if (qp->fence_seen != qp->sq_exec + 1) {
			qp->fence_seen = qp->sq_exec + 1;
			nic->stats->wqe_fenced++;
			EMU_LOG("qp 0x%x wqe %u (fence mode %u) waits for earlier READs/atomics", qp->qpn, idx, fm);
		}
		return EXEC_STALL;
	}
	fetch_err |= wqe_fetch(qp, idx, w, ds * 16, 1);
	int signaled = (ctrl.fm_ce_se & ST_MLX5_WQE_CTRL_CE_MASK) == ST_MLX5_WQE_CTRL_CQ_UPDATE ||
		       (ctrl.fm_ce_se & ST_MLX5_WQE_CTRL_CE_MASK) == ST_MLX5_WQE_CTRL_CQ_UPDATE_AND_EQE;
	struct emu_inflight *f = inflight_push(qp);
	f->wqe_idx = (uint16_t)idx;
	f->opcode = (uint8_t)opcode;
	f->signaled = (uint8_t)signaled;
	qp->sq_exec += nbb;
	EMU_LOG("qp 0x%x exec wqe %u opcode 0x%x ds %u ce %d", qp->qpn, idx, opcode, ds, signaled);

	if (qp->state == IBV_QPS_ERR) {
		f->done = 1;
		f->syndrome = ST_MLX5_CQE_SYNDROME_WR_FLUSH_ERR;
		return EXEC_DONE;
	}
#define FAIL(s) do { f->done = 1; f->syndrome = (s); return EXEC_DONE; } while (0)
#define REFUSE(why) do {                                                                                   \
		nic->stats->wqe_bad_opcode++;                                                              \
		EMU_ERR("WQE ERROR: qp 0x%x wqe %u opcode 0x%02x opmod 0x%02x: %s (local QP operation error)", \
			qp->qpn, idx, opcode, opmod, why);                                                  \
		FAIL(ST_MLX5_CQE_SYNDROME_LOCAL_QP_OP_ERR);                                                \
	} while (0)
	if (fetch_err)
		FAIL(ST_MLX5_CQE_SYNDROME_LOCAL_PROT_ERR); /* the WQE itself could not be read (GPU copy failed) */
	if (opcode == ST_MLX5_OPCODE_NOP) {
		f->done = 1;
		emu_count_wqe(nic, opcode, 0);
		return EXEC_DONE;
	}
	if (opcode == ST_MLX5_OPCODE_DUMP) {
		/* DUMP (ref §1.9): ctrl + one data segment; the NIC reads the local
		 * bytes (NVSHMEM's consistency operation: the read flushes earlier
		 * writes into that memory) and completes locally */
		if (ds < 2)
			REFUSE("DUMP without a data segment");
		const struct st_mlx5_wqe_data_seg *d = (const void *)(w + 16);
		uint32_t len = be32toh(d->byte_count) & 0x7fffffff, lkey = be32toh(d->lkey);
		uint64_t addr = be64toh(d->addr);
		uint8_t sink[64];
		if (emu_check_local(nic, lkey, addr, len, 0) || emu_dma_read(sink, addr, len < 64 ? len : 64))
			FAIL(ST_MLX5_CQE_SYNDROME_LOCAL_PROT_ERR);
		f->byte_len = len;
		f->done = 1;
		emu_count_wqe(nic, opcode, len);
		return EXEC_DONE;
	}
	if (qp->qp_type == IBV_QPT_UD)
		return exec_ud(nic, qp, f, w, ds, opcode, &ctrl);
	uint32_t off = 16;
	struct emu_pkt h;
	memset(&h, 0, sizeof h);
	if (qp->qp_type == EMU_QPT_DCI) {
		/* DC: every WQE names its target (address vector after ctrl) */
		struct emu_node *n = NULL;
		uint32_t avlen = dci_address(nic, qp, w, ds, &h, &n);
		if (!avlen)
			REFUSE("DCI WQE without an address vector");
		if (!n || n->dead)
			FAIL(ST_MLX5_CQE_SYNDROME_TRANSPORT_RETRY_EXC_ERR);
		qp->peer = n;
		off += avlen;
	} else {
		if (!qp->peer || qp->peer->dead) {
			if (!qp->peer)
				emu_resolve_peer(qp);
			if (!qp->peer || qp->peer->dead)
				FAIL(ST_MLX5_CQE_SYNDROME_TRANSPORT_RETRY_EXC_ERR);
		}
		h.dst_qpn = qp->dest_qpn;
	}
	h.src_qpn = qp->qpn;
	h.src_lid = nic->lid;
	h.seq = f->seq = qp->next_seq++;
	h.op = (uint8_t)opcode;
	const struct st_mlx5_wqe_raddr_seg *ra = NULL;
	struct emu_gather g[EMU_MAX_SGE + 4];
	int ng = 0;
	uint64_t total = 0;

	switch (opcode) {
	case ST_MLX5_OPCODE_RDMA_WRITE:
	case ST_MLX5_OPCODE_RDMA_WRITE_IMM:
	case ST_MLX5_OPCODE_RDMA_READ:
	case ST_MLX5_OPCODE_ATOMIC_CS:
	case ST_MLX5_OPCODE_ATOMIC_FA:
	case ST_MLX5_OPCODE_ATOMIC_MASKED_CS:
	case ST_MLX5_OPCODE_ATOMIC_MASKED_FA:
		if (off + 16 > ds * 16)
			REFUSE("no remote address segment within DS");
		ra = (const struct st_mlx5_wqe_raddr_seg *)(w + off);
		off += 16;
		h.raddr = be64toh(ra->raddr);
		h.rkey = be32toh(ra->rkey);
		break;
	case ST_MLX5_OPCODE_SEND:
	case ST_MLX5_OPCODE_SEND_IMM:
	case ST_MLX5_OPCODE_SEND_INVAL:
		break;
	default:
		REFUSE("opcode not executed by the emulated HCA");
	}

	if (opcode == ST_MLX5_OPCODE_ATOMIC_CS || opcode == ST_MLX5_OPCODE_ATOMIC_FA ||
	    opcode == ST_MLX5_OPCODE_ATOMIC_MASKED_CS || opcode == ST_MLX5_OPCODE_ATOMIC_MASKED_FA) {
		/* 8-byte IB atomics, or masked/extended ones of 4 or 8 bytes (amo.c) */
		struct emu_amo amo;
		const struct st_mlx5_wqe_data_seg *d;
		if (emu_amo_parse(w, off, ds, opcode, opmod, &amo, &d))
			REFUSE(opcode >= ST_MLX5_OPCODE_ATOMIC_MASKED_CS ? "masked atomic needs opmod 0x08 (4 B) or 0x09 (8 B) "
									  "and its segments within DS"
									: "atomic segments past DS");
		h.swap_add = amo.a;
		h.compare = amo.b;
		h.mask_a = amo.am;
		h.mask_b = amo.bm;
		h.opmod = amo.opmod;
		h.asize = amo.size;
		uint32_t len = be32toh(d->byte_count) & 0x7fffffff, lkey = be32toh(d->lkey);
		uint64_t addr = be64toh(d->addr);
		if (len < amo.size || emu_check_local(nic, lkey, addr, amo.size, 1))
			FAIL(ST_MLX5_CQE_SYNDROME_LOCAL_PROT_ERR);
		f->nsge = 1;
		f->sge[0].addr = addr;
		f->sge[0].len = amo.size;
		f->sge[0].lkey = lkey;
		h.type = PKT_ATOMIC_REQ;
		h.flags = PF_FIRST | PF_LAST;
		h.total = amo.size;
		emu_count_wqe(nic, opcode, amo.size);
		emu_node_send(qp->peer, &h, NULL, 0, 0);
		return EXEC_DONE;
	}

	if (opcode == ST_MLX5_OPCODE_RDMA_READ) {
		while (off + 16 <= ds * 16 && f->nsge < EMU_MAX_SGE) {
			const struct st_mlx5_wqe_data_seg *d = (const void *)(w + off);
			off += 16;
			uint32_t len = be32toh(d->byte_count) & 0x7fffffff, lkey = be32toh(d->lkey);
			uint64_t addr = be64toh(d->addr);
			if (emu_check_local(nic, lkey, addr, len, 1))
				FAIL(ST_MLX5_CQE_SYNDROME_LOCAL_PROT_ERR);
			f->sge[f->nsge].addr = addr;
			f->sge[f->nsge].len = len;
			f->sge[f->nsge].lkey = lkey;
			f->nsge++;
			total += len;
		}
		h.type = PKT_READ_REQ;
		h.flags = PF_FIRST | PF_LAST;
		h.total = (uint32_t)total;
		emu_count_wqe(nic, opcode, total);
		emu_node_send(qp->peer, &h, NULL, 0, 0);
		return EXEC_DONE;
	}

	/* SEND / WRITE: gather list from data or inline segments */
	uint8_t syndrome = gather_segments(nic, w, off, ds, g, &ng, &total);
	if (syndrome)
		FAIL(syndrome);
	if (total > (1ull << 31))
		FAIL(ST_MLX5_CQE_SYNDROME_LOCAL_LENGTH_ERR);
	f->byte_len = (uint32_t)total;
	emu_count_wqe(nic, opcode, total);
	int is_send = opcode == ST_MLX5_OPCODE_SEND || opcode == ST_MLX5_OPCODE_SEND_IMM || opcode == ST_MLX5_OPCODE_SEND_INVAL;
	h.type = is_send ? PKT_SEND : PKT_WRITE;
	h.total = (uint32_t)total;
	if (opcode == ST_MLX5_OPCODE_SEND_IMM || opcode == ST_MLX5_OPCODE_RDMA_WRITE_IMM)
		h.imm = ctrl.imm;
	if (opcode == ST_MLX5_OPCODE_SEND_INVAL)
		h.imm = ctrl.imm;
	uint16_t extra = (opcode == ST_MLX5_OPCODE_SEND_IMM || opcode == ST_MLX5_OPCODE_RDMA_WRITE_IMM) ? PF_IMM :
			 opcode == ST_MLX5_OPCODE_SEND_INVAL ? PF_INV : 0;
	if (ctrl.fm_ce_se & ST_MLX5_WQE_CTRL_SOLICITED)
		extra |= 0x10; /* solicited event */
	uint64_t base_raddr = h.raddr;
	uint32_t o = 0;
	do {
		uint32_t n = (uint32_t)total - o;
		if (n > EMU_PKT_MAX)
			n = EMU_PKT_MAX;
		h.flags = (uint16_t)((o == 0 ? PF_FIRST : 0) | (o + n == total ? (PF_LAST | extra) : 0));
		h.offset = o;
		h.len = n;
		h.raddr = base_raddr + o;
		emu_node_send(qp->peer, &h, g, ng, o);
		o += n;
	} while (o < total);
	return EXEC_DONE;
#undef REFUSE
#undef FAIL
}

static struct emu_inflight *inflight_find(struct emu_qp *qp, uint32_t seq)
{
	for (uint32_t i = qp->inflight_head; i != qp->inflight_tail; i++) {
		struct emu_inflight *f = &qp->inflight[i % qp->inflight_cap];
		if (!f->done && f->seq == seq)
			return f;
	}
	return NULL;
}

void emu_requester_rx(struct emu_nic *nic, struct emu_qp *qp, const struct emu_pkt *p)
{
	struct emu_inflight *f = inflight_find(qp, p->seq);
	if (!f)
		return;
	switch (p->type) {
	case PKT_ACK:
		f->done = 1;
		break;
	case PKT_NAK:
		f->done = 1;
		f->syndrome = (uint8_t)p->syndrome;
		break;
	case PKT_READ_RESP: {
		uint32_t off = p->offset, len = p->len;
		const uint8_t *src = p->payload;
		for (uint32_t i = 0; i < f->nsge && len; i++) {
			if (off >= f->sge[i].len) {
				off -= f->sge[i].len;
				continue;
			}
			uint32_t n = f->sge[i].len - off;
			if (n > len)
				n = len;
			/* re-validate: the MR could have been deregistered meanwhile */
			if (emu_check_local(nic, f->sge[i].lkey, f->sge[i].addr + off, n, 1)) {
				f->done = 1;
				f->syndrome = ST_MLX5_CQE_SYNDROME_LOCAL_PROT_ERR;
				emu_drain_inflight(qp);
				return;
			}
			if (emu_dma_write(f->sge[i].addr + off, src, n)) {
				f->done = 1;
				f->syndrome = ST_MLX5_CQE_SYNDROME_LOCAL_PROT_ERR;
				emu_drain_inflight(qp);
				return;
			}
			src += n;
			len -= n;
			off = 0;
		}
		if (p->flags & PF_LAST) {
			f->done = 1;
			f->byte_len = p->total;
		}
		break;
	}
	case PKT_ATOMIC_RESP:
		/* the original value: 8-byte results in host order (atomic_req_8B_endianness_mode 1), 4-byte ones
		 * big-endian, as NVSHMEM reads them (amo.c) */
		if (f->nsge && !emu_check_local(nic, f->sge[0].lkey, f->sge[0].addr, f->sge[0].len, 1)) {
			uint32_t v4 = htobe32((uint32_t)p->swap_add);
			const void *res = f->sge[0].len == 4 ? (const void *)&v4 : (const void *)&p->swap_add;
			if (emu_dma_write(f->sge[0].addr, res, f->sge[0].len))
				f->syndrome = ST_MLX5_CQE_SYNDROME_LOCAL_PROT_ERR;
		}
		f->done = 1;
		f->byte_len = f->nsge ? f->sge[0].len : 8;
		break;
	}
	emu_drain_inflight(qp);
}

int emu_service_qps(struct emu_nic *nic)
{
	int work = 0;
	for (int i = 0; i < nic->nq; i++) {
		struct emu_qp *qp = nic->qlist[i];
		while ((uint16_t)(qp->sq_announced - qp->sq_exec) != 0 && qp->sq_buf) {
			if (exec_wqe(nic, qp) == EXEC_STALL)
				break;
			work++;
		}
		emu_drain_inflight(qp);
		work += emu_service_pending(nic, qp);
		if (qp->state == IBV_QPS_ERR)
			emu_flush_rq(qp);
	}
	return work;
}
